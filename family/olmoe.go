package family

// olmoe is OLMoE (OlmoeSparseMoeBlock): model.layers.L.mlp.{gate,
// experts.E.*_proj} like Qwen3-MoE, but the expert size is
// intermediate_size; softmax top-k, renormalised when norm_topk_prob
// (default false). Every layer is MoE.
var olmoe = &spec{
	name:       "olmoe",
	modelTypes: []string{"olmoe"},
	names:      qwen3MoE.names,
	keys: configKeys{
		intermediate: "intermediate_size",
		numExperts:   []string{"num_experts", "num_local_experts"},
	},
	layers:   everyLayer,
	defaults: map[string]map[string]any{"olmoe": {"norm_topk_prob": false}},
	routing:  softmaxRouting,
}
