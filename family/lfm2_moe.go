package family

// lfm2MoE is Liquid's LFM2-MoE (Lfm2MoeSparseMoeBlock, transformers 5.17):
// the MoE module is model.layers.L.feed_forward with the router
// feed_forward.gate [E,H], experts feed_forward.experts.E.{w1,w3,w2} (gate,
// up, down) of moe_intermediate_size and, when use_expert_bias (the
// default), the correction bias feed_forward.expert_bias [E] (F32). Routing
// (Lfm2MoeTopKRouter): s = sigmoid(logits); ids = top-k of s + bias (of s
// without one); w = s[ids], normalised when norm_topk_prob, times
// routed_scaling_factor. No shared expert, no groups. Layers from
// num_dense_layers on are MoE; the conv and attention mixers are copied.
//
// transformers normalises by sum + 1e-6, moeprep (and its kernels) by
// sum + 1e-20: the weights differ by a factor 1 - 1e-6/sum, under 1e-6
// relative while the k chosen sigmoids sum to 1 or more (the fixture's
// layers agree with transformers' to 7e-7 relative L2, inside validate's
// tolerances; a token whose chosen sigmoids sum to s differs by 1e-6/s).
var lfm2MoE = &spec{
	name: "lfm2_moe",
	names: naming{layers: "model.layers.", modules: []string{"feed_forward"}, experts: "experts",
		proj: [3]string{"w1", "w3", "w2"}, router: "gate", bias: "expert_bias"},
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		biasIf:       "use_expert_bias",
		denseKey:     "num_dense_layers",
		denseFixed:   2,
	},
	layers: firstDense,
	defaults: map[string]any{
		"use_expert_bias": true, "norm_topk_prob": true, "routed_scaling_factor": 1.0, "num_experts_per_tok": 4.0,
	},
	routing: biasedSigmoid("routed_scaling_factor", false, "norm_topk_prob"),
}
