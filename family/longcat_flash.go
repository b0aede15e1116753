package family

import (
	"fmt"
	"maps"
)

// longcatFlash is LongCat-Flash (LongcatFlashMoE, transformers 5.17). Each
// of its num_layers decoder layers holds two attention and two dense MLP
// sublayers (mlps.0, mlps.1, carried) and one MoE block, model.layers.L.mlp,
// whose output joins the residual after the second sublayer (a shortcut):
// num_hidden_layers counts the sublayers, so the MoE layers are the
// num_layers of them. The experts are per expert on disk (the qwen2_moe
// mapping reversed on save): mlp.experts.E.{gate,up,down}_proj.
//
// LongcatFlashTopkRouter: router.classifier [E+Z, H] scores the E routed
// experts and Z = zero_expert_num zero-compute ones; softmax in fp32 over
// all E+Z, top-k of softmax + router.e_score_correction_bias [E+Z] (F32),
// weights the unbiased softmax values times routed_scaling_factor, not
// renormalised. LongcatFlashExperts: a slot on expert E+z is the identity
// (nn.Identity): its output is the token's input times its weight.
// transformers holds gate_up_proj for all E+Z experts, so its save also
// writes gate and up for E..E+Z-1, which nothing reads: carried.
var longcatFlash = &spec{
	name:  "longcat_flash",
	names: hubLayoutNames("mlp", "router.classifier", "router.e_score_correction_bias", ""),
	keys: configKeys{
		intermediate: "expert_ffn_hidden_size",
		numExperts:   []string{"n_routed_experts", "num_local_experts"},
		topK:         "moe_topk",
	},
	layers:      everyLayer,
	softmaxBias: true,
	// LongcatFlashConfig's defaults
	defaults:     map[string]any{"routed_scaling_factor": 6.0, "zero_expert_num": 256.0, "hidden_act": "silu", "router_bias": false},
	lift:         longcatLift,
	routing:      longcatRouting,
	transformers: TransformersForm{AsStored: true, Why: "LongcatFlashExperts holds gate_up_proj [E+Z, 2I, H], gate and up rows for its Z zero-compute experts too, which moeprep's stacks do not carry; it stacks the checkpoint's own experts on load"},
}

// longcatLift reads num_layers, the decoder layers that each hold one MoE
// block, as the planner's num_hidden_layers (which LongCat-Flash spends
// on its two attention sublayers a layer).
func longcatLift(c config) (config, error) {
	n, ok := c.get("num_layers")
	if !ok {
		return c, c.missing("num_layers")
	}
	m := maps.Clone(c.m)
	m["num_hidden_layers"] = n
	return config{m: m, at: c.at}, nil
}

func longcatRouting(c config, _ string, p *Plan) error {
	var err error
	if p.ZeroExperts, err = c.count("zero_expert_num", 256); err != nil {
		return err
	}
	if p.ZeroExperts > maxZeroExperts {
		return fmt.Errorf("config.json: zero_expert_num=%d is over the limit of %d (LongCat-Flash has 256)", p.ZeroExperts, maxZeroExperts)
	}
	if act, err := c.str("hidden_act", "silu"); err != nil {
		return err
	} else if act != "silu" {
		return fmt.Errorf("config.json: hidden_act %q: moeprep computes LongCat-Flash's experts with silu (SwiGLU) only", act)
	}
	if rb, err := c.boolean("router_bias", false); err != nil {
		return err
	} else if rb {
		return fmt.Errorf("config.json: router_bias=true: LongCat-Flash's classifier bias over its routed and zero-compute rows is not carried yet")
	}
	p.NormTopKProb = false
	p.RoutedScalingFactor, err = c.float("routed_scaling_factor", 6)
	return err
}

// maxZeroExperts bounds zero_expert_num, as the routed experts are bounded:
// every one is a router row.
const maxZeroExperts = 1 << 14
