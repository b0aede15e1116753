package validate

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/weightfmt"
)

// NVFP4 checkpoints (issue 29): ModelOpt's (NVIDIA's DeepSeek-R1-FP4
// layout, NVFP4 routed and shared experts with weight_scale_2 and
// input_scale) and compressed-tensors' nvfp4-pack-quantized (RedHat's,
// weight_packed with a dividing weight_global_scale and
// input_global_scale), at sizes and seeds that the presets do not use:
// convert in every layout and fuse-shared pass validate on the CPU, and
// each mutation of DST fails it.

// nvfp4Producers are the two NVFP4 producers' spec tables, each with its
// format and the fixture its mutations corrupt (one with a shared expert
// and grouped routing).
var nvfp4Producers = []struct {
	name    string
	specs   func() map[string]fixtures.SynthSpec
	f       weightfmt.Format
	mutated string
}{
	{"modelopt", nvfp4Specs, weightfmt.NVFP4ModelOpt(), "deepseek-v3-nv"},
	{"compressed-tensors", nvfp4CTSpecs, weightfmt.NVFP4CT(), "deepseek-v3-ct"},
	{"modelopt MIXED_PRECISION", nvfp4MixedSpecs, weightfmt.NVFP4ModelOpt(), "deepseek-v3-mixed"},
}

func TestNVFP4ConversionsValidate(t *testing.T) {
	for _, pr := range nvfp4Producers {
		t.Run(pr.name, func(t *testing.T) {
			specsPass(t, pr.specs(), threeLayouts, fuseTwice, quantContract{pr.f.Quantization(), "U8", "", []int64{1, 16}}, func(o convert.Options, c *layout.Contract) {
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
	const prefix = "model.layers.1.mlp"
	for _, pr := range nvfp4Producers {
		t.Run(pr.name, func(t *testing.T) {
			mutationsFail(t, pr.specs(), nvfp4Mutations(prefix, pr.f, pr.mutated), DeviceCPU, []BytesMode{BytesOff, BytesAuto})
		})
	}
}

// nvfp4Mutations are the corruptions of a conversion of fixture whose
// experts are NVFP4 in format f.
func nvfp4Mutations(prefix string, f weightfmt.Format, fixture string) []dstMutation {
	return []dstMutation{
		{"one flipped nibble in one expert", fixture, convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.Stacked, prefix, f)
			rewriteTensor(t, dst, n.Weight(layout.ProjDown), func(raw []byte, shape []int64) {
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
			rewriteTensor(t, dst, n.Get(layout.ProjGateUp, layout.RoleScale), func(raw []byte, shape []int64) {
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
			rewriteTensor(t, dst, n.Get(layout.ProjGateUp, layout.RoleGlobal), func(raw []byte, shape []int64) {
				v := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*7:]))
				binary.LittleEndian.PutUint32(raw[4*7:], math.Float32bits(v*1.25))
			})
		}},
		{"nibble order reversed within a byte", fixture, convert.Options{Layout: layout.Stacked, TP: 2}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.Stacked, prefix, f)
			rewriteTensor(t, dst, n.Weight(layout.ProjUp), func(raw []byte, shape []int64) {
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

// TestNVFP4CTRefusals: what moeprep cannot carry of compressed-tensors
// NVFP4 is refused with one line naming the reason.
func TestNVFP4CTRefusals(t *testing.T) {
	weights := func(c map[string]any) map[string]any { return ctGroup0(c)["weights"].(map[string]any) }
	ignore := func(l ...any) func(c map[string]any) {
		return func(c map[string]any) { c["quantization_config"].(map[string]any)["ignore"] = l }
	}
	refusalsHold(t, nvfp4CTSpecs(), []refusal{
		{"routed experts ignored", "qwen3-ct", ignore("lm_head", "re:.*mlp.gate$", "re:.*experts.*"), nil, false,
			"the routed experts are left unquantised by the exclude list"},
		{"shared expert ignored", "deepseek-v3-ct", ignore("lm_head", "re:.*mlp.gate$", "re:.*shared_experts.*"), nil, false,
			"the shared expert is left unquantised while the routed experts are compressed-tensors nvfp4-pack-quantized (group 16)"},
		{"static activation block scales", "qwen3-ct", func(c map[string]any) { ctGroup0(c)["input_activations"].(map[string]any)["dynamic"] = false }, nil, false,
			"static FP4 activation block scales are not carried"},
		{"groups of 32", "qwen3-ct", func(c map[string]any) { weights(c)["group_size"] = 32 }, nil, false,
			"compressed-tensors nvfp4-pack-quantized (group 32) on the routed experts"},
		{"asymmetric", "qwen3-ct", func(c map[string]any) { weights(c)["symmetric"] = false }, nil, false,
			"symmetric: false is not supported"},
	})
}

// TestNVFP4MixedRefusals: a MIXED_PRECISION whose experts are not all
// NVFP4, or whose shared expert is FP8 beside NVFP4 routed experts, is
// refused in one line naming the modules.
func TestNVFP4MixedRefusals(t *testing.T) {
	layers := func(edit func(l map[string]any)) func(c map[string]any) {
		return func(c map[string]any) {
			edit(c["quantization_config"].(map[string]any)["quantized_layers"].(map[string]any))
		}
	}
	refusalsHold(t, nvfp4MixedSpecs(), []refusal{
		{"one layer's experts FP8", "qwen3-mixed", layers(func(l map[string]any) {
			l["model.layers.2.mlp.experts"] = map[string]any{"quant_algo": "FP8"}
		}), nil, false, "not carried: quantized_layers: model.layers.1.mlp.experts is nvfp4 (group 16) but model.layers.2.mlp.experts is fp8 per-tensor; moeprep plans one routed expert format per checkpoint"},
		{"an FP8 shared expert", "deepseek-v3-mixed", layers(func(l map[string]any) {
			for _, p := range []string{"1.mlp.shared_experts.gate_proj", "1.mlp.shared_experts.up_proj", "1.mlp.shared_experts.down_proj",
				"2.mlp.shared_experts.gate_proj", "2.mlp.shared_experts.up_proj", "2.mlp.shared_experts.down_proj"} {
				l["model.layers."+p] = map[string]any{"quant_algo": "FP8"}
			}
		}), nil, false, "the shared expert is fp8 per-tensor beside NVFP4 routed experts; moeprep carries NVFP4 shared experts only"},
		{"experts left out of quantized_layers", "qwen3-mixed", layers(func(l map[string]any) { delete(l, "model.layers.2.mlp.experts") }), nil, false,
			"config.json: quantization_config: quantized_layers names none of layer 2's experts (model.layers.2.mlp.experts): by it they are unquantised, but their tensors are NVFP4"},
	})
}

// TestGPUNVFP4: on the GPU, which decodes NVFP4 to bf16 on the device
// (each expert's, and each gate-up half's, global scale applied as on the
// CPU: ModelOpt's weight_scale_2 multiplies, compressed-tensors'
// weight_global_scale divides), every conversion of each producer's specs,
// fuse-shared included, passes validate --device cuda, and every mutation
// fails the whole run. The layer checks alone must catch a changed global
// scale (a whole weight 1.25x: 1.6x gpu-bf16's 2e-2 on an H100); one
// nibble or a nibble pair moves these fixtures' output by 0.3x to 0.5x of
// it and two swapped block scales by about 1.1x, and are logged.
func TestGPUNVFP4(t *testing.T) {
	for _, pr := range nvfp4Producers {
		t.Run(pr.name, func(t *testing.T) {
			gpuDecodedPass(t, pr.specs(), layoutsAndFused, nvfp4Mutations("model.layers.1.mlp", pr.f, pr.mutated), "a global scale changed")
		})
	}
}

// layoutsAndFused is threeLayouts, and fuseTwice where spec has a shared
// expert (gpuDecodedPass's runs).
func layoutsAndFused(spec fixtures.SynthSpec) []convert.Options {
	if spec.SharedExperts == 0 {
		return threeLayouts
	}
	return slices.Concat(threeLayouts, fuseTwice)
}
