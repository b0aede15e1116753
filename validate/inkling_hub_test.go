package validate

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/cpuref"
)

// TestInklingHubRewrites: inkling_text checkpoints in transformers' layout
// rewritten into Inkling's multimodal hub layout (cktest.InklingHub: each
// expert's gate rows to the even rows of w13_weight, its up rows to the
// odd) are planned to the same experts, the reference on the rewrite
// equal bit for bit to the reference on the original, and they convert in
// every layout and in-out and pass validate: inkling-text's against its
// HF goldens, and a synthetic one of other sizes (H 96, I 40: no square
// w13 slice; 6 experts, 3 shared) that no transformers run wrote.
func TestInklingHubRewrites(t *testing.T) {
	synth := synthFrom(t, map[string]fixtures.SynthSpec{"inkling": {Family: "inkling_text", Layers: 3, DenseLayers: 1,
		Hidden: 96, Intermediate: 40, Experts: 6, SharedExperts: 3, TopK: 2, Vocab: 64, Seed: 3030}}, "inkling")
	text := filepath.Join(hfFixtures, "inkling-text")
	for _, c := range []struct{ name, src, golden string }{{"inkling-text", text, text}, {"synthetic", synth, ""}} {
		t.Run(c.name, func(t *testing.T) {
			hub := cktest.InklingHub(t, c.src)
			ck, plan := cktest.OpenPlanned(t, c.src)
			hck, hplan := cktest.OpenPlanned(t, hub)
			if hplan.Wrapper == nil || hplan.Wrapper.Layers != "model.llm.layers." || len(hplan.Layers) != len(plan.Layers) {
				t.Fatalf("hub plan: wrapper %+v, %d layers (the original %d)", hplan.Wrapper, len(hplan.Layers), len(plan.Layers))
			}
			const tokens = 16
			for i := range plan.Layers {
				x := DrawX(5, plan.Layers[i].Index, tokens, plan.HiddenSize)
				want, err := cpuref.ReferenceLayer(context.Background(), ck, plan, &plan.Layers[i], x, tokens, cpuref.RefOptions{Workers: 1})
				if err != nil {
					t.Fatal(err)
				}
				got, err := cpuref.ReferenceLayer(context.Background(), hck, hplan, &hplan.Layers[i], x, tokens, cpuref.RefOptions{Workers: 1})
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got.Y, want.Y) {
					t.Errorf("layer %d: the hub layout's reference differs from the original's", plan.Layers[i].Index)
				}
			}
			for _, o := range []convert.Options{{}, {Layout: layout.GateUp}, {Layout: layout.UpGate},
				{Orientation: layout.InOut}, {Orientation: layout.InOut, Layout: layout.UpGate}} {
				convertedPasses(t, hub, c.golden, o)
			}
		})
	}
}
