package family

// GLM-4.5/4.6/4.7 (glm4_moe) and GLM-4.7-Flash (glm4_moe_lite) route exactly
// as DeepSeek-V3 does (Glm4MoeTopkRouter: fp32 sigmoid, correction bias,
// groups by the sum of their top 2, weights normalised +1e-20, times
// routed_scaling_factor) over the same hub names, so glm4_moe is planned by
// the deepseek family with its own defaults (deepseek.go). The lite model
// picks its MoE layers by mlp_layer_types, which its configuration fills
// with one dense layer and the rest sparse (first_k_dense_replace is not
// read), so it needs a rule of its own.

// glm4MoEDefaults are Glm4MoeConfig's (transformers 5.17).
var glm4MoEDefaults = map[string]any{
	"scoring_func":          "sigmoid",
	"topk_method":           "noaux_tc",
	"n_group":               1.0,
	"topk_group":            1.0,
	"norm_topk_prob":        true,
	"routed_scaling_factor": 1.0,
	"first_k_dense_replace": 1.0,
	"moe_layer_freq":        1.0,
	"n_shared_experts":      1.0,
}

var glm4MoELite = layerTypedDeepSeek("glm4_moe_lite", glmKeys(1), map[string]any{
	"n_group": 1.0, "topk_group": 1.0, "norm_topk_prob": true, "routed_scaling_factor": 1.8, "n_shared_experts": 1.0,
})
