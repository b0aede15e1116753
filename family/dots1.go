package family

// dots1 is rednote's dots.llm1 (Dots1MoE, transformers 5.17): DeepSeek-V3's
// MoE block under DeepSeek-V3's hub names (model.layers.L.mlp.{gate,
// gate.e_score_correction_bias, experts.E.*_proj, shared_experts.*_proj}).
// Dots1TopkRouter: fp32 logits, s = sigmoid, top-k of s + correction bias
// within the topk_group best of n_group groups (a group scores the sum of
// its top 2; the others masked to -inf), weights s[ids] normalised +1e-20
// when norm_topk_prob, times routed_scaling_factor; the ungated shared
// expert of n_shared_experts * I is added: fusable. Layer L is MoE iff
// L >= first_k_dense_replace (no moe_layer_freq, no MTP layers).
var dots1 = &spec{
	name:   "dots1",
	names:  deepseek.names,
	keys:   firstDenseKeys,
	layers: firstDense,
	// Dots1Config's defaults; n_shared_experts has none (its None fails in
	// transformers), so a config without it plans no shared expert.
	defaults: map[string]any{
		"n_group": 1.0, "topk_group": 1.0, "norm_topk_prob": false, "routed_scaling_factor": 1.0, "first_k_dense_replace": 0.0,
	},
	routing: biasedSigmoid("routed_scaling_factor", true, "norm_topk_prob"),
}

// firstDenseKeys are the config keys of DeepSeek-V3's successors that read
// no MTP layers and plan layer L as MoE iff L >= first_k_dense_replace
// (layers: firstDense): dots1 and Mistral 4.
var firstDenseKeys = configKeys{
	intermediate: "moe_intermediate_size",
	numExperts:   routedExperts,
	sharedCount:  "n_shared_experts",
	denseKey:     "first_k_dense_replace",
}
