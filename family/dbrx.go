package family

import (
	"fmt"
	"maps"

	"github.com/moeprep/moeprep/moe"
)

// dbrx is Databricks' DBRX (DbrxFFN, transformers 5.17). Every block is
// MoE: transformer.blocks.L.ffn with the router ffn.router.layer [E,H] and
// the experts flattened on disk, ffn.experts.mlp.{w1, v1, w2} [E*I, H] (no
// ".weight"): expert e's gate and up are rows e*I..(e+1)*I-1 of w1 and v1,
// and the same rows of w2 are its down projection transposed (DbrxExpertGLU
// computes (act(x w1_e^T) * x v1_e^T) w2_e). Its config keeps the sizes
// under ffn_config (ffn_hidden_size = I, moe_num_experts, moe_top_k) and
// says d_model and n_layers for hidden_size and num_hidden_layers.
//
// Routing (DbrxFFN.route_tokens_to_experts): softmax of the logits, top-k,
// divided by the moe_normalize_expert_weights-norm of the k weights: 1 (the
// default) renormalises, null leaves them; another p is refused. The
// activation is ffn_act_fn's name, silu (SwiGLU) by default; another is
// refused. No shared expert, no scaling factor.
var dbrx = &spec{
	name: "dbrx",
	names: naming{layers: "transformer.blocks.", modules: []string{"ffn"}, experts: "experts", router: "router.layer",
		flat: [3]string{"experts.mlp.w1", "experts.mlp.v1", "experts.mlp.w2"}},
	keys: configKeys{
		intermediate: "ffn_hidden_size",
		numExperts:   []string{"moe_num_experts"},
		topK:         "moe_top_k",
	},
	layers: everyLayer,
	// DbrxFFNConfig's defaults, lifted from ffn_config with the sizes.
	defaults:     map[string]any{"moe_num_experts": 4.0, "moe_top_k": 1.0},
	lift:         dbrxLift,
	routing:      dbrxRouting,
	transformers: TransformersForm{AsStored: true, Why: "DbrxExpertGLU holds experts.mlp.w1, v1 and w2 [E*I, H], as saved"},
}

// dbrxLift reads DbrxConfig's keys as the planner's: d_model, n_layers and
// ffn_config's sizes (a top-level key of the same meaning must agree).
func dbrxLift(c config) (config, error) {
	m := maps.Clone(c.m)
	lift := func(from config, key, to string) error {
		v, ok := from.get(key)
		if !ok {
			return nil
		}
		if w, dup := c.get(to); dup && to != key && fmt.Sprint(w) != fmt.Sprint(v) {
			return fmt.Errorf("config.json: %s%s=%v and %s=%v disagree", from.at, key, v, to, w)
		}
		m[to] = v
		return nil
	}
	if err := lift(c, "d_model", "hidden_size"); err != nil {
		return c, err
	}
	if err := lift(c, "n_layers", "num_hidden_layers"); err != nil {
		return c, err
	}
	ffn, ok, err := c.object("ffn_config")
	if err != nil || !ok {
		return config{m: m}, err
	}
	for _, key := range []string{"ffn_hidden_size", "moe_num_experts", "moe_top_k"} {
		if err := lift(ffn, key, key); err != nil {
			return c, err
		}
	}
	if h, ok := ffn.get("hidden_size"); ok && fmt.Sprint(h) != fmt.Sprint(m["hidden_size"]) {
		return c, fmt.Errorf("config.json: ffn_config.hidden_size=%v but d_model=%v", h, m["hidden_size"])
	}
	return config{m: m}, nil
}

func dbrxRouting(c config, _ string, p *Plan) error {
	p.Scoring, p.NormTopKProb = moe.Softmax, true
	ffn, ok, err := c.object("ffn_config")
	if err != nil || !ok {
		return err
	}
	if v, present := ffn.m["moe_normalize_expert_weights"]; present && v == nil {
		p.NormTopKProb = false // JSON null: transformers leaves the top-k weights as they are
	} else if norm, err := ffn.float("moe_normalize_expert_weights", 1); err != nil {
		return err
	} else if norm != 1 {
		return fmt.Errorf("config.json: ffn_config.moe_normalize_expert_weights=%v is not supported (1 renormalises the top-k weights, null leaves them; another p-norm is not carried)", norm)
	}
	if act, ok, err := ffn.object("ffn_act_fn"); err != nil {
		return err
	} else if ok {
		if name, err := act.str("name", "silu"); err != nil {
			return err
		} else if name != "silu" {
			return fmt.Errorf("config.json: ffn_config.ffn_act_fn.name=%q is not supported (the experts' activation must be silu)", name)
		}
	}
	return nil
}
