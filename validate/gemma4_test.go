package validate

import (
	"context"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/judge"
)

// TestGemma4GoldensNeedEveryPart: the CPU reference of transformers'
// Gemma 4 checkpoints (bare, in the multimodal wrapper and DiffusionGemma's
// decoder) matches HF's
// goldens only with all of the layer's parts: the two inputs (the router's
// scale-free RMSNorm times router.scale times H^-1/2, the experts'
// pre_feedforward_layernorm_2), the per-expert scale and GeGLU. Each part
// dropped in turn moves it far off the goldens; so each part is one the
// goldens can check.
func TestGemma4GoldensNeedEveryPart(t *testing.T) {
	type edit struct {
		name string
		f    func(p *family.Plan, l *family.Layer)
	}
	edits := []edit{
		{"as planned", func(*family.Plan, *family.Layer) {}},
		{"experts read the residual", func(_ *family.Plan, l *family.Layer) { l.ExpertInputNorm, l.RouterInputScale = "", "" }},
		{"no per-expert scale", func(_ *family.Plan, l *family.Layer) { l.ExpertScale = "" }},
		{"SwiGLU", func(p *family.Plan, _ *family.Layer) { p.Act = layout.Activation{} }},
	}
	for _, fx := range []string{"gemma4-text", "gemma4", "diffusion-gemma"} {
		for _, e := range edits {
			t.Run(fx+"/"+e.name, func(t *testing.T) {
				src, ck, plan := openFixture(t, fx)
				if len(plan.Layers) != 3 || plan.InputNormEps != 1e-6 || plan.Act != layout.GeGLUTanh() {
					t.Fatalf("plan: %d layers, eps %g, activation %+v", len(plan.Layers), plan.InputNormEps, plan.Act)
				}
				worst, idsEqual := 0.0, true
				for i := range plan.Layers {
					p, l := *plan, plan.Layers[i]
					g := goldenOf(t, src, &p, &l)
					e.f(&p, &l)
					ref, err := cpuref.ReferenceLayer(context.Background(), ck, &p, &l, g.X, g.T, cpuref.RefOptions{Workers: 2})
					if err != nil {
						t.Fatal(err)
					}
					worst = max(worst, judge.Compare(ref.Y, g.Y).RelL2)
					idsEqual = idsEqual && slices.Equal(ref.Routing.IDs, g.IDs)
				}
				t.Logf("worst rel_l2 against HF %.3g, routing equal %v", worst, idsEqual)
				if e.name == "as planned" {
					// HF's float32 against a float64-accumulating reference
					// differ by rounding alone (3.4e-7 seen); 1e-6 leaves room
					// for that and none for a wrong part's 0.1 or more.
					if worst > 1e-6 || !idsEqual {
						t.Fatalf("as planned: rel_l2 %.3g, routing equal %v", worst, idsEqual)
					}
				} else if worst < 0.05 {
					t.Fatalf("%s: rel_l2 only %.3g: the goldens do not see this part", e.name, worst)
				}
			})
		}
	}
}
