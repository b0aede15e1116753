package family

import (
	"fmt"

	"github.com/moeprep/moeprep/moe"
)

// phimoe is Phi-3.5-MoE (PhimoeSparseMoeBlock): Mixtral's names
// (block_sparse_moe.{gate, experts.E.w1|w3|w2}, intermediate_size) with
// the sparsemixer router, which in inference is a fixed top-2: slot 1 is the
// largest logit, its weight the softmax over the logits within 2*eps
// (relative, eps = router_jitter_noise) of it; slot 2 is the largest of the
// others, its weight the softmax over those within 2*eps of it (the first
// winner excluded). Weights are not renormalised. Every layer is MoE.
var phimoe = &spec{
	name:  "phimoe",
	names: mixtral.names,
	keys: configKeys{
		intermediate: "intermediate_size",
		numExperts:   localExpertsFirst,
	},
	layers:   everyLayer,
	defaults: map[string]any{"router_jitter_noise": 0.01},
	routing: func(c config, _ string, p *Plan) error {
		// HF's sparsemixer picks two experts whatever num_experts_per_tok
		// says (the key only sizes its unused top_k argument), so moeprep
		// plans two as well.
		p.TopK = 2
		p.Scoring = moe.SparseMixer
		var err error
		if p.JitterEps, err = c.float("router_jitter_noise", 0.01); err == nil && !(p.JitterEps >= 0) {
			err = fmt.Errorf("config.json: router_jitter_noise=%v must be >= 0", p.JitterEps)
		}
		return err
	},
}
