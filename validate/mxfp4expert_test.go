package validate

import (
	"testing"

	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/validate/gpurun"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// MXFP4 stored per expert (issue 29), at sizes and seeds the presets do
// not use: DeepSeek-V4's FP4 experts ("expert_dtype": "fp4" beside an FP8
// ue8m0 quantization_config; x.weight I8 [out, in/2] and x.scale F8_E8M0
// [out, in/32] per routed expert, the shared expert FP8 128x128 blocks) in
// the layout moeprep reads DeepSeek-V4 (model.layers.L.ffn), and
// compressed-tensors' mxfp4-pack-quantized (x.weight_packed, x.weight_scale
// U8, routed and shared experts): convert in every layout (and fuse-shared
// where the shared expert is MXFP4 too) passes validate on the CPU, each
// mutation of DST fails it, and what cannot be carried is refused.

var (
	dsv4FP4   = weightfmt.MXFP4(weightfmt.NamingDeepSeek, safetensors.I8, safetensors.F8E8M0)
	ctMXFP4   = weightfmt.MXFP4(weightfmt.NamingCompressedTensors, safetensors.U8, safetensors.U8)
	fuseTwice = []convert.Options{{Layout: layout.Stacked, FuseShared: true, Replicas: 1}, {Layout: layout.GateUp, FuseShared: true, Replicas: 2}}
)

func TestCTMXFP4ConversionsValidate(t *testing.T) {
	specsPass(t, ctMXFP4Specs(), threeLayouts, fuseTwice, quantContract{weightfmt.QuantMXFP4, "U8", "", []int64{1, 32}}, func(o convert.Options, c *layout.Contract) {
		if c.Naming != weightfmt.NamingCompressedTensors || c.SharedQuantization != "" || c.RoutedScalingFactorFolded {
			t.Errorf("%+v: contract naming %q shared %q folded %v, want compressed-tensors, like the routed, not folded", o, c.Naming, c.SharedQuantization, c.RoutedScalingFactorFolded)
		}
	})
}

func TestCTMXFP4MutationsFail(t *testing.T) {
	mutationsFail(t, ctMXFP4Specs(), mxfp4Mutations("model.layers.1.mlp", ctMXFP4, "deepseek-v3-h64", "qwen3-e12"), DeviceCPU, []BytesMode{BytesOff, BytesAuto})
}

// TestCTMXFP4Refusals: what moeprep cannot carry of compressed-tensors
// MXFP4 is refused with one line naming the reason.
func TestCTMXFP4Refusals(t *testing.T) {
	weights := func(c map[string]any) map[string]any { return ctGroup0(c)["weights"].(map[string]any) }
	ignore := func(l ...any) func(c map[string]any) {
		return func(c map[string]any) { c["quantization_config"].(map[string]any)["ignore"] = l }
	}
	refusalsHold(t, ctMXFP4Specs(), []refusal{
		{"routed experts ignored", "qwen3-e12", ignore("lm_head", "re:.*experts.*"), nil, false,
			"the routed experts are left unquantised by the ignore list"},
		{"shared expert ignored but packed", "deepseek-v3-h64", ignore("lm_head", "re:.*self_attn.*", "re:.*mlp.gate$", "re:.*shared_experts.*"), nil, false,
			"shared_experts.gate_proj.weight_packed is packed but config.json's ignore list leaves the shared expert unquantised"},
		{"groups of 16", "qwen3-e12", func(c map[string]any) { weights(c)["group_size"] = 16 }, nil, false,
			"compressed-tensors mxfp4-pack-quantized (group 16) on the routed experts"},
		{"static activation scales", "qwen3-e12", func(c map[string]any) {
			ctGroup0(c)["input_activations"] = map[string]any{"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, "dynamic": false}
		}, nil, false, "static FP4 activation block scales are not carried; only true"},
	})
}

// TestGPUCTMXFP4: compressed-tensors MXFP4 (weight_packed, E8M0
// weight_scale) decodes to bf16 on the device as gpt-oss's MXFP4 does:
// every conversion passes validate --device cuda, every mutation fails the
// whole run.
func TestGPUCTMXFP4(t *testing.T) {
	gpuDecodedPass(t, ctMXFP4Specs(), layoutsAndFused, mxfp4Mutations("model.layers.1.mlp", ctMXFP4, "deepseek-v3-h64", "qwen3-e12"), "two scale entries swapped")
}

func TestDSV4FP4ConversionsValidate(t *testing.T) {
	specsPass(t, dsv4FP4Specs(), threeLayouts, nil, quantContract{weightfmt.QuantMXFP4, "I8", "F8_E8M0", []int64{1, 32}}, func(o convert.Options, c *layout.Contract) {
		if c.Naming != weightfmt.NamingDeepSeek || c.SharedQuantization != weightfmt.QuantFP8Block || c.SharedWeightDType != "F8_E4M3" || c.RoutedScalingFactorFolded {
			t.Errorf("%+v: contract naming %q shared %q %q folded %v, want deepseek, FP8 blocks, not folded",
				o, c.Naming, c.SharedQuantization, c.SharedWeightDType, c.RoutedScalingFactorFolded)
		}
	})
}

func TestDSV4FP4MutationsFail(t *testing.T) {
	mutationsFail(t, dsv4FP4Specs(), mxfp4Mutations("model.layers.1.ffn", dsv4FP4, "h64-i64", "h32-i96"), DeviceCPU, []BytesMode{BytesOff, BytesAuto})
}

// TestDSV4FP4Refusals: what moeprep cannot carry of DeepSeek-V4's FP4 is
// refused with one line naming the reason.
func TestDSV4FP4Refusals(t *testing.T) {
	refusalsHold(t, dsv4FP4Specs(), []refusal{
		{"fuse-shared beside an FP8 shared expert", "h64-i64", nil, nil, true,
			"routed experts MXFP4 (mxfp4, F8_E8M0 scales), shared expert F8_E4M3: fusing would requantise the shared expert"},
		{"an expert dtype moeprep does not know", "h64-i64", func(c map[string]any) { c["expert_dtype"] = "fp6" }, nil, false,
			`config.json: expert_dtype: "fp6" is not supported`},
		{"one FP8 shared projection in DeepSeek's own scale naming, the others in transformers'", "h64-i64", nil, func(t *testing.T, src string) {
			const w3 = "model.layers.0.ffn.shared_experts.w3"
			renameTensor(t, src, w3+".weight_scale_inv", w3+".scale")
		}, false, "missing tensor model.layers.0.ffn.shared_experts.w3.weight_scale_inv"},
		{"fp4 experts beside another description", "h64-i64", func(c map[string]any) {
			c["quantization_config"] = map[string]any{"quant_method": "fp8"}
		}, nil, false, "config.json: expert_dtype: fp4 beside a fp8_tensor quantisation description"},
	})
	refusalsHold(t, int4Specs(), []refusal{
		{"fp4 experts on another family", "qwen3-channel", func(c map[string]any) { c["expert_dtype"] = "fp4" }, nil, false,
			"config.json: expert_dtype: fp4 is DeepSeek-V4's and V4.1's (MXFP4 experts named x.weight and x.scale); not planned for model_type qwen3_moe"},
	})
}

// TestDSV4FP4GPUFormats: DeepSeek-V4's FP4 experts sit beside an FP8
// 128x128 shared expert; the GPU loads each MLP with its own format (the
// routed experts decoded from FP4 to bf16 on the device, the shared expert
// through the FP8 kernels), so the default precision (bf16) takes them, in
// transformers' names and the official layout's (x.scale F8_E8M0, widened
// to F32 exactly as it is uploaded), and the other precisions refuse
// naming the routed format, before any layer runs. No GPU needed.
func TestDSV4FP4GPUFormats(t *testing.T) {
	for _, c := range []struct {
		name  string
		specs map[string]fixtures.SynthSpec
	}{{"transformers", dsv4FP4Specs()}, {"official", dsv4OfficialSpecs()}} {
		t.Run(c.name, func(t *testing.T) {
			src := synthFrom(t, c.specs, "h32-i96")
			dst := convertInto(t, src, convert.Options{Layout: layout.Stacked})
			for _, pair := range [][2]string{{src, dst}, {src, ""}, {dst, ""}} {
				s := &session{o: Options{Src: pair[0], Dst: pair[1], GPUPrecision: PrecisionBF16}}
				if pair[1] == "" && pair[0] == dst {
					s.o = Options{Dst: dst, GPUPrecision: PrecisionBF16}
				}
				if err := s.open(); err != nil {
					t.Fatal(err)
				}
				if why := s.gpuRefusal(); why != "" {
					t.Errorf("%v --precision bf16 refused: %s", pair, why)
				}
				s.close()
			}
			for _, prec := range []Precision{PrecisionF32, PrecisionFP8} {
				cudaRefused(t, src, dst, prec, "MXFP4 expert weights (quantization mxfp4, F8_E8M0 scales) are decoded to bf16 on the GPU, which runs them with --precision bf16 only (not "+string(prec)+")",
					"decoded to bf16 on the GPU")
			}
		})
	}
	// The kernels take FP8 128x128 blocks under F32, F8_E8M0 or U8 (E8M0)
	// scales as stored; FP8 in any other block (DeepSeek-V4.1's 32x32, a
	// block that is not square) is decoded to bf16 on the device first.
	for _, tc := range []struct {
		f              weightfmt.Format
		take, onDevice bool
	}{
		{weightfmt.FP8Block(128, 128, false), true, false},
		{weightfmt.FP8BlockDeepSeek(128, 128, safetensors.F8E8M0), true, false},
		{weightfmt.FP8BlockDeepSeek(128, 128, safetensors.U8), true, false},
		{weightfmt.FP8BlockDeepSeek(64, 128, safetensors.F8E8M0), true, true},
		{weightfmt.FP8BlockDeepSeek(32, 32, safetensors.F8E8M0), true, true}, // DeepSeek-V4.1's
		{weightfmt.FP8Block(32, 32, true), true, true},
		{weightfmt.FP8Block(64, 64, false), true, true},
		{weightfmt.MXFP8(weightfmt.NamingModelOpt, safetensors.U8), true, true},
	} {
		sc, _ := tc.f.Scale()
		if got := gpurun.KernelsTake(tc.f); got != tc.take {
			t.Errorf("KernelsTake(FP8 %v %s) = %v, want %v", sc.Block, sc.DType, got, tc.take)
		}
		if got := gpurun.DecodesOnDevice(tc.f); got != tc.onDevice {
			t.Errorf("DecodesOnDevice(FP8 %v %s) = %v, want %v", sc.Block, sc.DType, got, tc.onDevice)
		}
	}
}

// TestGPUDSV4FP4: on a GPU, DeepSeek-V4's FP4 experts (decoded to bf16 on
// the device) beside their FP8 128x128 shared expert (the FP8 kernels),
// in transformers' layout and the official one: every conversion passes
// validate --device cuda, every mutation fails the run with the byte
// proof, and the layer checks alone (at the gpu-bf16 tolerance) catch
// swapped FP4 scales and a doubled FP8 shared-expert block scale (the
// others, one code each, are logged: gpu-bf16 need not see one code).
func TestGPUDSV4FP4(t *testing.T) {
	t.Run("transformers", func(t *testing.T) {
		gpuDecodedPass(t, dsv4FP4Specs(), layoutsAndFused, mxfp4Mutations("model.layers.1.ffn", dsv4FP4, "h64-i64", "h32-i96"),
			"two scale entries swapped")
	})
	t.Run("official", func(t *testing.T) {
		muts := append(mxfp4Mutations("layers.1.ffn", dsv4FP4, "h64-i64", "h32-i96"), dsv4OfficialSharedMutations()...)
		gpuDecodedPass(t, dsv4OfficialSpecs(), layoutsAndFused, muts,
			"two scale entries swapped", "shared expert E8M0 block scale doubled")
	})
	// Dequantised (--dtype bf16, each weight by its own format; the FP8
	// shared expert fused too): plain bf16 on the device.
	t.Run("dequantised", func(t *testing.T) {
		needGPU(t)
		src := synthFrom(t, dsv4OfficialSpecs(), "h64-i64")
		conversionsPass(t, src, DeviceCUDA, []convert.Options{{DType: safetensors.BF16}, {DType: safetensors.BF16, FuseShared: true, TP: 2, Layout: layout.GateUp}}, nil)
	})
}
