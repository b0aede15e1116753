package family

import (
	"fmt"
	"maps"
	"slices"
)

// hunyuanV1MoE is Hunyuan-A13B (HunYuanMoEV1Moe, transformers 5.17): every
// layer is MoE, model.layers.L.mlp with the router mlp.gate.wg [E,H] (an
// F32 nn.Linear in memory), experts.E.{gate,up,down}_proj and one ungated
// shared MLP mlp.shared_mlp; transformers sizes the routed experts and the
// shared MLP both by intermediate_size. Routing (HunYuanMoEV1Gate): softmax
// of the logits in f32, top-k (moe_topk), always renormalised, no scaling
// factor; output = routed + shared(x): fusable with slot weight 1.
// moe_topk may be a list, one entry a layer (the gate reads
// moe_topk[layer]): planned when every entry is the same, refused by name
// otherwise. A num_experts list is not read by HunYuanMoEV1Experts (it
// sizes the bank by the number), so it is refused as not a number.
var hunyuanV1MoE = &spec{
	name:  "hunyuan_v1_moe",
	names: hubLayoutNames("mlp", "gate.wg", "", "shared_mlp"),
	keys: configKeys{
		intermediate: "intermediate_size",
		topK:         "moe_topk",
		sharedFixed:  1,
	},
	layers:   everyLayer,
	defaults: map[string]any{"moe_topk": 1.0},
	lift:     hunyuanTopK,
	routing:  mixtralRouting,
}

// hunyuanTopK reads a per-layer moe_topk list whose entries agree as that
// one number (Hunyuan-A13B's hub config writes one entry a layer).
func hunyuanTopK(c config) (config, error) {
	if _, isList := c.m["moe_topk"].([]any); !isList {
		return c, nil
	}
	ks, err := c.ints("moe_topk")
	if err != nil {
		return c, err
	}
	if len(ks) == 0 || slices.Min(ks) != slices.Max(ks) {
		return c, fmt.Errorf("config.json: moe_topk %v: a top-k that differs between layers is not supported", ks)
	}
	m := maps.Clone(c.m)
	m["moe_topk"] = float64(ks[0])
	return config{m: m}, nil
}
