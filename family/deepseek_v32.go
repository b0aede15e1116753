package family

// deepseekV32 is DeepSeek-V3.2 (DeepseekV32MoE, transformers 5.17):
// DeepSeek-V3's MoE block and hub names (model.layers.L.mlp.{gate,
// gate.e_score_correction_bias (F32, strict), experts.E.*_proj,
// shared_experts.*_proj}) beside MLA attention with a DSA indexer
// (self_attn.indexer.{wq_b, wk, k_norm, weights_proj}), which is copied
// byte for byte. DeepseekV32TopkRouter: fp32 logits, s = sigmoid, top-k of
// s + bias within the topk_group best of n_group groups (a group scores
// the sum of its top 2, the others masked to -inf), weights s[ids]
// normalised +1e-20 when norm_topk_prob, times routed_scaling_factor; the
// ungated shared expert of n_shared_experts * I is added: fusable. MoE
// layers are mlp_layer_types "sparse", by default all but the first
// first_k_dense_replace (3); the MTP layer (model.layers.61 on the hub,
// ignored by transformers) is planned as DeepSeek-V3's.
var deepseekV32 = layerTypedDeepSeek("deepseek_v32", configKeys{
	intermediate: "moe_intermediate_size",
	// num_experts is re-routed to n_routed_experts by DeepseekV32Config.
	numExperts:  []string{"n_routed_experts", "num_local_experts", "num_experts"},
	sharedCount: "n_shared_experts",
	mtpCount:    "num_nextn_predict_layers",
	denseKey:    "first_k_dense_replace",
	denseFixed:  3,
}, map[string]any{
	"n_group": 8.0, "topk_group": 4.0, "norm_topk_prob": true, "routed_scaling_factor": 2.5, "n_shared_experts": 1.0,
	"num_experts_per_tok": 8.0, "first_k_dense_replace": 3.0,
})

// layerTypedDeepSeek is a family planned as DeepSeek-V3 (its hub names; its
// router: fp32 sigmoid plus correction bias, grouped, weights normalised
// when norm_topk_prob, times routed_scaling_factor) whose MoE layers
// mlp_layer_types picks, MTP layers included. DeepSeek-V3.2, GLM-5,
// GLM-4.7-Flash and GLM-5.3-Flash's text model differ only in their name,
// config keys and defaults.
func layerTypedDeepSeek(name string, keys configKeys, defaults map[string]any) *spec {
	return &spec{
		name:     name,
		names:    deepseek.names,
		keys:     keys,
		layers:   layerTypes,
		mtp:      true,
		defaults: defaults,
		routing:  biasedSigmoid("routed_scaling_factor", true, "norm_topk_prob"),
	}
}

// glmKeys are the config keys of the GLM models planned by
// layerTypedDeepSeek without first_k_dense_replace: without
// mlp_layer_types, the first denseFixed layers are dense.
func glmKeys(denseFixed int) configKeys {
	return configKeys{
		intermediate: "moe_intermediate_size",
		numExperts:   routedExperts,
		sharedCount:  "n_shared_experts",
		mtpCount:     "num_nextn_predict_layers",
		denseFixed:   denseFixed,
	}
}
