package validate

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/fixtures/hf"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/judge"
)

// TestTextModelsSavedAlone (issue 44): the text model of every supported
// wrapper saved alone by transformers 5.17 (its *ForCausalLM on the text
// config; fixtures/hf/export_text_only.py) is planned by the wrapper's text
// family, converts in two layouts (the second in-out, the layouts rotating
// over the fixtures) and fuse-shared where the family fuses, and passes
// validate against SRC and its own goldens, the fused path within float32
// rounding of transformers' output. Each text model type moeprep reads
// alone has such a fixture.
func TestTextModelsSavedAlone(t *testing.T) {
	alone := family.SupportedTextAlone()
	var fxs []hf.Fixture
	seen := map[string]bool{}
	for _, f := range hf.All() {
		if slices.Contains(alone, f.ModelType) || f.ModelType == "qwen3_omni_moe_thinker" {
			fxs = append(fxs, f)
			seen[f.ModelType] = true
		}
	}
	for _, mt := range alone {
		if !seen[mt] {
			t.Errorf("%s: no fixture of the text model saved alone", mt)
		}
	}
	lays := []layout.Layout{layout.Stacked, layout.GateUp, layout.UpGate}
	for i, f := range fxs {
		opts := []convert.Options{{Layout: lays[i%3]}, {Layout: lays[(i+1)%3], Orientation: layout.InOut}}
		if f.FuseShared {
			opts = append(opts, convert.Options{Layout: lays[(i+2)%3], FuseShared: true, TP: 4})
		}
		for _, o := range opts {
			t.Run(f.Dir+"/"+string(o.Layout)+"/"+string(o.Orientation)+map[bool]string{true: "/fuse-shared"}[o.FuseShared], func(t *testing.T) {
				src := filepath.Join(hfFixtures, f.Dir)
				dst := convertInto(t, src, o)
				rep := runPass(t, Options{Src: src, Dst: dst, Golden: src, Seed: 1}, "a text model saved alone")
				n := 0
				for _, r := range rep.Rows {
					if r.Check == judge.FusedVsGolden {
						n++
						if r.RelL2 > 2e-6 {
							t.Errorf("layer %d: fused vs golden %.3g, want float32 rounding", r.Layer, r.RelL2)
						}
					}
				}
				if n == 0 {
					t.Fatal("no fused-vs-golden row")
				}
			})
		}
	}
}
