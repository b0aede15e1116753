package family

import "github.com/moeprep/moeprep/layout"

// hyV4 is Tencent HY-V4 (HYV4MoE, transformers 5.17). Its conversion
// mapping renames only hyper-connection and attention tensors, so the
// experts stay stacked as transformers holds them:
// model.layers.L.mlp.experts.gate_up_proj [E, 2I, H] (gate rows, then up)
// and experts.down_proj [E, H, I], planned as views; router mlp.gate [E, H]
// with mlp.gate.e_score_correction_bias (F32); one shared MLP
// mlp.shared_experts.{linear_gate,up_proj,down_proj} of n_shared_experts *
// I: the mapping's rename of linear_gate to gate_proj (the attention's
// output gate) also renames the MLPs' gate projection, so the hub, and a
// transformers save, name it linear_gate. The
// hyper-connection mixers (attn_hc, ffn_hc, hc_*), the DSA indexer and
// attention sinks are carried byte for byte.
//
// HYV4TopkRouter is DeepSeek-V3's: fp32 sigmoid, top-k of s + bias within
// the topk_group best of n_group groups, w = s[ids] normalised +1e-20 when
// norm_topk_prob, times routed_scaling_factor. The routed experts clamp
// their SwiGLU at swiglu_limit (min(g, L), clamp(u, -L, L), then silu(g) u:
// DeepSeek-V4's), while the shared MLP (HYV4MLP) is plain SwiGLU: convert
// records both activations, and fuse-shared refuses (one bank, one
// activation). MoE layers are mlp_layer_types "sparse", by default all but
// the first.
var hyV4 = &spec{
	name: "hy_v4",
	names: naming{layers: "model.layers.", modules: []string{"mlp"}, proj: hubProj, router: "gate",
		bias: "gate.e_score_correction_bias", shared: "shared_experts", sharedProj: hyV4SharedProj,
		stackedGateUp: "experts.gate_up_proj", stackedDown: "experts.down_proj"},
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		numExperts:   routedExperts,
		sharedCount:  "n_shared_experts",
		denseFixed:   1,
	},
	layers: layerTypes,
	defaults: map[string]any{
		"n_group": 1.0, "topk_group": 1.0, "norm_topk_prob": true, "routed_scaling_factor": 2.827, "n_shared_experts": 1.0,
		"num_experts_per_tok": 8.0, "swiglu_limit": 10.0,
	},
	routing:         hyV4Routing,
	sharedUnfusable: "its shared MLP runs plain SwiGLU beside routed experts clamped at swiglu_limit, and a fused bank applies one activation to every slot",
}

// hyV4SharedProj are the shared MLP's projections as HY-V4 stores them.
var hyV4SharedProj = [3]string{"linear_gate", "up_proj", "down_proj"}

func hyV4Routing(c config, mt string, p *Plan) error {
	if err := withSwigluLimit(biasedSigmoid("routed_scaling_factor", true, "norm_topk_prob"))(c, mt, p); err != nil {
		return err
	}
	p.SharedAct = &layout.Activation{} // HYV4MLP: plain SwiGLU
	return nil
}
