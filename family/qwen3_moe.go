package family

// qwen3MoE is Qwen3-MoE: model.layers.L.mlp.{gate, experts.E.*_proj}, no
// shared expert. Hub configs write num_experts, transformers 5 may write
// num_local_experts (its attribute_map aliases the two).
var qwen3MoE = &spec{
	name:     "qwen3_moe",
	names:    hubLayoutNames("mlp", "gate", "", ""),
	keys:     configKeys{intermediate: "moe_intermediate_size"},
	layers:   sparseStep,
	defaults: qwenDefaults,
	routing:  softmaxRouting,
}
