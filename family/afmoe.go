package family

// afmoe is Arcee AFMoE (AfmoeSparseMoeBlock): router
// model.layers.L.mlp.router.gate, correction bias mlp.expert_bias, plain
// top-k of sigmoid + bias, weights always normalised +1e-20 and times
// route_scale, plus an ungated shared expert mlp.shared_experts of
// num_shared_experts * I. Layers from num_dense_layers on are MoE.
var afmoe = &spec{
	name:  "afmoe",
	names: hubLayoutNames("mlp", "router.gate", "expert_bias", "shared_experts"),
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		sharedCount:  "num_shared_experts",
		denseKey:     "num_dense_layers",
		denseFixed:   1,
	},
	layers:   firstDense,
	defaults: map[string]any{"route_scale": 1.0, "num_shared_experts": 2.0},
	routing:  biasedSigmoid("route_scale", false, ""),
}
