package numfmt

import "math"

// F16ToF32 widens an IEEE half-precision bit pattern exactly (NaN payloads
// and the sign of zero kept).
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1F
	man := uint32(h) & 0x3FF
	switch {
	case exp == 0x1F:
		return math.Float32frombits(sign | 0x7F800000 | man<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal half: man * 2^-24, exactly representable in float32.
	v := float32(man) * float32(math.Ldexp(1, -24))
	if sign != 0 {
		v = -v
	}
	return v
}

// F32ToF16 rounds to the nearest IEEE half, ties to even, with subnormals,
// overflowing to infinity; NaN stays NaN.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	abs := b & 0x7fffffff
	switch {
	case abs > 0x7f800000:
		return sign | 0x7e00
	case abs >= 0x477ff000: // rounds to >= 65536: infinity
		return sign | 0x7c00
	case abs >= 0x38800000: // normal half
		abs += 0xfff + (abs>>13)&1
		return sign | uint16((abs-0x38000000)>>13)
	case abs < 0x33000000: // below half the smallest subnormal
		return sign
	}
	// subnormal half: value = m * 2^-24
	// 2^(exp-127) * mant/2^23 / 2^-24 = mant >> (126-exp)
	return sign | uint16(shiftRNE(abs&0x7fffff|0x800000, uint(126-abs>>23)))
}

// F64ToF16 rounds x to the nearest IEEE half, ties to even, in one rounding.
func F64ToF16(x float64) uint16 { return F32ToF16(roundToOdd32(x)) }
