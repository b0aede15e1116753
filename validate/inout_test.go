package validate

import (
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/layout"
)

// The in-out orientation (convert --orientation in-out): every expert
// matrix stacked transposed, [in, out], its scale grid with it.

// TestInOutConversionsPass: in-out conversions of checkpoints of every
// storage the orientation takes (plain bf16, FP8 blocks with partial and
// non-square grids, FP8 per channel and per tensor, experts stored
// transposed on disk: Llama 4, gpt-oss's interleaved gate and up; stacked
// on disk: Granite, Inkling's hub layout with gate and up rows
// interleaved) in every layout, fuse-shared with shared slices and
// folding, pass validate on the CPU (the layer checks and the byte proof),
// against HF's goldens where the fixture has them.
func TestInOutConversionsPass(t *testing.T) {
	hf := []string{"deepseek-v3-fp8", "deepseek-v2-lite", "llama4-text", "gpt-oss", "granitemoe", "qwen2-moe", "deepseek-v4", "inkling-text", "inkling-mm-model"}
	runs := []convert.Options{{Orientation: layout.InOut}, {Orientation: layout.InOut, Layout: layout.GateUp},
		{Orientation: layout.InOut, Layout: layout.UpGate}}
	fuse := []convert.Options{{Orientation: layout.InOut, FuseShared: true, TP: 2, Layout: layout.GateUp},
		{Orientation: layout.InOut, FuseShared: true, TP: 1, FoldScaling: "down"}}
	check := func(o convert.Options, c *layout.Contract) {
		if c.Orientation != layout.InOut {
			t.Errorf("%+v: contract orientation %q", o, c.Orientation)
		}
	}
	for _, name := range hf {
		t.Run(name, func(t *testing.T) {
			src := filepath.Join(hfFixtures, name)
			rs := runs
			if name == "deepseek-v3-fp8" || name == "deepseek-v2-lite" || name == "deepseek-v4" {
				rs = append(rs, fuse...)
			}
			for _, o := range rs {
				_, dst := convertedPasses(t, src, src, o)
				check(o, readContract(t, dst))
			}
		})
	}
	for name, specs := range map[string]map[string]fixtures.SynthSpec{"in-out": inOutSpecs(), "fp8-scaled": fp8ScaledSpecs()} {
		for spec := range specs {
			t.Run(name+"/"+spec, func(t *testing.T) {
				src := synthFrom(t, specs, spec)
				rs := runs
				if specs[spec].SharedExperts > 0 {
					rs = append(rs, fuse...)
				}
				conversionsPass(t, src, DeviceCPU, rs, check)
			})
		}
	}
}

// TestInOutMutationsFail: an in-out DST with one expert's slice, or one
// expert's FP8 scale grid, left as the out-in bytes (the right bytes in
// the wrong order) fails validate: the layer checks and the byte proof
// each catch it.
func TestInOutMutationsFail(t *testing.T) {
	mutationsFail(t, inOutSpecs(), inOutMutations(), DeviceCPU, []BytesMode{BytesOff, BytesOnly})
}

// inOutMutations are in-out DSTs with one expert's slice or FP8 scale grid
// left as the out-in bytes.
func inOutMutations() []dstMutation {
	// untransposed writes slice e of the stack name back in out-in order.
	untransposed := func(name string, e int) func(t *testing.T, dst string) {
		return func(t *testing.T, dst string) {
			rewriteTensor(t, dst, name, func(raw []byte, shape []int64) {
				rows, cols := shape[1], shape[2]
				es := int64(len(raw)) / (shape[0] * rows * cols)
				n := rows * cols * es
				s := raw[int64(e)*n : int64(e+1)*n]
				out := make([]byte, n) // stored [rows, cols]; written as its [cols, rows] transpose
				for r := range rows {
					for c := range cols {
						copy(out[(c*rows+r)*es:(c*rows+r+1)*es], s[(r*cols+c)*es:])
					}
				}
				copy(s, out)
			})
		}
	}
	p := "model.layers.1.mlp.experts."
	return []dstMutation{
		{"a gate slice not transposed", "deepseek-v2-fp8", convert.Options{Orientation: layout.InOut}, untransposed(p+"all_gate.weight", 3)},
		{"a gate scale grid not transposed", "deepseek-v2-fp8", convert.Options{Orientation: layout.InOut}, untransposed(p+"all_gate.weight_scale_inv", 2)},
		{"a fused shared slice's down not transposed", "deepseek-v2-fp8", convert.Options{Orientation: layout.InOut, FuseShared: true, TP: 1, Layout: layout.GateUp},
			untransposed(p+"down_proj", 7)},
		{"a gate-up scale grid not transposed", "deepseek-v2-fp8", convert.Options{Orientation: layout.InOut, Layout: layout.UpGate}, untransposed(p+"up_gate_proj_scale_inv", 0)},
		{"a bf16 down slice not transposed", "qwen3-bf16", convert.Options{Orientation: layout.InOut, Layout: layout.GateUp}, untransposed(p+"down_proj", 5)},
	}
}

// TestInOutRefusals: formats packed along the row are refused in one line
// naming the rule, and the GPU, which decodes out-in rows on the device,
// refuses an in-out DST of FP8 per channel (--device auto runs it on the
// CPU, saying so); the stacks it takes as stored it transposes as they
// upload (TestGPUInOutConversions).
func TestInOutRefusals(t *testing.T) {
	for _, c := range []struct {
		specs map[string]fixtures.SynthSpec
		name  string
	}{{int4Specs(), "qwen3-channel"}, {nvfp4Specs(), "deepseek-v3-nv"}, {mxfp4Specs(), "h96-i64"}} {
		src := synthFrom(t, c.specs, c.name)
		convertRefused(t, src, convert.Options{Orientation: layout.InOut}, "along each row, so its experts have no byte-exact transpose")
	}
	src := synthFrom(t, fp8ScaledSpecs(), "qwen3-channel")
	dst := convertInto(t, src, convert.Options{Orientation: layout.InOut})
	cudaRefused(t, src, dst, "", "orientation in-out) and FP8 per-channel expert weights", "orientation in-out")
}
