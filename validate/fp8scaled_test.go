package validate

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/weightfmt"
)

// FP8 per-channel and per-tensor checkpoints (issue 29) at sizes and seeds
// that none of the synth presets has: convert in every layout and
// fuse-shared pass validate on the CPU, and each mutation of DST fails it.

func fp8ScaledSpecs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		"qwen3-channel": {Family: "qwen3_moe", Layers: 2, DenseLayers: 1, Hidden: 96, Intermediate: 48,
			Experts: 6, TopK: 2, DType: fixtures.DTypeFP8Channel, Vocab: 64, Seed: 1001},
		"deepseek-v2-channel": {Family: "deepseek_v2", Layers: 2, DenseLayers: 1, Hidden: 80, Intermediate: 24,
			Experts: 12, SharedExperts: 2, TopK: 3, RoutedScalingFactor: 1.75, DType: fixtures.DTypeFP8Channel, Vocab: 64, Seed: 1002},
		"qwen3-tensor": {Family: "qwen3_moe", Layers: 2, DenseLayers: 1, Hidden: 48, Intermediate: 40,
			Experts: 10, TopK: 3, DType: fixtures.DTypeFP8Tensor, Vocab: 64, Seed: 1003},
		"deepseek-v3-tensor": {Family: "deepseek_v3", Layers: 2, DenseLayers: 1, Hidden: 72, Intermediate: 24,
			Experts: 8, SharedExperts: 3, TopK: 2, NGroup: 2, TopKGroup: 1, RoutedScalingFactor: 2.25,
			DType: fixtures.DTypeFP8Tensor, Vocab: 64, Seed: 1004, BiasLike: "deepseek"},
	}
}

func synthFP8Scaled(t *testing.T, name string) string {
	t.Helper()
	return synthFrom(t, fp8ScaledSpecs(), name)
}

func TestFP8ScaledConversionsValidate(t *testing.T) {
	for name, spec := range fp8ScaledSpecs() {
		t.Run(name, func(t *testing.T) {
			src := synthFP8Scaled(t, name)
			runs := []convert.Options{{Layout: layout.Stacked}, {Layout: layout.GateUp}, {Layout: layout.UpGate}}
			if spec.SharedExperts > 0 {
				runs = append(runs,
					convert.Options{Layout: layout.Stacked, FuseShared: true, TP: 2},
					convert.Options{Layout: layout.GateUp, FuseShared: true, TP: 1, FoldScaling: layout.FoldDown},
					convert.Options{Layout: layout.Stacked, FuseShared: true, TP: 1, FoldScaling: layout.FoldNone})
			}
			conversionsPass(t, src, DeviceCPU, runs, func(o convert.Options, c *layout.Contract) {
				wantQ, wantS := weightfmt.QuantFP8Channel, "BF16"
				if spec.DType == fixtures.DTypeFP8Tensor {
					wantQ, wantS = weightfmt.QuantFP8Tensor, "F32"
				}
				if c.Quantization != wantQ || c.ScaleDType != wantS || len(c.WeightBlockSize) != 0 {
					t.Errorf("contract quantization %q scale_dtype %q weight_block_size %v, want %q %q none", c.Quantization, c.ScaleDType, c.WeightBlockSize, wantQ, wantS)
				}
				// BF16 scales fold only when asked; F32 ones by default.
				if o.FuseShared && o.FoldScaling != layout.FoldNone {
					wantFold := o.FoldScaling == layout.FoldDown || wantS == "F32"
					if c.RoutedScalingFactorFolded != wantFold {
						t.Errorf("%+v: folded %v, want %v", o, c.RoutedScalingFactorFolded, wantFold)
					}
				}
			})
		})
	}
}

func readContract(t *testing.T, dir string) *layout.Contract {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	c, ok, err := layout.ReadContract(cfg)
	if err != nil || !ok {
		t.Fatalf("%s: contract: %v", dir, err)
	}
	return c
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
			rewriteTensor(t, dst, n.Down, func(raw []byte, shape []int64) {
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
			rewriteTensor(t, dst, n.GateUpScale, func(raw []byte, shape []int64) {
				a, b := slice(raw, shape, 1), slice(raw, shape, 3)
				r := 5 * 2 // row 5, two bytes a BF16 scale
				a[r], a[r+1], b[r], b[r+1] = b[r], b[r+1], a[r], a[r+1]
			})
		}},
		{"a per-tensor scale changed", "qwen3-tensor", convert.Options{Layout: layout.UpGate}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.UpGate, prefix, tensor)
			rewriteTensor(t, dst, n.DownScale, func(raw []byte, shape []int64) { scaleF32(slice(raw, shape, 7), 1.25) })
		}},
		{"a per-tensor scale of the fused shared expert changed", "deepseek-v3-tensor", convert.Options{Layout: layout.Stacked, FuseShared: true, TP: 1}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.Stacked, prefix, tensor)
			rewriteTensor(t, dst, n.UpScale, func(raw []byte, shape []int64) { scaleF32(slice(raw, shape, 8+1), 0.5) })
		}},
		{"a scale row of the fused shared expert changed", "deepseek-v2-channel", convert.Options{Layout: layout.Stacked, FuseShared: true, TP: 1}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.Stacked, prefix, channel)
			rewriteTensor(t, dst, n.DownScale, func(raw []byte, shape []int64) {
				e := slice(raw, shape, 12) // the first shared slice
				v := numfmt.BF16ToF32(binary.LittleEndian.Uint16(e[6:]))
				binary.LittleEndian.PutUint16(e[6:], numfmt.F32ToBF16(v*1.5))
			})
		}},
	}
}

// fp8ScaledMutationsFail runs validate on device with the byte mode
// bytes on every mutation, or on those named only.
func fp8ScaledMutationsFail(t *testing.T, device, bytes string, only ...string) {
	mutationsFail(t, fp8ScaledSpecs(), fp8ScaledMutations(), device, []string{bytes}, only...)
}

// TestFP8ScaledRefusals: what moeprep cannot carry of these formats is
// refused with one line naming the reason (or the group).
func TestFP8ScaledRefusals(t *testing.T) {
	group := func(c map[string]any) map[string]any {
		return c["quantization_config"].(map[string]any)["config_groups"].(map[string]any)["group_0"].(map[string]any)
	}
	cases := []struct {
		name, fixture string
		edit          func(c map[string]any)
		want          string
	}{
		{"static activation scales", "qwen3-channel", func(c map[string]any) {
			group(c)["input_activations"].(map[string]any)["dynamic"] = false
		}, "static activation scales (input_scale) are not carried"},
		{"a zero point", "qwen3-channel", func(c map[string]any) {
			group(c)["weights"].(map[string]any)["symmetric"] = false
		}, "a zero point"},
		{"routed experts ignored", "qwen3-channel", func(c map[string]any) {
			c["quantization_config"].(map[string]any)["ignore"] = []any{"lm_head", "re:.*mlp.gate$", "re:.*experts.*"}
		}, "the routed experts are left unquantised"},
		{"shared expert ignored", "deepseek-v2-channel", func(c map[string]any) {
			c["quantization_config"].(map[string]any)["ignore"] = []any{"lm_head", "re:.*mlp.gate$", "re:.*shared_experts.*"}
		}, "the shared expert is not stored like the routed experts"},
		{"per-tensor static activations", "qwen3-tensor", func(c map[string]any) {
			c["quantization_config"].(map[string]any)["activation_scheme"] = "static"
		}, `activation_scheme: "static" is not supported`},
		{"another strategy", "qwen3-channel", func(c map[string]any) {
			group(c)["weights"].(map[string]any)["strategy"] = "token"
		}, "not carried"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := synthFP8Scaled(t, tc.fixture)
			testkit.EditJSON(t, filepath.Join(src, "config.json"), tc.edit)
			_, err := convert.Convert(context.Background(), convert.Options{Src: src, Dst: filepath.Join(t.TempDir(), "dst"), Layout: layout.Stacked})
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("got %v, want one line containing %q", err, tc.want)
			}
		})
	}
}

// TestFP8ScaledGPURefusal: the GPU decodes these formats to bf16, so only
// its bf16 precision runs them: --device cuda with --precision f32 or fp8
// refuses, naming the format and why, before any layer runs; --device
// auto then runs on the CPU with a note, with or without a GPU.
func TestFP8ScaledGPURefusal(t *testing.T) {
	old := cudaAvailable
	cudaAvailable = func() error { return nil } // as on a machine with a GPU
	t.Cleanup(func() { cudaAvailable = old })
	src := synthFP8Scaled(t, "qwen3-channel")
	dst := convertInto(t, src, convert.Options{Layout: layout.GateUp})
	for _, prec := range []string{PrecisionF32, PrecisionFP8} {
		_, err := Run(context.Background(), Options{Src: src, Dst: dst, Device: DeviceCUDA, GPUPrecision: prec})
		want := "FP8 per-channel expert weights (quantization fp8_channel, BF16 scales) are decoded to bf16 on the GPU, which runs them with --precision bf16 only (not " + prec + ")"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("--device cuda --precision %s: %v", prec, err)
		}
		rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Device: "auto", GPUPrecision: prec})
		if err != nil {
			t.Fatal(err)
		}
		mustPass(t, rep, "--device auto")
		if rep.Device != DeviceCPU || !strings.Contains(strings.Join(rep.Notes, "\n"), "decoded to bf16 on the GPU") {
			t.Fatalf("--device auto ran on %s, notes %q", rep.Device, rep.Notes)
		}
	}
}

// TestGPUFP8Scaled: on the GPU (bf16 precision, the gpu-bf16 tolerance)
// every FP8 per-channel and per-tensor conversion of fp8ScaledSpecs passes
// validate --device cuda, and every mutation fails it.
func TestGPUFP8Scaled(t *testing.T) {
	needGPU(t)
	for name, spec := range fp8ScaledSpecs() {
		t.Run(name, func(t *testing.T) {
			src := synthFP8Scaled(t, name)
			runs := []convert.Options{{Layout: layout.Stacked}, {Layout: layout.GateUp}, {Layout: layout.UpGate}}
			if spec.SharedExperts > 0 {
				runs = append(runs,
					convert.Options{Layout: layout.Stacked, FuseShared: true, TP: 2},
					convert.Options{Layout: layout.GateUp, FuseShared: true, TP: 1, FoldScaling: layout.FoldDown})
			}
			for i, rep := range conversionsPass(t, src, DeviceCUDA, runs, nil) {
				o := runs[i]
				worst := 0.0
				for _, r := range rep.Rows {
					if r.Tolerance.Name == "gpu-bf16" {
						worst = max(worst, r.RelL2)
					}
				}
				t.Logf("%+v: passes on the GPU, worst gpu-bf16 rel L2 %.2e", o, worst)
			}
		})
	}
	// The whole run fails every mutation (the byte proof sees each). The
	// layer checks alone judge at gpu-bf16 (2e-2): one flipped FP8 byte or
	// two swapped scale rows of these fixtures move a layer's output by
	// ~1e-3 relative (random e4m3 codes span 2^-9..448, so one changed
	// weight is small beside its row), below it; a changed scale of a
	// whole weight is not, and must fail the layer checks on the GPU.
	t.Run("mutations", func(t *testing.T) { fp8ScaledMutationsFail(t, DeviceCUDA, BytesAuto) })
	t.Run("layer checks", func(t *testing.T) {
		fp8ScaledMutationsFail(t, DeviceCUDA, BytesOff, "a per-tensor scale changed", "a per-tensor scale of the fused shared expert changed")
	})
}
