package family

import (
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
)

// gptOSS is gpt-oss (GptOssMLP) as transformers saves it in bf16, or as
// OpenAI's own repos ship it in MXFP4 (*_blocks/*_scales, not transposed:
// family/mxfp4.go).
// Every layer is MoE: model.layers.L.mlp with experts stacked and
// transposed on disk, experts.gate_up_proj [E, H, 2I] whose columns
// alternate gate, up, gate, up (z[..., ::2] is the gate, z[..., 1::2] the
// up), experts.gate_up_proj_bias [E, 2I] in the same order,
// experts.down_proj [E, I, H] and experts.down_proj_bias [E, H], with
// I = intermediate_size. The router mlp.router [E, H] has its own bias,
// added to the logits: top-k of the logits, softmax over the chosen ones
// (= softmax, top-k, renormalised). The experts' activation is the
// clamped SwiGLU with alpha 1.702 and limit 7 hard-coded in GptOssExperts:
// g = min(g, 7), u = clamp(u, -7, 7), out = (u + 1) * g * sigmoid(1.702 g).
var gptOSS = &spec{
	name: "gpt_oss",
	names: naming{
		layers:             "model.layers.",
		modules:            []string{"mlp"},
		router:             "router",
		routerLogitBias:    "router.bias",
		stackedGateUp:      "experts.gate_up_proj",
		stackedDown:        "experts.down_proj",
		stackedTransposed:  true,
		stackedInterleaved: true,
		stackedGateUpBias:  "experts.gate_up_proj_bias",
		stackedDownBias:    "experts.down_proj_bias",
	},
	keys: configKeys{
		intermediate: "intermediate_size",
		numExperts:   localExpertsFirst,
	},
	defaults: map[string]any{"num_experts_per_tok": 4.0},
	layers:   everyLayer,
	routing: func(_ config, _ string, p *Plan) error {
		p.Scoring, p.NormTopKProb, p.ExpertBias = moe.Softmax, true, true
		p.Act = layout.Activation{Alpha: 1.702, Limit: 7, UpOffset: 1}
		return nil
	},
	transformers: TransformersForm{AsStored: true, Why: "GptOssExperts holds gate_up_proj [E, H, 2I] with gate and up columns interleaved, its biases, and MXFP4's _blocks/_scales, as saved"},
}
