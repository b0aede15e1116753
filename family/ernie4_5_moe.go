package family

// ernie45MoE is ERNIE 4.5 MoE (Ernie4_5_MoeSparseMoeBlock): the router
// model.layers.L.mlp.gate takes the top-k of softmax(logits) + the
// correction bias mlp.moe_statics.e_score_correction_bias ([1,E], F32),
// weights are the unbiased softmax values renormalised, no scaling factor;
// an ungated shared expert mlp.shared_experts of moe_num_shared_experts * I.
// Expert count and top-k come under moe_num_experts and moe_k. MoE layers:
// moe_layer_start_index <= L <= moe_layer_end_index, (L+1) % interval == 0.
// use_bias=true gives the shared expert (Ernie4_5_MoeMLP, nn.Linear with
// bias) gate, up and down biases; the routed experts never have any.
var ernie45MoE = &spec{
	name:  "ernie4_5_moe",
	names: hubLayoutNames("mlp", "gate", "moe_statics.e_score_correction_bias", "shared_experts"),
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		numExperts:   []string{"moe_num_experts", "num_experts"},
		topK:         "moe_k",
		sharedCount:  "moe_num_shared_experts",
		sharedBias:   "use_bias",
	},
	layers:      startEndInterval,
	softmaxBias: true,
	biasRow:     true,
	defaults:    map[string]any{"moe_num_shared_experts": 2.0, "moe_k": 6.0},
	routing:     softmaxNorm(true),
}
