// Package numfmt holds the bit-exact conversions between float32/float64 and
// the narrow float formats checkpoints store: bf16, f16, F8_E4M3 (torch
// float8_e4m3fn), F8_E5M2, F8_E8M0 and the 4-bit E2M1 of MXFP4 and NVFP4
// (decoding only). Encoders round to nearest, ties to
// even, as torch's casts do; decoders are exact. Every package that reads or
// writes these formats goes through here, so there is one implementation of
// each to test.
package numfmt

import "math"

// roundToOdd32 rounds x to float32 toward zero and sets the last mantissa bit
// when inexact ("round to odd"), so that a later round-to-nearest-even to any
// format at least two bits narrower gives the correctly rounded result of x:
// F64ToBF16 and F64ToF16 round once, not twice.
func roundToOdd32(x float64) float32 {
	f := float32(x)
	if float64(f) == x || math.IsNaN(x) {
		return f
	}
	if math.IsInf(float64(f), 0) || math.Abs(float64(f)) > math.Abs(x) {
		f = math.Nextafter32(f, 0)
	}
	return math.Float32frombits(math.Float32bits(f) | 1)
}

// shiftRNE is mant >> shift (1 <= shift < 32) rounded to nearest, ties to
// even: the subnormal encodings, whose step is a power of two above mant's.
func shiftRNE(mant uint32, shift uint) uint32 {
	half := uint32(1) << (shift - 1)
	q := mant >> shift
	rem := mant & (half<<1 - 1)
	if rem > half || rem == half && q&1 == 1 {
		q++
	}
	return q
}
