package validate

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
)

// TestTextFamilySynthValidate: issue 30's last text families, as synth
// writes them (presets small-<model_type>), convert to the stacked and
// gate-up layouts, and fuse their shared experts where the family has
// ungated ones, and each output validates on the CPU against its source,
// bytes proven. Every one of these families' shared experts is ungated, so
// each preset with shared experts is fused too (Mellum has none).
func TestTextFamilySynthValidate(t *testing.T) {
	for _, preset := range []string{"small-mellum", "small-granitemoehybrid", "small-axk1", "small-axk2"} {
		t.Run(preset, func(t *testing.T) {
			spec := cktest.Preset(t, preset)
			src := cktest.WriteSpec(t, filepath.Join(t.TempDir(), preset), spec)
			runs := []convert.Options{{}, {Layout: layout.GateUp}}
			if spec.SharedExperts > 0 {
				runs = append(runs, convert.Options{FuseShared: true, TP: 2}, convert.Options{FuseShared: true, TP: 1, Layout: layout.GateUp})
			}
			reps := conversionsPass(t, src, DeviceCPU, runs, nil)
			if len(reps) != len(runs) {
				t.Fatalf("%d reports for %d runs", len(reps), len(runs))
			}
		})
	}
}

// TestQwen4ExpGoldens: Qwen4-Exp's text block is Qwen3-Next's in Qwen3.5's
// wrapper layout, so transformers' qwen3-5-moe fixture relabelled qwen4_exp
// (norm_topk_prob true, as Qwen3.5 always renormalises) converts and
// validates against HF's goldens on the CPU.
func TestQwen4ExpGoldens(t *testing.T) {
	src := filepath.Join(t.TempDir(), "qwen4-exp")
	testkit.CopyDir(t, filepath.Join(hfFixtures, "qwen3-5-moe"), src)
	testkit.EditJSON(t, filepath.Join(src, "config.json"), func(cfg map[string]any) {
		cfg["model_type"], cfg["architectures"] = "qwen4_exp", []any{"Qwen4ExpForConditionalGeneration"}
		text := cfg["text_config"].(map[string]any)
		text["model_type"], text["norm_topk_prob"] = "qwen4_exp_text", true
	})
	dst := convertInto(t, src, convert.Options{Layout: layout.GateUp})
	rep := runPass(t, Options{Src: src, Dst: dst, Golden: filepath.Join(src, "reference"), Seed: 7, Device: DeviceCPU}, "qwen4_exp against HF's goldens")
	checks := checksRun(rep)
	if len(rep.LayersChecked) != 2 || checks["reference-vs-golden"] != 2 || checks["fused-vs-golden"] != 2 {
		t.Errorf("layers checked %v, checks %v", rep.LayersChecked, checks)
	}
}

// TestActivationsOfTheirOwn: checkpoints whose shared MLP (HY-V4) or
// layers (Step-3.7) run activations other than the contract-wide one
// validate after convert, and a contract that loses or changes one of
// them is refused naming it, before any number is compared.
func TestActivationsOfTheirOwn(t *testing.T) {
	for _, c := range []struct {
		preset string
		edit   func(c map[string]any)
		want   string
	}{
		{"small-hy-v4", func(c map[string]any) { delete(c, "shared_activation") }, "shared_activation"},
		{"small-hy-v4", func(c map[string]any) { c["activation"] = map[string]any{"limit": 0.5} }, "activation"},
		// layers[1] is layer 2, whose routed experts and shared MLP cap silu(g) at 0.05 and 0.08
		{"small-step3p5", func(c map[string]any) { delete(layerEntry(c, 1), "activation") }, "layers[1] activation"},
		{"small-step3p5", func(c map[string]any) {
			layerEntry(c, 1)["shared_activation"] = map[string]any{"limit": 0.05, "clamp_after_act": true}
		},
			"layers[1] shared_activation"},
		{"small-step3p5", func(c map[string]any) { layerEntry(c, 2)["activation"] = map[string]any{"limit": 0.05} }, "layers[2] activation"},
	} {
		t.Run(c.preset, func(t *testing.T) {
			src := cktest.WritePreset(t, c.preset)
			dst := convertInto(t, src, convert.Options{})
			opts := Options{Src: src, Dst: dst, Seed: 3}
			rep, err := Run(context.Background(), opts)
			if err != nil || rep.Failed() {
				t.Fatalf("the clean conversion: %v %v", err, rep.Err())
			}
			editContract(t, dst, c.edit)
			rep, err = Run(context.Background(), opts)
			if err == nil {
				err = rep.Err()
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("edited contract: error %v, want one naming %q", err, c.want)
			}
		})
	}
}

// layerEntry is the contract's layers[i] object.
func layerEntry(c map[string]any, i int) map[string]any {
	return c["layers"].([]any)[i].(map[string]any)
}
