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
var deepseekV32 = &spec{
	name:  "deepseek_v32",
	names: deepseek.names,
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		// num_experts is re-routed to n_routed_experts by DeepseekV32Config.
		numExperts:  []string{"n_routed_experts", "num_local_experts", "num_experts"},
		sharedCount: "n_shared_experts",
		mtpCount:    "num_nextn_predict_layers",
		denseKey:    "first_k_dense_replace",
		denseFixed:  3,
	},
	layers: layerTypes,
	mtp:    true,
	defaults: map[string]any{
		"n_group": 8.0, "topk_group": 4.0, "norm_topk_prob": true, "routed_scaling_factor": 2.5, "n_shared_experts": 1.0,
		"num_experts_per_tok": 8.0, "first_k_dense_replace": 3.0,
	},
	routing: biasedSigmoid("routed_scaling_factor", true, "norm_topk_prob"),
}
