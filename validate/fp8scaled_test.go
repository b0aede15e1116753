package validate

import (
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/weightfmt"
)

// FP8 per-channel and per-tensor checkpoints (issue 29) at sizes and seeds
// that none of the synth presets has: convert in every layout and
// fuse-shared pass validate on the CPU, and each mutation of DST fails it.

// fp8ScaledRuns is the conversions of spec that both the CPU and the GPU
// tests validate: every layout and, with a shared expert, fuse-shared at
// --tp 2 and at --tp 1 folded into down.
func fp8ScaledRuns(spec fixtures.SynthSpec) []convert.Options {
	runs := []convert.Options{{Layout: layout.Stacked}, {Layout: layout.GateUp}, {Layout: layout.UpGate}}
	if spec.SharedExperts > 0 {
		runs = append(runs,
			convert.Options{Layout: layout.Stacked, FuseShared: true, TP: 2},
			convert.Options{Layout: layout.GateUp, FuseShared: true, TP: 1, FoldScaling: layout.FoldDown})
	}
	return runs
}

func TestFP8ScaledConversionsValidate(t *testing.T) {
	for name, spec := range fp8ScaledSpecs() {
		t.Run(name, func(t *testing.T) {
			src := synthFrom(t, fp8ScaledSpecs(), name)
			runs := fp8ScaledRuns(spec)
			if spec.SharedExperts > 0 {
				runs = append(runs, convert.Options{Layout: layout.Stacked, FuseShared: true, TP: 1, FoldScaling: layout.FoldNone})
			}
			want := quantContract{weightfmt.QuantFP8Channel, "F8_E4M3", "BF16", nil}
			if spec.DType == fixtures.DTypeFP8Tensor {
				want.quantization, want.scaleDType = weightfmt.QuantFP8Tensor, "F32"
			}
			conversionsPass(t, src, DeviceCPU, runs, func(o convert.Options, c *layout.Contract) {
				want.check(t, o, c)
				// BF16 scales fold only when asked; F32 ones by default.
				if o.FuseShared && o.FoldScaling != layout.FoldNone {
					wantFold := o.FoldScaling == layout.FoldDown || want.scaleDType == "F32"
					if c.RoutedScalingFactorFolded != wantFold {
						t.Errorf("%+v: folded %v, want %v", o, c.RoutedScalingFactorFolded, wantFold)
					}
				}
			})
		})
	}
}

// TestFP8ScaledMutationsFail: one flipped FP8 byte in one expert, two
// experts' scale rows swapped, a per-tensor scale changed, and a scale row
// of the fused shared expert changed each fail validate: the layer checks
// alone (--skip-bytes) and the whole run.
func TestFP8ScaledMutationsFail(t *testing.T) {
	fp8ScaledMutationsFail(t, DeviceCPU, BytesOff)
	fp8ScaledMutationsFail(t, DeviceCPU, BytesAuto)
}

func fp8ScaledMutations() []dstMutation {
	const prefix = "model.layers.1.mlp"
	channel := weightfmt.FP8Channel("BF16")
	tensor := weightfmt.FP8Tensor("F32")
	return []dstMutation{
		{"flipped FP8 byte in one expert", "qwen3-channel", convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.Stacked, prefix, channel)
			rewriteTensor(t, dst, n.Weight(layout.ProjDown), func(raw []byte, shape []int64) {
				e := slice(raw, shape, 4)
				i := len(e) / 3
				e[i] ^= 0x08 // the exponent's lowest bit: the weight doubles or halves
				if e[i]&0x7f == 0x7f {
					e[i] ^= 0x18
				}
			})
		}},
		{"two experts' scale rows swapped", "qwen3-channel", convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.GateUp, prefix, channel)
			rewriteTensor(t, dst, n.Get(layout.ProjGateUp, layout.RoleScale), func(raw []byte, shape []int64) {
				a, b := slice(raw, shape, 1), slice(raw, shape, 3)
				r := 5 * 2 // row 5, two bytes a BF16 scale
				a[r], a[r+1], b[r], b[r+1] = b[r], b[r+1], a[r], a[r+1]
			})
		}},
		{"a per-tensor scale changed", "qwen3-tensor", convert.Options{Layout: layout.UpGate}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.UpGate, prefix, tensor)
			rewriteTensor(t, dst, n.Get(layout.ProjDown, layout.RoleScale), func(raw []byte, shape []int64) { scaleF32(slice(raw, shape, 7), 1.25) })
		}},
		{"a per-tensor scale of the fused shared expert changed", "deepseek-v3-tensor", convert.Options{Layout: layout.Stacked, FuseShared: true, TP: 1}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.Stacked, prefix, tensor)
			rewriteTensor(t, dst, n.Get(layout.ProjUp, layout.RoleScale), func(raw []byte, shape []int64) { scaleF32(slice(raw, shape, 8+1), 0.5) })
		}},
		{"a scale row of the fused shared expert changed", "deepseek-v2-channel", convert.Options{Layout: layout.Stacked, FuseShared: true, TP: 1}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.Stacked, prefix, channel)
			rewriteTensor(t, dst, n.Get(layout.ProjDown, layout.RoleScale), func(raw []byte, shape []int64) {
				e := slice(raw, shape, 12) // the first shared slice
				scaleBF16(e[6:8], 1.5)
			})
		}},
	}
}

// fp8ScaledMutationsFail runs validate on device with the byte mode
// bytes on every mutation, or on those named only.
func fp8ScaledMutationsFail(t *testing.T, device Device, bytes BytesMode, only ...string) {
	mutationsFail(t, fp8ScaledSpecs(), fp8ScaledMutations(), device, []BytesMode{bytes}, only...)
}

// TestFP8ScaledRefusals: what moeprep cannot carry of these formats is
// refused with one line naming the reason (or the group).
func TestFP8ScaledRefusals(t *testing.T) {
	qc := func(c map[string]any) map[string]any { return c["quantization_config"].(map[string]any) }
	refusalsHold(t, fp8ScaledSpecs(), []refusal{
		{"static activation scales", "qwen3-channel", func(c map[string]any) {
			ctGroup0(c)["input_activations"].(map[string]any)["dynamic"] = false
		}, nil, false, "static activation scales (input_scale) are not carried"},
		{"a zero point", "qwen3-channel", func(c map[string]any) {
			ctGroup0(c)["weights"].(map[string]any)["symmetric"] = false
		}, nil, false, "a zero point"},
		{"routed experts ignored", "qwen3-channel", func(c map[string]any) {
			qc(c)["ignore"] = []any{"lm_head", "re:.*mlp.gate$", "re:.*experts.*"}
		}, nil, false, "the routed experts are left unquantised"},
		{"shared expert ignored but stored as FP8", "deepseek-v2-channel", func(c map[string]any) {
			qc(c)["ignore"] = []any{"lm_head", "re:.*mlp.gate$", "re:.*shared_experts.*"}
		}, nil, false, "shared_experts.gate_proj.weight dtype F8_E4M3, expected BF16, F16 or F32 (the ignore list leaves the shared expert unquantised)"},
		{"per-tensor static activations", "qwen3-tensor", func(c map[string]any) {
			qc(c)["activation_scheme"] = "static"
		}, nil, false, `activation_scheme: "static" is not supported`},
		{"another strategy", "qwen3-channel", func(c map[string]any) {
			ctGroup0(c)["weights"].(map[string]any)["strategy"] = "token"
		}, nil, false, "not carried"},
	})
}

// TestGPUFP8Scaled: on the GPU every FP8 per-channel and per-tensor
// conversion of fp8ScaledSpecs passes validate --device cuda, and every
// mutation fails it (gpuDecodedPass). The layer checks alone judge at
// gpu-bf16 (2e-2): one flipped FP8 byte or two swapped scale rows of these
// fixtures move a layer's output by ~1e-3 relative (random e4m3 codes span
// 2^-9..448, so one changed weight is small beside its row), below it; a
// changed scale of a whole weight is not, and must fail the layer checks
// on the GPU.
func TestGPUFP8Scaled(t *testing.T) {
	gpuDecodedPass(t, fp8ScaledSpecs(), fp8ScaledRuns, fp8ScaledMutations(),
		"a per-tensor scale changed", "a per-tensor scale of the fused shared expert changed")
}
