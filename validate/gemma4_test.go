package validate

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/fixtures/hf"
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
	// Every fixture whose goldens measure the decoder layer's MoE block:
	// Gemma 4 bare, in its multimodal wrapper and DiffusionGemma's decoder.
	atLayer := hf.Names(func(f hf.Fixture) bool { return f.Golden == hf.DecoderLayer })
	if len(atLayer) < 3 {
		t.Fatalf("the fixtures index has %d fixtures with decoder-layer goldens, want at least Gemma 4's three: %v", len(atLayer), atLayer)
	}
	for _, fx := range atLayer {
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
					ref := goldenRef(t, ck, &p, &l, g, cpuref.RefOptions{Workers: 2})
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

// TestGemma4TamperedInputs: DST carries Gemma 4's router scale, per-expert
// scale and experts' input norm byte for byte, and the fused path reads
// DST's own: one value of any of them doubled or halved fails the layer's numbers
// with the byte proof off, and the byte proof alone.
func TestGemma4TamperedInputs(t *testing.T) {
	src := filepath.Join(hfFixtures, "gemma4-text")
	for _, name := range []string{"model.layers.1.router.scale", "model.layers.1.router.per_expert_scale",
		"model.layers.1.pre_feedforward_layernorm_2.weight"} {
		t.Run(name, func(t *testing.T) {
			dst := convertInto(t, src, convert.Options{})
			rewriteTensor(t, dst, name, func(raw []byte, _ []int64) {
				raw[0] ^= 0x80 // bf16 element 0's lowest exponent bit: twice or half the value
			})
			for _, bytes := range []BytesMode{BytesOff, BytesOnly} {
				rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 1, Bytes: bytes})
				if err == nil {
					err = rep.Err()
				}
				if err == nil {
					t.Fatalf("bytes %s: a changed %s passed", bytes, name)
				}
				t.Logf("bytes %s: %v", bytes, firstLine(err.Error()))
			}
		})
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
