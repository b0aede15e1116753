package validate

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/judge"
)

// TestAsStoredValidates: an output of --layout transformers whose experts
// are stored as SRC stores them (aria, DBRX, gpt-oss in bf16 and MXFP4,
// LongCat-Flash's per-expert tensors, DeepSeek-V3's FP8 experts) validates: every MoE layer's reference on DST equals
// SRC's bit for bit, every expert exercised, against the golden too, and
// the byte proof holds every tensor to SRC's. One changed element of one
// expert of layer 1 then fails that layer's rows, and the byte proof.
func TestAsStoredValidates(t *testing.T) {
	for _, tc := range []struct {
		dir, tensor string
		experts     int // routed experts of the layer
		of          int // experts in the tensor: 1 where it is expert 3's own
	}{
		{"gpt-oss", "model.layers.1.mlp.experts.down_proj", 8, 8},
		{"gpt-oss-mxfp4", "model.layers.1.mlp.experts.down_proj_blocks", 8, 8},
		{"dbrx", "transformer.blocks.1.ffn.experts.mlp.w2", 8, 8},
		{"aria", "language_model.model.layers.1.mlp.experts.fc2.weight", 8, 8},
		{"longcat-flash", "model.layers.1.mlp.experts.3.down_proj.weight", 8, 1},
		// FP8 experts are written as stored under every family's form.
		{"deepseek-v3-fp8", "model.layers.1.mlp.experts.3.down_proj.weight", 16, 1},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			src := filepath.Join(hfFixtures, tc.dir)
			dst := convertInto(t, src, convert.Options{Layout: layout.Transformers})
			opts := Options{Src: src, Dst: dst, Seed: 3, Tokens: 32, Golden: src}
			rep := runPass(t, opts, "the clean as-stored output fails")
			if rep.Bytes == nil || !rep.Bytes.Pass {
				t.Fatalf("no passing byte proof: %+v", rep.Bytes)
			}
			seen := map[string]int{}
			for _, r := range rep.Rows {
				seen[r.Check]++
				if (r.Check == judge.StoredVsReference || r.Check == judge.StoredCoverage) && (r.MaxAbs != 0 || r.ExpertsUsed != tc.experts) {
					t.Errorf("layer %d %s: max abs %g, %d experts used; want 0 and %d", r.Layer, r.Check, r.MaxAbs, r.ExpertsUsed, tc.experts)
				}
			}
			for _, c := range []string{judge.StoredVsReference, judge.StoredCoverage, judge.StoredVsGolden, judge.ReferenceVsGolden} {
				if seen[c] != 2 {
					t.Errorf("%d %s rows, want one a MoE layer (2)", seen[c], c)
				}
			}
			// One element of expert 3, in the form SRC stores it: its
			// first byte (DBRX's flat [E*I, H] too holds expert 3 from the
			// fourth eighth on).
			rewriteTensor(t, dst, tc.tensor, func(raw []byte, _ []int64) {
				off := 0
				if tc.of > 1 {
					off = 3 * len(raw) / tc.of
				}
				raw[off+1] ^= 0x40 // bf16: an exponent bit; U8 MXFP4 blocks: one FP4 value
				raw[off] ^= 0x77
			})
			opts.Golden = ""
			for _, b := range []BytesMode{BytesOff, BytesAuto} {
				opts.Bytes = b
				rep := runFail(t, opts, "bytes "+string(b)+": a changed expert")
				failed := slices.ContainsFunc(rep.Rows, func(r LayerResult) bool {
					return r.Layer == 1 && r.Check == judge.StoredCoverage && !r.Pass
				})
				if !failed {
					t.Errorf("bytes %v: layer 1's stored-coverage row passes", b)
				}
				for _, r := range rep.Rows {
					if r.Layer == 0 && !r.Pass {
						t.Errorf("bytes %v: layer 0 (untouched) fails %s", b, r.Check)
					}
				}
				if b == BytesAuto && (rep.Bytes == nil || rep.Bytes.Pass) {
					t.Errorf("the byte proof passes a changed expert")
				}
			}
		})
	}
}

// TestExpertsModuleProven: --layout transformers puts Step-3.7's stacks
// under mlp, where transformers 5 holds them (the checkpoint says moe), and
// records it as experts_module; the output validates. A contract that
// names another module fails, in the byte proof alone too, and says why.
func TestExpertsModuleProven(t *testing.T) {
	src := filepath.Join(hfFixtures, "step3p7")
	dst := convertInto(t, src, convert.Options{Layout: layout.Transformers})
	runPass(t, Options{Src: src, Dst: dst, Seed: 3, Tokens: 16}, "step3p7 --layout transformers")
	editContract(t, dst, func(c map[string]any) {
		if c["experts_module"] != "mlp" {
			t.Fatalf("experts_module %v, want mlp", c["experts_module"])
		}
		c["experts_module"] = "moe"
	})
	for _, b := range []BytesMode{BytesAuto, BytesOnly} {
		rep := runFail(t, Options{Src: src, Dst: dst, Seed: 3, Tokens: 16, Bytes: b}, "bytes "+string(b)+": a forged experts_module")
		testkit.ErrorContains(t, rep.Err(), "experts_module", "bytes "+string(b)+": a forged experts_module")
	}
}
