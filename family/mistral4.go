package family

import "github.com/moeprep/moeprep/moe"

// mistral4 is Mistral Small 4 (Mistral4MoE, transformers 5.17). No
// conversion mapping names it, so transformers saves its experts as it
// holds them: stacked model.layers.L.mlp.experts.gate_up_proj [E, 2I, H]
// (gate rows, then up) and experts.down_proj [E, H, I], planned as views;
// router mlp.gate [E, H]; one ungated shared expert
// mlp.shared_experts.{gate,up,down}_proj of n_shared_experts * I, added:
// fusable. No correction bias.
//
// Mistral4TopkRouter: logits in the model dtype, p = softmax; with groups a
// group scores the sum of its top 2 p and only the topk_group best groups
// stay (the others masked to 0, which a softmax score never ties); ids =
// top-k of p; w = p[ids] normalised +1e-20 when norm_topk_prob, times
// routed_scaling_factor. Layer L is MoE iff L >= first_k_dense_replace.
var mistral4 = &spec{
	name:   "mistral4",
	names:  stackedHubNames("mlp", "gate", "shared_experts", "experts.gate_up_proj", "experts.down_proj"),
	keys:   firstDenseKeys,
	layers: firstDense,
	defaults: map[string]any{
		"n_group": 1.0, "topk_group": 1.0, "norm_topk_prob": true, "routed_scaling_factor": 1.0, "n_shared_experts": 1.0,
		"num_experts_per_tok": 4.0, "first_k_dense_replace": 0.0,
	},
	routing: mistral4Routing,
}

func mistral4Routing(c config, _ string, p *Plan) error {
	p.Scoring, p.TopKMethod = moe.Softmax, moe.TopKNoAuxTC // groups by the sum of their top 2
	if err := readGroups(c, p); err != nil {
		return err
	}
	return readRenorm(c, p, true)
}
