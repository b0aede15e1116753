package family

import (
	"fmt"
	"math"

	"github.com/moeprep/moeprep/layout"
)

// gemma4 is Gemma 4's MoE text model (gemma4_text; the gemma4 wrapper
// holds it under model.language_model). With enable_moe_block every
// decoder layer runs a dense GeGLU MLP (mlp.*, carried) and beside it a
// MoE block that is no module of its own: the router and the experts hang
// off the decoder layer, model.layers.L.router.proj [E, H],
// router.scale [H], router.per_expert_scale [E], experts.gate_up_proj
// [E, 2I, H] (gate rows, then up) and experts.down_proj [E, H, I],
// planned as views.
//
// Gemma4TextDecoderLayer (transformers 5.17) feeds the block the residual
// stream r, two ways: the router reads rmsnorm(r) * router.scale * H^-1/2
// (Gemma4TextRouter: an RMSNorm without a weight), softmax in fp32, top-k,
// renormalised, then each weight times per_expert_scale[id]; the experts
// read pre_feedforward_layernorm_2(r) = rmsnorm(r) * weight (Gemma 4's
// RMSNorm multiplies by the weight itself, not 1 + weight), both with
// rms_norm_eps, and run gelu_tanh(gate) * up. The block's output, the
// weighted expert sum, then goes through post_feedforward_layernorm_2:
// moeprep's layer is r -> that sum (the goldens' y), the norms read as
// Layer.RouterInputScale and ExpertInputNorm.
//
// DiffusionGemma's text model (diffusion_gemma_text, inside the
// diffusion_gemma wrapper) runs the same MoE decoder layer in its encoder
// and its diffusion decoder, every layer MoE.
var gemma4 = &spec{
	name:       "gemma4",
	modelTypes: []string{"gemma4_text", "diffusion_gemma_text"},
	names: naming{layers: "model.layers.", modules: []string{""}, experts: "experts", router: "router.proj",
		stackedGateUp: "experts.gate_up_proj", stackedDown: "experts.down_proj",
		expertScale: "router.per_expert_scale", routerInputScale: "router.scale",
		expertInputNorm: "pre_feedforward_layernorm_2.weight"},
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		numExperts:   []string{"num_experts"},
		topK:         "top_k_experts",
	},
	layers:   everyLayer,
	defaults: map[string]any{"hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "enable_moe_block": false},
	// DiffusionGemma's text model has no enable_moe_block: every layer is
	// Gemma 4's MoE decoder layer.
	defaultsByType: map[string]map[string]any{"diffusion_gemma_text": {"enable_moe_block": true}},
	lift:           gemma4Lift,
	routing:        gemma4Routing,
}

// gemma4Lift refuses a dense Gemma 4 (enable_moe_block false, the
// configuration class's default) before its missing MoE sizes are asked
// for.
func gemma4Lift(c config) (config, error) {
	moe, err := c.boolean("enable_moe_block", false)
	if err != nil {
		return c, err
	}
	if !moe {
		return c, fmt.Errorf("config.json: enable_moe_block is false: this Gemma 4 is dense, with no MoE layer to convert")
	}
	return c, nil
}

func gemma4Routing(c config, _ string, p *Plan) error {
	act, err := c.str("hidden_activation", "gelu_pytorch_tanh")
	if err != nil {
		return err
	}
	if act != "gelu_pytorch_tanh" {
		return fmt.Errorf("config.json: hidden_activation %q: moeprep computes Gemma 4's experts with gelu_pytorch_tanh (GeGLU, tanh gelu) only", act)
	}
	p.Act = layout.GeGLUTanh()
	p.NormTopKProb = true // Gemma4TextRouter always renormalises the top k
	eps, err := c.float("rms_norm_eps", 1e-6)
	if err != nil {
		return err
	}
	if !(eps > 0 && eps < 1) || math.IsInf(eps, 0) {
		return fmt.Errorf("config.json: rms_norm_eps=%g: want a small positive number", eps)
	}
	p.InputNormEps = eps
	return nil
}
