package validate

import (
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// DeepSeek-V4's FP4 experts (issue 29: "expert_dtype": "fp4" beside an FP8
// ue8m0 quantization_config; x.weight I8 [out, in/2] and x.scale F8_E8M0
// [out, in/32] per routed expert, the shared expert FP8 128x128 blocks) in
// the layout moeprep reads DeepSeek-V4 (model.layers.L.ffn), at sizes and
// seeds the small-deepseek-v4-fp4 preset does not use: convert in every
// layout passes validate on the CPU, each mutation of DST fails it, and
// fuse-shared is refused (the shared expert is FP8).

var dsv4FP4 = weightfmt.MXFP4(weightfmt.NamingDeepSeek, safetensors.I8, safetensors.F8E8M0)

func TestDSV4FP4ConversionsValidate(t *testing.T) {
	specsPass(t, dsv4FP4Specs(), threeLayouts, nil, quantContract{weightfmt.QuantMXFP4, "I8", "F8_E8M0", []int64{1, 32}}, func(o convert.Options, c *layout.Contract) {
		if c.Naming != weightfmt.NamingDeepSeek || c.SharedQuantization != weightfmt.QuantFP8Block || c.SharedWeightDType != "F8_E4M3" || c.RoutedScalingFactorFolded {
			t.Errorf("%+v: contract naming %q shared %q %q folded %v, want deepseek, FP8 blocks, not folded",
				o, c.Naming, c.SharedQuantization, c.SharedWeightDType, c.RoutedScalingFactorFolded)
		}
	})
}

func TestDSV4FP4MutationsFail(t *testing.T) {
	mutationsFail(t, dsv4FP4Specs(), mxfp4Mutations("model.layers.1.ffn", dsv4FP4, "h64-i64", "h32-i96"), DeviceCPU, []string{BytesOff, BytesAuto})
}

// TestDSV4FP4Refusals: what moeprep cannot carry of DeepSeek-V4's FP4 is
// refused with one line naming the reason.
func TestDSV4FP4Refusals(t *testing.T) {
	refusalsHold(t, dsv4FP4Specs(), []refusal{
		{"fuse-shared beside an FP8 shared expert", "h64-i64", nil, nil, true,
			"routed experts MXFP4 (mxfp4, F8_E8M0 scales), shared expert F8_E4M3: fusing would requantise the shared expert"},
		{"an expert dtype moeprep does not know", "h64-i64", func(c map[string]any) { c["expert_dtype"] = "fp6" }, nil, false,
			`config.json: expert_dtype: "fp6" is not supported`},
		{"an FP8 shared expert in DeepSeek's own scale naming", "h64-i64", nil, func(t *testing.T, src string) {
			const w1 = "model.layers.0.ffn.shared_experts.w1"
			renameTensor(t, src, w1+".weight_scale_inv", w1+".scale")
		}, false, "is FP8 with DeepSeek's own scale naming (model.layers.0.ffn.shared_experts.w1.scale, E8M0): moeprep reads FP8 128x128 blocks with F32 weight_scale_inv"},
		{"fp4 experts beside another description", "h64-i64", func(c map[string]any) {
			c["quantization_config"] = map[string]any{"quant_method": "fp8"}
		}, nil, false, "config.json: expert_dtype: fp4 beside a fp8_tensor quantisation description"},
	})
	refusalsHold(t, int4Specs(), []refusal{
		{"fp4 experts on another family", "qwen3-channel", func(c map[string]any) { c["expert_dtype"] = "fp4" }, nil, false,
			"config.json: expert_dtype: fp4 is DeepSeek-V4's (MXFP4 experts named x.weight and x.scale); not planned for model_type qwen3_moe"},
	})
}

// TestDSV4FP4GPURefusal: no GPU path for MXFP4: --device cuda refuses by
// name, --device auto runs on the CPU with a note.
func TestDSV4FP4GPURefusal(t *testing.T) {
	src := synthFrom(t, dsv4FP4Specs(), "h32-i96")
	dst := convertInto(t, src, convert.Options{Layout: layout.Stacked})
	cudaRefused(t, src, dst, "", "MXFP4 expert weights (quantization mxfp4, F8_E8M0 scales) have no GPU path", "no GPU path")
}
