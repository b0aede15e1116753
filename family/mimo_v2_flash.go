package family

// mimoV2Flash is Xiaomi's MiMo-V2-Flash (MiMoV2FlashMoE, transformers
// 5.17): DeepSeek-V3's block without a shared expert, under the hub names
// model.layers.L.mlp.{gate, gate.e_score_correction_bias (F32),
// experts.E.*_proj}. MiMoV2FlashTopkRouter: fp32 sigmoid, top-k of s + bias
// within the topk_group best of n_group groups (sum of their top 2, -inf
// elsewhere), weights s[ids] normalised +1e-20 when norm_topk_prob, times
// routed_scaling_factor (null in hub configs: 1). MoE layers are
// mlp_layer_types "sparse", by default all but the first; hub configs'
// moe_layer_freq list is not read by transformers, nor here. The MTP
// module (model.mtp.*) is copied byte for byte.
var mimoV2Flash = &spec{
	name:  "mimo_v2_flash",
	names: hubLayoutNames("mlp", "gate", "gate.e_score_correction_bias", ""),
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		numExperts:   routedExperts,
		denseFixed:   1,
	},
	layers: layerTypes,
	defaults: map[string]any{
		"n_group": 1.0, "topk_group": 1.0, "norm_topk_prob": true, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8.0,
	},
	routing: biasedSigmoid("routed_scaling_factor", true, "norm_topk_prob"),
}
