package family

import (
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/moeprep/moeprep/layout"
)

// step3p5 is StepFun's Step-3.5/3.7 text model (Step3p7SparseMoeBlock,
// transformers 5.17; model_type step3p5, planned bare or inside the
// step3p7 wrapper). transformers' step3p7 mapping reads, and writes back on
// save, the hub's layout: model.layers.L.moe.{gate.weight [E, H],
// router_bias [E] (the correction bias), gate_proj.weight and
// up_proj.weight [E, I, H], down_proj.weight [E, H, I]} (experts stacked one
// tensor per projection, planned as views) and the shared MLP beside the
// MoE module, model.layers.L.share_expert.*_proj of share_expert_dim.
//
// Step3p7TopKRouter: s = sigmoid(logits), ids = top-k of s + bias (no
// groups), w = s[ids] / sum (no epsilon; moeprep adds 1e-20, nothing next
// to a sum of sigmoids); the block multiplies the routed sum by
// moe_router_scaling_factor and adds the shared MLP: fusable where the
// activations agree. Activation: act(g) capped after silu, min(silu(g), L)
// * clamp(u, -L, L), with L per layer: swiglu_limits[L] for the routed
// experts and swiglu_limits_shared[L] for the shared MLP, 0 or null meaning
// none (the hub's Step-3.7-Flash clamps layers 43-44 only, routed 7, shared
// 16). MoE layers: mlp_layer_types "sparse", else the hub's
// moe_layers_enum, else every layer from 3. The hub's per-layer lists carry
// num_nextn_predict_layers trailing MTP entries, which transformers trims
// (as stepLift does); the MTP layers' tensors are carried.
var step3p5 = &spec{
	name: "step3p5",
	names: naming{layers: "model.layers.", modules: []string{"moe"}, proj: hubProj, router: "gate", bias: "router_bias",
		shared: "share_expert", sharedAtLayer: true,
		stackedProj: [3]string{"gate_proj.weight", "up_proj.weight", "down_proj.weight"}},
	keys: configKeys{
		intermediate:  "moe_intermediate_size",
		numExperts:    []string{"n_routed_experts", "moe_num_experts"},
		sharedFixed:   1,
		sharedSize:    "share_expert_dim",
		sharedIfSized: true,
		denseFixed:    3,
	},
	layers:       layerTypes,
	defaults:     map[string]any{"moe_router_scaling_factor": 1.0, "num_experts_per_tok": 8.0},
	lift:         stepLift,
	routing:      stepRouting,
	transformers: TransformersForm{Module: "mlp", Why: "transformers 5 renames the checkpoint's moe module to mlp on load"},
}

// stepLift reads the hub's legacy keys as transformers does: moe_top_k for
// num_experts_per_tok, moe_layers_enum ("3,4,...") for mlp_layer_types,
// and per-layer lists padded with num_nextn_predict_layers MTP entries
// trimmed to num_hidden_layers.
func stepLift(c config) (config, error) {
	m := maps.Clone(c.m)
	if v, ok := c.get("moe_top_k"); ok { // the hub's name; transformers maps it onto num_experts_per_tok
		m["num_experts_per_tok"] = v
	}
	n, err := c.sizeAtMost("num_hidden_layers", maxLayers, "the deepest released models have about 130")
	if err != nil {
		return c, err
	}
	for _, key := range []string{"mlp_layer_types", "swiglu_limits", "swiglu_limits_shared"} {
		if l, ok := m[key].([]any); ok && len(l) > n {
			nextn, err := c.count("num_nextn_predict_layers", 0)
			if err != nil {
				return c, err
			}
			if len(l) != n+nextn {
				return c, fmt.Errorf("config.json: %s has %d entries for num_hidden_layers=%d and num_nextn_predict_layers=%d", key, len(l), n, nextn)
			}
			m[key] = l[:n]
		}
	}
	if _, ok := m["mlp_layer_types"]; !ok {
		if v, ok := c.get("moe_layers_enum"); ok {
			types, err := stepMoELayers(v, n)
			if err != nil {
				return c, err
			}
			m["mlp_layer_types"] = types
		}
	}
	return config{m: m, at: c.at}, nil
}

// stepMoELayers turns moe_layers_enum (a comma-separated string or a list
// of layer indices) into mlp_layer_types over n layers; indices past them
// (the MTP layers) are dropped as transformers drops them.
func stepMoELayers(v any, n int) ([]any, error) {
	var items []string
	switch x := v.(type) {
	case string:
		// count before splitting: a 16 MiB string of commas would be 16 M strings
		if n := strings.Count(x, ","); n >= maxLayers*4 {
			return nil, fmt.Errorf("config.json: moe_layers_enum has %d entries", n+1)
		}
		items = strings.Split(x, ",")
	case []any:
		if len(x) > maxLayers*4 {
			return nil, fmt.Errorf("config.json: moe_layers_enum has %d entries", len(x))
		}
		for _, e := range x {
			items = append(items, fmt.Sprint(e))
		}
	default:
		return nil, fmt.Errorf("config.json: moe_layers_enum is %T, want a string or a list of layer indices", v)
	}
	types := make([]any, n)
	for i := range types {
		types[i] = "dense"
	}
	for _, it := range items {
		it = strings.TrimSpace(it)
		if it == "" {
			continue
		}
		l, err := strconv.Atoi(it)
		if err != nil || l < 0 {
			return nil, fmt.Errorf("config.json: moe_layers_enum entry %q is not a layer index", it)
		}
		if l < n {
			types[l] = "sparse"
		}
	}
	return types, nil
}

func stepRouting(c config, mt string, p *Plan) error {
	if err := biasedSigmoid("moe_router_scaling_factor", false, "")(c, mt, p); err != nil {
		return err
	}
	routed, err := stepLimits(c, "swiglu_limits", p.NumHiddenLayers)
	if err != nil {
		return err
	}
	shared, err := stepLimits(c, "swiglu_limits_shared", p.NumHiddenLayers)
	if err != nil {
		return err
	}
	// Plan.Act is SwiGLU (the unclamped layers); the clamped ones are their own.
	for l := range p.NumHiddenLayers {
		if a := layout.ClampedAfter(routed[l]); !a.SwiGLU() {
			if p.ActByLayer == nil {
				p.ActByLayer = map[int]layout.Activation{}
			}
			p.ActByLayer[l] = a
		}
		if a := layout.ClampedAfter(shared[l]); a != layout.ClampedAfter(routed[l]) {
			if p.SharedActByLayer == nil {
				p.SharedActByLayer = map[int]layout.Activation{}
			}
			p.SharedActByLayer[l] = a
		}
	}
	return nil
}

// stepLimits reads a per-layer limit list (absent: no layer clamps; null
// or 0: that layer does not).
func stepLimits(c config, key string, n int) ([]float64, error) {
	out := make([]float64, n)
	v, ok := c.get(key)
	if !ok {
		return out, nil
	}
	l, isList := v.([]any)
	if !isList || len(l) != n {
		return nil, fmt.Errorf("config.json: %s must list one limit per layer (%d), got %v", key, n, v)
	}
	for i, e := range l {
		if e == nil {
			continue
		}
		f, isNum := e.(float64)
		if !isNum || !(f >= 0) {
			return nil, fmt.Errorf("config.json: %s[%d] = %v, want a limit >= 0", key, i, e)
		}
		out[i] = f
	}
	return out, nil
}
