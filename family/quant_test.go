package family

import (
	"testing"

	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// Format gives the format readQuant's config describes: the experts' dtype when plain,
// 128x128 FP8 blocks with or without UE8M0 scales.
func TestPlanFormat(t *testing.T) {
	for _, tc := range []struct {
		p    Plan
		want weightfmt.Format
	}{
		{Plan{Quantization: QuantNone, WeightDType: safetensors.BF16}, weightfmt.Plain(safetensors.BF16)},
		{Plan{WeightDType: safetensors.F32}, weightfmt.Plain(safetensors.F32)},
		{Plan{Quantization: QuantFP8Block, WeightDType: safetensors.F8E4M3}, weightfmt.FP8Block(128, 128, false)},
		{Plan{Quantization: QuantFP8Block, WeightDType: safetensors.F8E4M3, ScaleFmt: "ue8m0"}, weightfmt.FP8Block(128, 128, true)},
		{Plan{Quantization: QuantMXFP8, WeightDType: safetensors.F8E4M3}, weightfmt.MXFP8(weightfmt.NamingModelOpt, safetensors.U8)},
		{Plan{Quantization: QuantMXFP8, WeightDType: safetensors.F8E4M3, Naming: weightfmt.NamingMiniMax}, weightfmt.MXFP8(weightfmt.NamingMiniMax, safetensors.U8)},
	} {
		got, err := tc.p.Format()
		if err != nil || got != tc.want {
			t.Errorf("%s %s %q: %v %v, want %v", tc.p.Quantization, tc.p.WeightDType, tc.p.ScaleFmt, got, err, tc.want)
		}
	}
}

// A plan's Quantization values are weightfmt's names: quantdesc.Read and
// ReadHF name formats by them, and the plan takes them as they are.
func TestQuantizationNames(t *testing.T) {
	for q, w := range map[Quantization]string{
		QuantNone: weightfmt.QuantNone, QuantFP8Block: weightfmt.QuantFP8Block, QuantFP8Channel: weightfmt.QuantFP8Channel,
		QuantFP8Tensor: weightfmt.QuantFP8Tensor, QuantInt4Pack: weightfmt.QuantInt4Pack, QuantNVFP4: weightfmt.QuantNVFP4ModelOpt,
		QuantNVFP4CT: weightfmt.QuantNVFP4CT, QuantMXFP4: weightfmt.QuantMXFP4, QuantMXFP8: weightfmt.QuantMXFP8,
	} {
		if string(q) != w {
			t.Errorf("family's %q is weightfmt's %q", q, w)
		}
	}
}
