package family

import (
	"fmt"

	"github.com/moeprep/moeprep/moe"
)

// inkling is Inkling's language model (InklingMoE, transformers 5.17,
// model_type inkling_text) as transformers saves it: no conversion mapping
// for the text model, so the hub names are its module names, under
// model.layers.L.mlp:
//
//   - routed experts stacked: experts.gate_up_proj [E, 2I, H] (gate rows,
//     then up rows) and experts.down_proj [E, H, I];
//   - router gate.weight [E+S, H]: rows E.. score the shared experts;
//     gate.e_score_correction_bias [E]; gate.global_scale [1];
//   - shared experts stacked: shared_experts.{gate_proj, up_proj} [S, I, H]
//     and shared_experts.down_proj [S, H, I] (no ".weight").
//
// Routing (InklingTopkRouter): l = x W^T over E+S rows; ids = top-k of
// sigmoid(l[:E]) + bias; the k chosen and the S shared logits are weighted
// together, w = sigmoid(l) / sum of those k+S sigmoids; every weight times
// route_scale times global_scale. Output = sum_k w_k E_k(x) + sum_s w_s
// shared_s(x): each shared expert's weight depends on the token, so it
// cannot be fused with a constant slot weight.
//
// MoE layers are mlp_layer_types "sparse" (without the list, those from
// dense_mlp_idx on, 0 by default); MTP layers are dense. The multimodal
// model (inkling_mm_model) holds it under text_config, in the hub's layout
// when transformers saves it (w13_weight, gate and up rows interleaved):
// wrapper.go's inklingHub names that layout. shared_expert_sink and
// rms_norm_eps_moe_gate are documented config keys that transformers
// 5.17's modeling code never reads.
var inkling = &spec{
	name: "inkling_text",
	names: func() naming {
		n := hubLayoutNames("mlp", "gate", "gate.e_score_correction_bias", "shared_experts")
		n.stackedGateUp, n.stackedDown = "experts.gate_up_proj", "experts.down_proj"
		n.sharedStacked, n.routerScale = true, "gate.global_scale"
		return n
	}(),
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		numExperts:   routedExperts,
		sharedCount:  "n_shared_experts",
		denseKey:     "dense_mlp_idx",
	},
	layers:          layerTypes,
	defaults:        map[string]any{"route_scale": 8.0, "n_shared_experts": 2.0, "num_experts_per_tok": 6.0},
	routing:         inklingRouting,
	sharedUnfusable: "the router weights each shared expert per token (in one normalisation with the routed experts), so its slots have no constant weight",
}

func inklingRouting(c config, _ string, p *Plan) error {
	if p.NumSharedExperts < 1 {
		return fmt.Errorf("config.json: n_shared_experts=%d: Inkling's router takes its last n_shared_experts rows as the shared experts' and needs at least one", p.NumSharedExperts)
	}
	sink, err := c.boolean("shared_expert_sink", true)
	if err != nil {
		return err
	}
	if !sink {
		return fmt.Errorf("config.json: shared_expert_sink=false is not supported: transformers 5.17 always weights the shared experts in the same normalisation as the routed ones, so no reference computes this checkpoint the way its config describes")
	}
	p.Scoring, p.TopKMethod, p.SharedRouted = moe.Sigmoid, moe.TopKNoAuxTC, true
	p.RoutedScalingFactor, err = c.float("route_scale", 8)
	return err
}
