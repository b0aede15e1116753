package family

import (
	"fmt"

	"github.com/moeprep/moeprep/moe"
)

// aria is Aria's language model (AriaTextMoELayer, transformers 5.17,
// model_type aria_text), planned inside the aria wrapper. (A text-only
// save, AriaTextForCausalLM, has the same names under model.layers.L; it is
// not listed as a bare family until synth can write it.) Every decoder
// layer is MoE, <layers>.L.mlp holding:
//
//   - router.weight [E, H] (no bias);
//   - the routed experts stacked and transposed (AriaGroupedExpertsGemm
//     computes x @ W): experts.fc1.weight [E, H, 2I], the first I columns
//     the gate (silu applied), the last I the up, and experts.fc2.weight
//     [E, I, H], with I = intermediate_size, E = moe_num_experts;
//   - shared_experts.{gate,up,down}_proj.weight of intermediate
//     intermediate_size * moe_num_shared_experts, ungated, added, with
//     biases when mlp_bias.
//
// Routing (AriaExperts.route_tokens_to_experts): top-moe_topk of the
// logits, softmax over the chosen ones (= softmax, top-k, renormalised),
// no scaling: the shared expert fuses as slots of weight 1. The routed
// experts' silu is hard-coded; the shared expert's is hidden_act.
var aria = &spec{
	name:       "aria",
	modelTypes: []string{"aria_text"},
	names:      stackedHubNames("mlp", "router", "shared_experts", "experts.fc1.weight", "experts.fc2.weight", transposedStacks),
	keys: configKeys{
		intermediate: "intermediate_size",
		numExperts:   []string{"moe_num_experts"},
		topK:         "moe_topk",
		sharedCount:  "moe_num_shared_experts",
		sharedBias:   "mlp_bias",
	},
	// AriaTextConfig's defaults.
	defaults: map[string]any{"moe_topk": 2.0, "moe_num_shared_experts": 2.0, "hidden_act": "silu", "mlp_bias": false},
	layers:   everyLayer,
	refuse: func(c config) error {
		act, err := c.str("hidden_act", "silu")
		if err != nil {
			return err
		}
		if act != "silu" {
			return fmt.Errorf("config.json: hidden_act %q is not supported for aria_text: the routed experts apply silu whatever it says and the shared expert applies hidden_act, and moeprep computes one activation per layer", act)
		}
		return nil
	},
	routing: func(_ config, _ string, p *Plan) error {
		p.Scoring, p.TopKMethod, p.NormTopKProb = moe.Softmax, moe.TopKGreedy, true
		return nil
	},
	transformers: TransformersForm{AsStored: true, Why: "AriaGroupedExpertsGemm holds experts.fc1.weight [E, H, 2I] and fc2.weight [E, I, H], as saved"},
}
