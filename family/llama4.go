package family

import "github.com/moeprep/moeprep/moe"

// llama4 is Llama 4's text model (Llama4TextMoe), model_type llama4_text.
// Its experts are stacked on disk and stored transposed, for x @ W:
// model.layers.L.feed_forward.experts.gate_up_proj [E, H, 2I] (gate columns
// 0..I-1, up columns I..2I-1) and experts.down_proj [E, I, H], with
// I = intermediate_size; the router feed_forward.router [E, H] has no bias.
// Routing is top-k of the logits, then sigmoid of the chosen ones: the
// same ids as top-k of sigmoid, not normalised, no scaling. The weight
// scales each expert's INPUT: y = shared(x) + sum_j E_j(w_j * x). SwiGLU
// is not homogeneous, so that is not w_j * E_j(x) (RoutedInputScaled). The
// always-on shared expert feed_forward.shared_expert.{gate,up,down}_proj has
// intermediate_size too. MoE layers are config.moe_layers, or every
// interleave_moe_layer_step-th layer counting from step-1.
var llama4 = &spec{
	name:       "llama4",
	modelTypes: []string{"llama4_text"},
	names:      stackedHubNames("feed_forward", "router", "shared_expert", "experts.gate_up_proj", "experts.down_proj", transposedStacks),
	keys: configKeys{
		intermediate: "intermediate_size",
		numExperts:   []string{"num_local_experts"},
		sharedFixed:  1,
	},
	defaults:        map[string]any{"num_experts_per_tok": 1.0},
	layers:          moeLayerList,
	sharedUnfusable: "the routing weight scales the routed experts' input, and a fused shared slot would need the unscaled input in the same grouped GEMM",
	routing: func(_ config, _ string, p *Plan) error {
		p.Scoring, p.TopKMethod, p.NormTopKProb, p.RoutedInputScaled = moe.Sigmoid, moe.TopKGreedy, false, true
		return nil
	},
	transformers: TransformersForm{InOut: true, Why: "Llama4TextExperts computes x @ W"},
}
