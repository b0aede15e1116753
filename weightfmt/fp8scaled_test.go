package weightfmt

import (
	"math"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// Hand-computed FP8 per-channel and per-tensor values: E4M3 0x38 = 1,
// 0xC0 = -2, 0x7E = 448, 0x01 = 2^-9; the scale multiplies
// (compressed-tensors _dequantize: x_q * scale; llama.cpp dequant_simple:
// weight.float() * scale), one per row [rows, 1] or one for all.
func TestFP8ScaledDequantise(t *testing.T) {
	raw := []byte{0x38, 0xC0, 0x7E, 0x38, 0xC0, 0x01}
	checkDequantise(t, []dequantCase{
		{"channel, BF16 scales", FP8Channel(safetensors.BF16), 2, 3, raw, bf16s(0.5, -3),
			[]float32{0.5, -1, 224, -3, 6, -3 * 0x1p-9}},
		{"channel, F32 scales", FP8Channel(safetensors.F32), 2, 3, raw, f32s(0.1, 2),
			[]float32{0.1, -0.2, 448 * float32(0.1), 2, -4, 0x1p-8}},
		{"tensor, F32 scale", FP8Tensor(safetensors.F32), 2, 3, raw, f32s(0.125),
			[]float32{0.125, -0.25, 56, 0.125, -0.25, 0x1p-12}},
		{"tensor, BF16 scale (compressed-tensors strategy tensor)", FP8Tensor(safetensors.BF16), 2, 3, raw, bf16s(-4),
			[]float32{-4, 8, -1792, -4, 8, -0x1p-7}},
		{"channel, F16 scales", FP8Channel(safetensors.F16), 2, 3, raw, []byte{0x00, 0x3C, 0x00, 0xB8}, // 1, -0.5
			[]float32{1, -2, 448, -0.5, 1, -0x1p-10}},
	})
	// The E4M3 NaN stays NaN.
	dst := make([]float32, 1)
	if err := FP8Tensor(safetensors.F32).Dequantise([]byte{0x7F}, 1, 1, f32s(2), dst); err != nil || !math.IsNaN(float64(dst[0])) {
		t.Errorf("E4M3 NaN: %v %v", dst, err)
	}
}

func TestFP8ScaledRefusals(t *testing.T) {
	ch, ten := FP8Channel(safetensors.BF16), FP8Tensor(safetensors.F32)
	checkRefusals(t, []refusal{
		{"channel: one scale for two rows", ch, 2, 3, make([]byte, 6), bf16s(1), 6, "scale bytes"},
		{"channel: F32 bytes for BF16 scales", ch, 2, 3, make([]byte, 6), f32s(1, 1), 6, "scale bytes"},
		{"tensor: two scales", ten, 2, 3, make([]byte, 6), f32s(1, 1), 6, "scale bytes"},
		{"tensor: no scale", ten, 2, 3, make([]byte, 6), nil, 6, "scale bytes"},
		{"short weight", ten, 2, 3, make([]byte, 5), f32s(1), 6, "weight bytes"},
		{"short output", ch, 2, 3, make([]byte, 6), bf16s(1, 1), 5, "outputs"},
		{"overflowing size", ch, 1 << 40, 1 << 40, nil, nil, 0, "outputs"},
		{"overflowing grid", ch, 1 << 62, 0, nil, nil, 0, "scale bytes"},
	})
}
