package family

import (
	"fmt"

	"github.com/moeprep/moeprep/moe"
)

// deepseekOcr2Text is DeepSeek-OCR-2's language model (DeepseekOcr2TextMoe,
// transformers 5.17), planned inside its wrapper deepseek_ocr2 (wrapper.go):
// DeepSeek-V2's MoE block with plain multi-head attention. The wrapper's
// conversion mapping renames (^|model.)layers. to language_model.layers. on
// load, so a save writes the text layers as the hub does,
// model.layers.L.mlp.{gate, experts.E.*_proj, shared_experts.*_proj}
// (experts merged as qwen2_moe's pattern does); the SAM and Qwen2 vision
// towers, projector and view separator are carried byte for byte.
//
// DeepseekOcr2TextTopkRouter: fp32 logits, p = softmax; topk_method greedy:
// ids, w = top-k of p; group_limited_greedy: a group scores its best p, the
// topk_group best of n_group groups stay (others 0); never renormalised
// (the config has no norm_topk_prob); w *= routed_scaling_factor. The
// ungated shared expert of n_shared_experts * I is added (with biases when
// mlp_bias): fusable. MoE layers are mlp_layer_types "sparse" (transformers
// needs the list); without it, from first_k_dense_replace as DeepSeek's own
// config writes it.
var deepseekOcr2Text = &spec{
	name:       "deepseek_ocr2",
	modelTypes: []string{"deepseek_ocr2_text"},
	names:      hubLayoutNames("mlp", "gate", "", "shared_experts"),
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		numExperts:   []string{"n_routed_experts", "num_experts"},
		sharedCount:  "n_shared_experts",
		sharedBias:   "mlp_bias",
		denseKey:     "first_k_dense_replace",
	},
	layers:   layerTypes,
	defaults: map[string]any{"n_shared_experts": 2.0, "routed_scaling_factor": 1.0, "topk_method": "greedy", "mlp_bias": false},
	routing:  deepseekOcr2Routing,
}

func deepseekOcr2Routing(c config, _ string, p *Plan) error {
	method, err := c.str("topk_method", "greedy")
	if err != nil {
		return err
	}
	switch method {
	case "greedy":
		p.Scoring, p.TopKMethod = moe.Softmax, moe.TopKGreedy
	case "group_limited_greedy":
		p.Scoring, p.TopKMethod = moe.Softmax, moe.TopKGroupLimited
		if err = readGroups(c, p); err != nil {
			return err
		}
	default:
		// transformers leaves the weights unset for any other method
		return fmt.Errorf("config.json: topk_method %q is not supported for deepseek_ocr2_text (greedy or group_limited_greedy)", method)
	}
	p.NormTopKProb = false
	p.RoutedScalingFactor, err = c.float("routed_scaling_factor", 1)
	return err
}
