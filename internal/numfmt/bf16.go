package numfmt

import "math"

// BF16ToF32 widens a bfloat16 bit pattern exactly.
func BF16ToF32(u uint16) float32 { return math.Float32frombits(uint32(u) << 16) }

// F32ToBF16 rounds to the nearest bfloat16, ties to even, as torch's
// .to(torch.bfloat16) does; values past the largest bf16 overflow to
// infinity. NaNs stay NaN (quiet, sign kept).
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if f != f {
		return uint16(u>>16) | 0x0040
	}
	u += 0x7FFF + (u>>16)&1
	return uint16(u >> 16)
}

// F64ToBF16 rounds x to the nearest bfloat16, ties to even, in one rounding
// (not through the nearest float32, which could round twice).
func F64ToBF16(x float64) uint16 { return F32ToBF16(roundToOdd32(x)) }

// RoundBF16 rounds f to the nearest bf16-representable float32.
func RoundBF16(f float32) float32 { return BF16ToF32(F32ToBF16(f)) }
