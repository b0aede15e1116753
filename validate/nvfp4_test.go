package validate

import (
	"context"
	"encoding/binary"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/weightfmt"
)

// ModelOpt NVFP4 checkpoints (issue 29: NVIDIA's DeepSeek-R1-FP4 layout,
// NVFP4 routed and shared experts with weight_scale_2 and input_scale) at
// sizes and seeds that the small-deepseek-r1-nvfp4 preset does not use:
// convert in every layout and fuse-shared pass validate on the CPU, and
// each mutation of DST fails it.

func nvfp4Specs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		"deepseek-v3-nv": {Family: "deepseek_v3", Layers: 3, DenseLayers: 1, Hidden: 96, Intermediate: 48,
			Experts: 10, SharedExperts: 2, TopK: 3, NGroup: 2, TopKGroup: 1, RoutedScalingFactor: 2.5,
			DType: fixtures.DTypeNVFP4, Vocab: 64, Seed: 3001, BiasLike: "deepseek"},
		"qwen3-nv": {Family: "qwen3_moe", Layers: 2, DenseLayers: 1, Hidden: 80, Intermediate: 32,
			Experts: 6, TopK: 2, DType: fixtures.DTypeNVFP4, Vocab: 64, Seed: 3002},
	}
}

func synthNVFP4(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if _, err := fixtures.Write(context.Background(), dir, nvfp4Specs()[name], fixtures.Options{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestNVFP4ConversionsValidate(t *testing.T) {
	for name, spec := range nvfp4Specs() {
		t.Run(name, func(t *testing.T) {
			src := synthNVFP4(t, name)
			opts := []convert.Options{{Layout: layout.Stacked}, {Layout: layout.GateUp}, {Layout: layout.UpGate, TP: 2}}
			if spec.SharedExperts > 0 {
				opts = append(opts, convert.Options{Layout: layout.Stacked, FuseShared: true, Replicas: 1},
					convert.Options{Layout: layout.GateUp, FuseShared: true, Replicas: 2})
			}
			for _, o := range opts {
				dst := convertInto(t, src, o)
				rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 7, Device: DeviceCPU})
				if err != nil {
					t.Fatalf("%+v: %v", o, err)
				}
				mustPass(t, rep, "validate failed on a correct NVFP4 conversion")
				c := readContract(t, dst)
				if c.Quantization != weightfmt.QuantNVFP4ModelOpt || c.WeightDType != "U8" || !c.InputScales ||
					len(c.WeightBlockSize) != 2 || c.WeightBlockSize[0] != 1 || c.WeightBlockSize[1] != 16 || c.RoutedScalingFactorFolded {
					t.Errorf("%+v: contract %q %q input_scales %v block %v folded %v", o, c.Quantization, c.WeightDType, c.InputScales, c.WeightBlockSize, c.RoutedScalingFactorFolded)
				}
			}
		})
	}
}

// TestNVFP4MutationsFail: a flipped nibble in one expert, two block
// scales swapped, a global scale changed and the nibble order of a byte
// reversed each fail validate, layer checks alone and whole run.
func TestNVFP4MutationsFail(t *testing.T) {
	const prefix = "model.layers.1.mlp"
	f := weightfmt.NVFP4ModelOpt()
	cases := []struct {
		name   string
		o      convert.Options
		mutate func(t *testing.T, dst string)
	}{
		{"one flipped nibble in one expert", convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.Stacked, prefix, f)
			rewriteTensor(t, dst, n.Down, func(raw []byte, shape []int64) {
				e := slice(raw, shape, 5)
				for i := 9; ; i++ {
					if e[i]&0x7 != 0 { // a nonzero magnitude: flipping the sign changes the value
						e[i] ^= 0x8
						return
					}
				}
			})
		}},
		{"two block scales swapped", convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.GateUp, prefix, f)
			rewriteTensor(t, dst, n.GateUpScale, func(raw []byte, shape []int64) {
				e := slice(raw, shape, 2)
				for i := 7 * int(shape[2]); ; i++ {
					if e[i] != e[i+1] {
						e[i], e[i+1] = e[i+1], e[i]
						return
					}
				}
			})
		}},
		{"a global scale changed", convert.Options{Layout: layout.UpGate}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.UpGate, prefix, f)
			rewriteTensor(t, dst, n.GateUpGlobal, func(raw []byte, shape []int64) {
				v := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*7:]))
				binary.LittleEndian.PutUint32(raw[4*7:], math.Float32bits(v*1.25))
			})
		}},
		{"nibble order reversed within a byte", convert.Options{Layout: layout.Stacked, TP: 2}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.Stacked, prefix, f)
			rewriteTensor(t, dst, n.Up, func(raw []byte, shape []int64) {
				e := slice(raw, shape, 4)
				for i := 3; ; i++ {
					if e[i]&0xF != e[i]>>4 {
						e[i] = e[i]<<4 | e[i]>>4
						return
					}
				}
			})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := synthNVFP4(t, "deepseek-v3-nv")
			dst := convertInto(t, src, tc.o)
			tc.mutate(t, dst)
			for _, bytes := range []string{BytesOff, BytesAuto} {
				rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 3, Device: DeviceCPU, Bytes: bytes})
				if err != nil {
					t.Fatalf("bytes %s: the mutation made the input unusable instead of failing the check: %v", bytes, err)
				}
				if !rep.Failed() {
					t.Fatalf("bytes %s: mutation not caught", bytes)
				}
				t.Logf("bytes %s: caught: %s", bytes, strings.SplitN(rep.Err().Error(), ";", 2)[0])
			}
		})
	}
}

// TestNVFP4GPURefused: --device cuda names the format; auto runs the CPU.
func TestNVFP4GPURefused(t *testing.T) {
	src := synthNVFP4(t, "qwen3-nv")
	dst := convertInto(t, src, convert.Options{Layout: layout.Stacked})
	_, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 3, Device: DeviceCUDA})
	if err == nil || !strings.Contains(err.Error(), "NVFP4") && !strings.Contains(err.Error(), "no usable GPU") {
		t.Errorf("--device cuda: %v, want a refusal naming NVFP4 (or no GPU here)", err)
	}
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 3, Device: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	mustPass(t, rep, "--device auto")
}
