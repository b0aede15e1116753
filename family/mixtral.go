package family

// mixtral is Mixtral: every layer is MoE,
// model.layers.L.block_sparse_moe.{gate, experts.E.w1|w3|w2} with w1 = gate,
// w3 = up, w2 = down, and the expert size is plain intermediate_size.
// transformers 5 renames the module to "mlp" in memory; a checkpoint saved
// under that name is accepted too. MiniMax-Text-01 (minimax) has the same
// MoE block (MiniMaxSparseMoeBlock: softmax top-k, always renormalised) under
// the same names; its lightning-attention layers are copied byte for byte.
var mixtral = &spec{
	name:       "mixtral",
	modelTypes: []string{"mixtral", "minimax"},
	names:      mixtralNames(""),
	keys: configKeys{
		intermediate: "intermediate_size",
		numExperts:   localExpertsFirst,
	},
	layers:  everyLayer,
	routing: mixtralRouting,
}

// mixtralRouting: softmax, top-k, always renormalised (Mixtral has no
// norm_topk_prob key; its router divides by the top-k sum unconditionally).
func mixtralRouting(_ config, _ string, p *Plan) error {
	p.NormTopKProb = true
	return nil
}
