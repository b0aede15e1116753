package family

// exaoneMoE is EXAONE MoE (ExaoneMoeSparseMoEBlock): DeepSeek-V3 routing
// (ExaoneMoeTopkRouter: sigmoid + correction bias, grouped top-k, weights
// normalised +1e-20 when norm_topk_prob, times routed_scaling_factor) and an
// ungated shared expert of num_shared_experts * I. On disk the correction
// bias sits on the MoE module, model.layers.L.mlp.e_score_correction_bias
// (transformers moves it into the router when loading). MoE layers:
// mlp_layer_types, or the layers from first_k_dense_replace on.
var exaoneMoE = &spec{
	name:  "exaone_moe",
	names: hubLayoutNames("mlp", "gate", "e_score_correction_bias", "shared_experts"),
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		sharedCount:  "num_shared_experts",
		denseKey:     "first_k_dense_replace",
		denseFixed:   1,
	},
	layers: layerTypes,
	defaults: map[string]any{
		"n_group": 1.0, "topk_group": 1.0, "norm_topk_prob": true, "routed_scaling_factor": 2.5, "num_shared_experts": 1.0,
	},
	routing: biasedSigmoid("routed_scaling_factor", true, "norm_topk_prob"),
}
