package family_test

import (
	"context"
	"fmt"
	"github.com/moeprep/moeprep/layout"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/moe"
)

// synthPlanSpec is synthPlan with the preset's spec changed first.
func synthPlanSpec(t *testing.T, preset string, mod func(*fixtures.SynthSpec), edit func(cfg map[string]any)) (*family.Plan, error) {
	t.Helper()
	spec, err := fixtures.PresetSpec(preset)
	if err != nil {
		t.Fatal(err)
	}
	if mod != nil {
		mod(&spec)
	}
	if spec, err = spec.Normalize(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "ck")
	if err := fixtures.Synth(context.Background(), dir, spec, nil); err != nil {
		t.Fatal(err)
	}
	return planEditedDir(t, dir, edit)
}

// The families issue 30 adds last plan their synth checkpoints with the
// routing, layers and names transformers 5.17's modeling code uses.
func TestTextFamiliesPlan(t *testing.T) {
	cases := []struct {
		preset, family string
		scoring        moe.Scoring
		groups, keep   int
		k, e, shared   int
		rsf            float64
		norm           bool
		moeLayers      string
		down3, router  string // layer 1's expert 3 down projection and router
		sharedDown     string // layer 1's shared down projection ("" : none)
	}{
		{"small-mellum", "mellum", moe.Softmax, 1, 1, 2, 8, 0, 1, true, "[1 2]",
			"model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.gate.weight", ""},
		{"small-granitemoehybrid", "granitemoehybrid", moe.Softmax, 1, 1, 2, 8, 2, 1, true, "[0 1]",
			"model.layers.1.block_sparse_moe.output_linear.weight[3]", "model.layers.1.block_sparse_moe.router.layer.weight",
			"model.layers.1.shared_mlp.output_linear.weight"},
		{"small-axk1", "axk1", moe.Sigmoid, 4, 2, 4, 16, 1, 2.5, true, "[1 2]",
			"model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.gate.weight",
			"model.layers.1.mlp.shared_experts.down_proj.weight"},
		{"small-axk2", "axk2", moe.Sigmoid, 1, 1, 4, 16, 1, 2.5, true, "[1 2]",
			"model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.gate.weight",
			"model.layers.1.mlp.shared_experts.down_proj.weight"},
	}
	for _, c := range cases {
		t.Run(c.preset, func(t *testing.T) {
			p, err := synthPlan(t, c.preset, nil)
			if err != nil {
				t.Fatal(err)
			}
			if p.Family != c.family || p.Scoring != c.scoring || p.NGroup != c.groups || p.TopKGroup != c.keep ||
				p.TopK != c.k || p.NumExperts != c.e || p.NumSharedExperts != c.shared ||
				p.RoutedScalingFactor != c.rsf || p.NormTopKProb != c.norm || p.SharedGated {
				t.Errorf("plan: %s %s groups %d/%d top-%d of %d, %d shared, rsf %g, norm %v, gated %v", p.Family, p.Scoring,
					p.TopKGroup, p.NGroup, p.TopK, p.NumExperts, p.NumSharedExperts, p.RoutedScalingFactor, p.NormTopKProb, p.SharedGated)
			}
			var idx []int
			for _, l := range p.Layers {
				idx = append(idx, l.Index)
			}
			if got := fmt.Sprint(idx); got != c.moeLayers {
				t.Errorf("MoE layers %s, want %s", got, c.moeLayers)
			}
			l := p.Layers[len(p.Layers)-2]
			if l.Index != 1 {
				l = p.Layers[len(p.Layers)-1]
			}
			if got := l.Experts[3].Weight(layout.ProjDown); !strings.HasPrefix(got, c.down3) {
				t.Errorf("expert 3 down = %s, want %s", got, c.down3)
			}
			if l.Router != c.router {
				t.Errorf("router = %s, want %s", l.Router, c.router)
			}
			switch {
			case c.sharedDown == "" && l.Shared != nil:
				t.Errorf("shared expert %+v, want none", l.Shared)
			case c.sharedDown != "" && (l.Shared == nil || !strings.HasPrefix(l.Shared.Weight(layout.ProjDown), c.sharedDown)):
				t.Errorf("shared expert %+v, want down %s", l.Shared, c.sharedDown)
			}
		})
	}
}

// Config options the new families read: each changes the plan as
// transformers' classes would, or is refused in one line.
func TestTextFamiliesConfig(t *testing.T) {
	layers := func(p *family.Plan) string {
		var idx []int
		for _, l := range p.Layers {
			idx = append(idx, l.Index)
		}
		return fmt.Sprint(idx)
	}
	cases := []struct {
		name, preset string
		mod          func(*fixtures.SynthSpec)
		edit         func(map[string]any)
		want         string // error substring, or "=" + what check reports
		check        func(*family.Plan) string
	}{
		{"mellum without mlp_layer_types is all sparse", "small-mellum", func(s *fixtures.SynthSpec) { s.DenseLayers = 0 },
			func(c map[string]any) { delete(c, "mlp_layer_types") },
			"=[0 1 2]", layers},
		{"mellum norm_topk_prob false", "small-mellum", nil, func(c map[string]any) { c["norm_topk_prob"] = false },
			"=false", func(p *family.Plan) string { return fmt.Sprint(p.NormTopKProb) }},
		{"mellum norm_topk_prob null is the default", "small-mellum", nil, func(c map[string]any) { c["norm_topk_prob"] = nil },
			"=true", func(p *family.Plan) string { return fmt.Sprint(p.NormTopKProb) }},
		{"mellum bad layer type", "small-mellum", nil, func(c map[string]any) { c["mlp_layer_types"] = []any{"dense", "moe", "sparse"} },
			`mlp_layer_types[1] = "moe"`, nil},
		{"granitemoehybrid dense model", "small-granitemoehybrid", nil, func(c map[string]any) { c["num_local_experts"] = 0.0 },
			"num_local_experts=0: this granitemoehybrid model is dense", nil},
		{"granitemoehybrid shared width not a multiple of I", "small-granitemoehybrid",
			func(s *fixtures.SynthSpec) { s.SharedIntermediate, s.SharedExperts = 48, 1 }, nil,
			"=1 48", func(p *family.Plan) string { return fmt.Sprint(p.NumSharedExperts, " ", p.SharedIntermediateSize) }},
		{"axk1 without group keys takes AXK1Config's 4 of 8", "small-axk1", nil,
			func(c map[string]any) { delete(c, "n_group"); delete(c, "topk_group") },
			"=4 of 8", func(p *family.Plan) string { return fmt.Sprint(p.TopKGroup, " of ", p.NGroup) }},
		{"axk1 first_k_dense_replace 2", "small-axk1", func(s *fixtures.SynthSpec) { s.DenseLayers = 2 }, nil, "=[2]", layers},
		{"axk1 with a DeepSeek-style MTP layer", "small-axk1", func(s *fixtures.SynthSpec) { s.MTPLayers = 1 }, nil, "=[1 2 3]", layers},
		{"axk2 with a DeepSeek-style MTP layer", "small-axk2", func(s *fixtures.SynthSpec) { s.MTPLayers = 1 }, nil, "=[1 2 3]", layers},
		{"axk1 MTP layer beyond num_nextn_predict_layers", "small-axk1", func(s *fixtures.SynthSpec) { s.MTPLayers = 1 },
			func(c map[string]any) { c["num_nextn_predict_layers"] = 0.0 }, "num_nextn_predict_layers=0", nil},
		{"axk1 layers disagreeing with the tensors", "small-axk1", nil, func(c map[string]any) { c["first_k_dense_replace"] = 2.0 },
			"layer 1: dense by config.json but holds MoE tensor", nil},
		{"axk2 grouped routing", "small-axk2", nil, func(c map[string]any) { c["n_group"], c["topk_group"] = 4.0, 2.0 },
			"n_group=4: A.X-K2's grouped router masks the dropped groups' scores to 0, not -inf", nil},
		{"axk2 n_group 1 is ungrouped", "small-axk2", nil, func(c map[string]any) { c["n_group"], c["topk_group"] = 1.0, 1.0 },
			"=1", func(p *family.Plan) string { return fmt.Sprint(p.NGroup) }},
		{"axk2 hub config: layers from first_k_dense_replace and moe_layer_freq", "small-axk2",
			func(s *fixtures.SynthSpec) { s.DenseLayers = 2 }, func(c map[string]any) {
				delete(c, "mlp_layer_types")
				c["first_k_dense_replace"], c["moe_layer_freq"] = 1.0, 2.0
			}, "=[2]", layers},
		{"axk2 hub config without either key: all but the first", "small-axk2", nil, func(c map[string]any) { delete(c, "mlp_layer_types") },
			"=[1 2]", layers},
		{"axk2 no rsf key takes AXK2Config's 2.5", "small-axk2", nil, func(c map[string]any) { delete(c, "routed_scaling_factor") },
			"=2.5", func(p *family.Plan) string { return fmt.Sprint(p.RoutedScalingFactor) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := synthPlanSpec(t, c.preset, c.mod, c.edit)
			if want, ok := strings.CutPrefix(c.want, "="); ok {
				if err != nil {
					t.Fatal(err)
				}
				if got := c.check(p); got != want {
					t.Errorf("got %s, want %s", got, want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %v, want one line containing %q", err, c.want)
			}
		})
	}
}

// The model types issue 30 looked at and moeprep does not plan say why in
// one line naming the model type, from a bare config and from a wrapper
// config that nests its text model.
func TestTextFamiliesRefused(t *testing.T) {
	for mt, want := range map[string]string{
		"zaya":                  "skip expert",
		"doge":                  "embedding rows",
		"openai_privacy_filter": "token classifier",
		"switch_transformers":   "encoder-decoder",
		"nllb_moe":              "encoder-decoder",
		"vitpose":               "not routed MoE experts",
		"vitpose_backbone":      "not routed MoE experts",
		"bamba":                 "no MoE experts",
		"evolla":                "no MoE experts",
		"pi0":                   "no MoE experts",
		"decision_transformer":  "no MoE experts",
		"jetmoe":                "attention heads",
	} {
		for _, cfg := range []map[string]any{
			{"model_type": mt},
			{"model_type": mt, "text_config": map[string]any{"model_type": "step3p5"}},
		} {
			_, err := family.Detect(cfg, nil)
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), fmt.Sprintf("%q", mt)) ||
				strings.Contains(err.Error(), "\n") {
				t.Errorf("%s: %v", mt, err)
			}
		}
	}
}

// Qwen4-Exp's wrapper holds Qwen3-Next's block under
// model.language_model.layers.L, as Qwen3.5-MoE's does: transformers'
// qwen3-5-moe fixture relabelled plans as qwen4_exp (norm_topk_prob read,
// true by default), its shared expert gated per token.
func TestQwen4ExpWrapper(t *testing.T) {
	relabel := func(norm any) func(map[string]any) {
		return func(c map[string]any) {
			c["model_type"] = "qwen4_exp"
			text := c["text_config"].(map[string]any)
			text["model_type"] = "qwen4_exp_text"
			text["norm_topk_prob"] = norm
		}
	}
	for _, tc := range []struct {
		norm any
		want bool
	}{{nil, true}, {true, true}, {false, false}} {
		p, err := planEdited(t, "qwen3-5-moe", relabel(tc.norm))
		if err != nil {
			t.Fatal(err)
		}
		if p.Family != "qwen4_exp" || p.ModelType != "qwen4_exp_text" || p.Wrapper == nil || p.Wrapper.ModelType != "qwen4_exp" ||
			p.Wrapper.Layers != "model.language_model.layers." || p.NormTopKProb != tc.want || !p.SharedGated ||
			p.NumExperts != 8 || p.TopK != 2 || p.SharedIntermediateSize != 48 || len(p.Layers) != 2 ||
			p.Layers[1].Router != "model.language_model.layers.1.mlp.gate.weight" ||
			p.Layers[1].SharedGate != "model.language_model.layers.1.mlp.shared_expert_gate.weight" {
			t.Errorf("norm_topk_prob %v: plan %s (%s) wrapper %+v norm %v gated %v, %d of %d, shared %d, layer 1 router %s gate %s",
				tc.norm, p.Family, p.ModelType, p.Wrapper, p.NormTopKProb, p.SharedGated, p.TopK, p.NumExperts,
				p.SharedIntermediateSize, p.Layers[1].Router, p.Layers[1].SharedGate)
		}
	}
	// a bare text config is planned only inside its wrapper, as Qwen3.5's
	if _, err := family.Detect(map[string]any{"model_type": "qwen4_exp_text"}, nil); err == nil {
		t.Error("a bare qwen4_exp_text config planned")
	}
}
