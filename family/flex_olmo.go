package family

// flexOlmo is FlexOlmo (FlexOlmoSparseMoeBlock = OlmoeSparseMoeBlock,
// transformers 5.17): OLMoE's block and hub names (model.layers.L.mlp.{gate,
// experts.E.*_proj}, experts of intermediate_size), softmax top-k
// renormalised only when norm_topk_prob (default false). Every layer is
// MoE; the decoder's post-norms sit outside the block.
var flexOlmo = &spec{
	name:     "flex_olmo",
	names:    olmoe.names,
	keys:     olmoe.keys,
	layers:   everyLayer,
	defaults: map[string]any{"norm_topk_prob": false, "num_experts_per_tok": 5.0},
	routing:  softmaxRouting,
}
