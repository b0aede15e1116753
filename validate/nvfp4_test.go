package validate

import (
	"encoding/binary"
	"math"
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

// nvfp4Runs is the conversions of spec that both the CPU and the GPU
// tests validate: every layout and, with a shared expert, fuse-shared.
func nvfp4Runs(spec fixtures.SynthSpec) []convert.Options {
	opts := []convert.Options{{Layout: layout.Stacked}, {Layout: layout.GateUp}, {Layout: layout.UpGate, TP: 2}}
	if spec.SharedExperts > 0 {
		opts = append(opts, convert.Options{Layout: layout.Stacked, FuseShared: true, Replicas: 1},
			convert.Options{Layout: layout.GateUp, FuseShared: true, Replicas: 2})
	}
	return opts
}

func TestNVFP4ConversionsValidate(t *testing.T) {
	for name, spec := range nvfp4Specs() {
		t.Run(name, func(t *testing.T) {
			src := synthFrom(t, nvfp4Specs(), name)
			conversionsPass(t, src, DeviceCPU, nvfp4Runs(spec), func(o convert.Options, c *layout.Contract) {
				quantContract{weightfmt.QuantNVFP4ModelOpt, "U8", "", []int64{1, 16}}.check(t, o, c)
				if !c.InputScales || c.RoutedScalingFactorFolded {
					t.Errorf("%+v: contract input_scales %v folded %v, want true false", o, c.InputScales, c.RoutedScalingFactorFolded)
				}
			})
		})
	}
}

// TestNVFP4MutationsFail: a flipped nibble in one expert, two block
// scales swapped, a global scale changed and the nibble order of a byte
// reversed each fail validate, layer checks alone and whole run.
func TestNVFP4MutationsFail(t *testing.T) {
	mutationsFail(t, nvfp4Specs(), nvfp4Mutations(), DeviceCPU, []string{BytesOff, BytesAuto})
}

func nvfp4Mutations() []dstMutation {
	const prefix = "model.layers.1.mlp"
	f := weightfmt.NVFP4ModelOpt()
	const fixture = "deepseek-v3-nv"
	return []dstMutation{
		{"one flipped nibble in one expert", fixture, convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
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
		{"two block scales swapped", fixture, convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) {
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
		{"a global scale changed", fixture, convert.Options{Layout: layout.UpGate}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.UpGate, prefix, f)
			rewriteTensor(t, dst, n.GateUpGlobal, func(raw []byte, shape []int64) {
				v := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*7:]))
				binary.LittleEndian.PutUint32(raw[4*7:], math.Float32bits(v*1.25))
			})
		}},
		{"nibble order reversed within a byte", fixture, convert.Options{Layout: layout.Stacked, TP: 2}, func(t *testing.T, dst string) {
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
}

// TestGPUNVFP4: on the GPU, which decodes NVFP4 to bf16 on the device
// (each expert's, and each gate-up half's, weight_scale_2 applied as on
// the CPU), every conversion of nvfp4Specs, fuse-shared included, passes
// validate --device cuda, and every mutation fails the whole run. The
// layer checks alone must catch a changed global scale (a whole weight
// 1.25x: 1.6x gpu-bf16's 2e-2 on an H100); one nibble or a nibble pair
// moves these fixtures' output by 0.3x to 0.5x of it and two swapped block
// scales by about 1.1x, and are logged.
func TestGPUNVFP4(t *testing.T) {
	gpuDecodedPass(t, nvfp4Specs(), nvfp4Runs, nvfp4Mutations(), "a global scale changed")
}
