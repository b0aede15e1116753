package family

// qwen3MoE is Qwen3-MoE: model.layers.L.mlp.{gate, experts.E.*_proj}, no
// shared expert. Hub configs write num_experts, transformers 5 may write
// num_local_experts (its attribute_map aliases the two).
var qwen3MoE = &spec{
	name:       "qwen3_moe",
	modelTypes: []string{"qwen3_moe"},
	names:      hubLayoutNames("mlp", "gate", "", ""),
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		numExperts:   []string{"num_experts", "num_local_experts"},
	},
	layers:   sparseStep,
	defaults: map[string]map[string]any{"qwen3_moe": qwenDefaults},
	routing:  softmaxRouting,
}
