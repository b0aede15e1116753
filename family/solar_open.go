package family

// solarOpen is Upstage's Solar Open (SolarOpenMoE = Glm4MoeMoE, transformers
// 5.17): DeepSeek-V3's routing and hub names (model.layers.L.mlp.{gate,
// gate.e_score_correction_bias, experts.E.*_proj, shared_experts.*_proj})
// in every layer: SolarOpenConfig drops first_k_dense_replace and its
// decoder layer always builds the MoE block. Router: fp32 sigmoid, top-k of
// s + bias within the topk_group best groups (-inf elsewhere), weights
// normalised +1e-20 when norm_topk_prob, times routed_scaling_factor; the
// ungated shared expert of n_shared_experts * I is added: fusable.
var solarOpen = &spec{
	name:  "solar_open",
	names: deepseek.names,
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		numExperts:   routedExperts,
		sharedCount:  "n_shared_experts",
	},
	layers: everyLayer,
	defaults: map[string]any{
		"n_group": 1.0, "topk_group": 1.0, "norm_topk_prob": true, "routed_scaling_factor": 1.0, "n_shared_experts": 1.0,
		"num_experts_per_tok": 8.0,
	},
	routing: biasedSigmoid("routed_scaling_factor", true, "norm_topk_prob"),
}
