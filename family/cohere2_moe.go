package family

import (
	"fmt"

	"github.com/moeprep/moeprep/moe"
)

// cohere2MoE is Cohere2 MoE (Cohere2MoeSparseMoeBlock): the router
// model.layers.L.mlp.gate takes the top-k LOGITS, then scores only those:
// softmax over the chosen k (the same as softmax over all, then top-k and
// renormalised) or, with expert_selection_fn sigmoid, their sigmoids,
// renormalised when norm_topk_prob. Experts are of intermediate_size. MoE
// layers: mlp_layer_types, else those from first_k_dense_replace (default 0).
// A shared expert is combined by shared_expert_combination_strategy: "sum"
// adds it like DeepSeek's; "average" (the default) returns (routed + shared)
// / 2, carried as the plan's OutputScale 0.5 (exact: a power of two).
var cohere2MoE = &spec{
	name:  "cohere2_moe",
	names: hubLayoutNames("mlp", "gate", "", "shared_experts"),
	keys: configKeys{
		intermediate: "intermediate_size",
		sharedCount:  "num_shared_experts",
		denseKey:     "first_k_dense_replace",
	},
	layers: layerTypes,
	defaults: map[string]any{
		"expert_selection_fn": "softmax", "norm_topk_prob": true, "num_shared_experts": 0.0, "shared_expert_combination_strategy": "average",
	},
	routing: cohere2Routing,
}

func cohere2Routing(c config, _ string, p *Plan) error {
	n, err := c.count("num_shared_experts", 0)
	if err != nil {
		return err
	}
	if n > 0 {
		how, err := c.str("shared_expert_combination_strategy", "average")
		if err != nil {
			return err
		}
		switch how {
		case "sum":
		case "average":
			p.OutputScale = 0.5
		default:
			return fmt.Errorf("config.json: shared_expert_combination_strategy %q (want sum or average)", how)
		}
	}
	fn, err := c.str("expert_selection_fn", "softmax")
	if err != nil {
		return err
	}
	switch fn {
	case "softmax":
		p.Scoring, p.NormTopKProb = moe.Softmax, true
		return nil
	case "sigmoid":
		p.Scoring, p.TopKMethod = moe.Sigmoid, moe.TopKNoAuxTC
		p.NormTopKProb, err = c.boolean("norm_topk_prob", true)
		return err
	}
	return fmt.Errorf("config.json: expert_selection_fn %q (want softmax or sigmoid)", fn)
}
