package family

// glmMoEDsa is GLM-5 (GlmMoeDsaMoE, transformers 5.17): DeepSeek-V3.2's
// model (GlmMoeDsaConfig extends DeepseekV32Config) with GLM's defaults
// and cross-layer DSA sharing: layers whose indexer_types entry is
// "shared" have no self_attn.indexer.* tensors. The MoE block, router and
// hub names are DeepSeek-V3's (fp32 sigmoid + F32 correction bias, groups
// by the sum of their top 2, -inf elsewhere, weights normalised +1e-20
// when norm_topk_prob, times routed_scaling_factor 2.5 by default; one
// ungated shared expert of n_shared_experts * I: fusable). MoE layers are
// mlp_layer_types "sparse", by default all but the first
// first_k_dense_replace (3); the MTP layer (model.layers.78 on the hub) is
// planned as DeepSeek-V3's.
var glmMoEDsa = layerTypedDeepSeek("glm_moe_dsa", deepseekV32.keys, map[string]any{
	"n_group": 1.0, "topk_group": 1.0, "norm_topk_prob": true, "routed_scaling_factor": 2.5, "n_shared_experts": 1.0,
	"num_experts_per_tok": 8.0, "first_k_dense_replace": 3.0,
})
