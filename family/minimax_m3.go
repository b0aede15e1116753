package family

import (
	"fmt"

	"github.com/moeprep/moeprep/layout"
)

// minimaxM3 is MiniMax-M3's language model (MiniMaxM3VLSparseMoeBlock,
// transformers 5.17, model_type minimax_m3_vl_text), planned inside the
// minimax_m3_vl wrapper, whose conversion mapping transformers reverses on
// save into the hub's names: language_model.model.layers.L.block_sparse_moe.
// {gate.weight [E, H], e_score_correction_bias [E], experts.E.{w1,w3,w2}.weight
// (w1 gate, w3 up, w2 down), shared_experts.{gate,up,down}_proj.weight}.
//
// Routing (MiniMaxM3VLTopKRouter): s = sigmoid(f32 logits); ids = top-k of
// s + bias; w = s[ids] / sum (no epsilon); the routed sum times
// routed_scaling_factor; plus the ungated shared MLP of
// shared_intermediate_size. Experts and shared MLP compute gpt-oss's
// clamped activation without interleaving: g = min(g, swiglu_limit),
// u = clamp(u, -limit, limit), (u + 1) * g * sigmoid(swiglu_alpha g).
// MoE layers are mlp_layer_types "sparse" (a hub config's moe_layer_freq
// list becomes it; without either, every layer).
var minimaxM3 = &spec{
	name:       "minimax_m3",
	modelTypes: []string{"minimax_m3_vl_text"},
	names: func() naming {
		n := mixtralNames("e_score_correction_bias")
		n.shared, n.sharedProj = "shared_experts", hubProj
		return n
	}(),
	keys: configKeys{
		intermediate:  "intermediate_size",
		numExperts:    localExpertsFirst,
		sharedFixed:   1,
		sharedSize:    "shared_intermediate_size",
		sharedIfSized: true,
	},
	// Saved alone (MiniMaxM3VLForCausalLM), transformers 5.17 writes the
	// text model as it holds it (no conversion mapping for the text
	// model): mlp.gate.weight [E, H] and gate.e_score_correction_bias [E],
	// the experts stacked mlp.experts.gate_up_proj [E, 2I, H] (gate rows,
	// then up) and down_proj [E, H, I], the shared MLP
	// mlp.shared_experts.gate_up_proj.weight [2Is, H] and down_proj.weight.
	aloneNames: func(n *naming) {
		n.modules, n.router, n.bias = []string{"mlp"}, "gate", "gate.e_score_correction_bias"
		n.stackedGateUp, n.stackedDown = "experts.gate_up_proj", "experts.down_proj"
		n.sharedGateUp, n.sharedDown = "gate_up_proj.weight", "down_proj.weight"
	},
	// MiniMaxM3VLTextConfig's defaults.
	defaults: map[string]any{"num_experts_per_tok": 4.0, "routed_scaling_factor": 2.0, "swiglu_alpha": 1.702, "swiglu_limit": 7.0},
	layers:   layerTypes,
	lift:     minimaxM3Lift,
	routing: func(c config, mt string, p *Plan) error {
		if err := biasedSigmoid("routed_scaling_factor", false, "")(c, mt, p); err != nil {
			return err
		}
		alpha, err := c.float("swiglu_alpha", 1.702)
		if err != nil {
			return err
		}
		limit, err := c.float("swiglu_limit", 7)
		if err != nil {
			return err
		}
		p.Act = layout.Activation{Alpha: alpha, Limit: limit, UpOffset: 1}
		return p.Act.Check()
	},
}

// minimaxM3Lift turns the hub's moe_layer_freq (1 = MoE) into
// mlp_layer_types where the config has no mlp_layer_types, as
// MiniMaxM3VLTextConfig does.
func minimaxM3Lift(c config) (config, error) {
	if c.has("mlp_layer_types") || !c.has("moe_layer_freq") {
		return c, nil
	}
	v, _ := c.get("moe_layer_freq")
	freq, ok := v.([]any)
	if !ok {
		return c, c.errorf("moe_layer_freq", "want a list of 0 and 1, got %s", describe(v))
	}
	types := make([]any, len(freq))
	for i, f := range freq {
		switch f {
		case 0.0, false:
			types[i] = "dense"
		case 1.0, true:
			types[i] = "sparse"
		default:
			return c, fmt.Errorf("config.json: moe_layer_freq[%d] = %s (want 0 or 1)", i, describe(f))
		}
	}
	c.m["mlp_layer_types"] = types
	return c, nil
}
