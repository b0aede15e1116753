package family

// mellum is JetBrains' Mellum MoE (MellumSparseMoeBlock = Qwen3-MoE's block,
// transformers 5.17): model.layers.L.mlp.{gate, experts.E.{gate,up,down}_proj}
// (transformers saves its qwen2_moe conversion pattern), experts of
// moe_intermediate_size, no shared expert. MellumTopKRouter: softmax of the
// logits in f32, top-k, renormalised when norm_topk_prob (default true).
// MoE layers are mlp_layer_types "sparse" (MellumConfig fills all sparse;
// it has no decoder_sparse_step or mlp_only_layers); dense layers are a
// SwiGLU MLP of intermediate_size, copied.
var mellum = &spec{
	name:     "mellum",
	names:    qwen3MoE.names,
	keys:     configKeys{intermediate: "moe_intermediate_size"},
	layers:   layerTypes,
	defaults: map[string]any{"norm_topk_prob": true, "num_experts_per_tok": 8.0},
	routing:  softmaxRouting,
}
