package family

// olmoe is OLMoE (OlmoeSparseMoeBlock): model.layers.L.mlp.{gate,
// experts.E.*_proj} like Qwen3-MoE, but the expert size is
// intermediate_size; softmax top-k, renormalised when norm_topk_prob
// (default false). Every layer is MoE.
var olmoe = &spec{
	name:     "olmoe",
	names:    qwen3MoE.names,
	keys:     configKeys{intermediate: "intermediate_size"},
	layers:   everyLayer,
	defaults: map[string]any{"norm_topk_prob": false},
	routing:  softmaxRouting,
}
