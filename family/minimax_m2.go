package family

// minimaxM2 is MiniMax-M2 (MiniMaxM2SparseMoeBlock): Mixtral's names
// (model.layers.L.block_sparse_moe.{gate, experts.E.w1|w3|w2}, expert size
// intermediate_size) with a correction bias on the MoE module
// (block_sparse_moe.e_score_correction_bias): top-k of sigmoid + bias, no
// groups, weights always normalised (no epsilon; a sum of sigmoids is never
// near 0), no scaling factor, no shared expert. Every layer is MoE.
var minimaxM2 = &spec{
	name:  "minimax_m2",
	names: mixtralNames("e_score_correction_bias"),
	keys: configKeys{
		intermediate: "intermediate_size",
		numExperts:   localExpertsFirst,
	},
	layers:  everyLayer,
	routing: biasedSigmoid("", false, ""),
}
