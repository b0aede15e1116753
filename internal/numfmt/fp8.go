package numfmt

import "math"

// E4M3Max is the largest finite float8_e4m3fn value (code S.1111.110).
const E4M3Max = 448

// Lookup tables for the 8-bit float decoders, one entry per byte value: a
// decode is one load, which the validate dequantisation loops rely on.
var (
	e4m3Table [256]float32
	e5m2Table [256]float32
	e8m0Table [256]float32
)

func init() {
	for i := range 256 {
		b := byte(i)
		e4m3Table[i] = e4m3Value(b)
		e5m2Table[i] = e5m2Value(b)
		e8m0Table[i] = e8m0Value(b)
	}
}

// E4M3ToF32 decodes torch.float8_e4m3fn: sign, 4 exponent bits (bias 7), 3
// mantissa bits; no infinities, S.1111.111 is NaN, so the largest finite
// value is 1.75 * 2^8 = 448; exponent 0 holds subnormals m/8 * 2^-6.
func E4M3ToF32(b byte) float32 { return e4m3Table[b] }

// E5M2ToF32 decodes torch.float8_e5m2, an IEEE-style format: 5 exponent bits
// (bias 15), 2 mantissa bits, infinities and NaNs at exponent 31.
func E5M2ToF32(b byte) float32 { return e5m2Table[b] }

// E8M0ToF32 decodes the unsigned power-of-two scale format (OCP MX E8M0):
// 2^(b-127), with 0xFF the NaN encoding.
func E8M0ToF32(b byte) float32 { return e8m0Table[b] }

// e4m3Value and e5m2Value decode by definition, for the tables.
func e4m3Value(b byte) float32 { return minifloatValue(b, 3, false) }
func e5m2Value(b byte) float32 { return minifloatValue(b, 2, true) }

// minifloatValue decodes a sign / exponent / manBits-mantissa byte with the
// IEEE bias. With ieee, the top exponent holds infinity and NaNs (e5m2);
// without, only its all-ones mantissa is NaN and the rest are finite (e4m3fn).
// Exponent 0 holds subnormals man/2^manBits * 2^(1-bias).
func minifloatValue(b byte, manBits uint, ieee bool) float32 {
	expBits := 7 - manBits
	bias := 1<<(expBits-1) - 1
	sign := float32(1)
	if b&0x80 != 0 {
		sign = -1
	}
	exp := int(b>>manBits) & (1<<expBits - 1)
	manMask := byte(1)<<manBits - 1
	frac := float32(b&manMask) / float32(int(1)<<manBits)
	switch top := 1<<expBits - 1; {
	case exp == top && ieee && b&manMask == 0:
		return sign * float32(math.Inf(1))
	case exp == top && (ieee || b&manMask == manMask):
		return float32(math.Copysign(math.NaN(), float64(sign)))
	case exp == 0:
		return sign * frac * float32(math.Ldexp(1, 1-bias))
	}
	return sign * (1 + frac) * float32(math.Ldexp(1, exp-bias))
}

func e8m0Value(b byte) float32 {
	if b == 0xFF {
		return float32(math.NaN())
	}
	return float32(math.Ldexp(1, int(b)-127))
}

// F32ToE4M3 rounds to the nearest float8_e4m3fn, ties to even, saturating to
// +-448 (the code S.1111.110) instead of producing NaN, as quantisers clamp
// before torch's cast; NaN input gives 0x7F. Finite input never gives the
// NaN code.
func F32ToE4M3(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	abs := b & 0x7fffffff
	if abs > 0x7f800000 {
		return 0x7f
	}
	if math.Float32frombits(abs) >= E4M3Max {
		return sign | 0x7e
	}
	exp := int(abs>>23) - 127
	if exp >= -6 { // normal e4m3: 3 mantissa bits, bias 7
		abs += 0x7ffff + (abs>>20)&1
		exp = int(abs>>23) - 127
		// abs < 448 rounds to at most 448 = code 0x7e, never to the NaN code.
		return sign | uint8(exp+7)<<3 | uint8(abs>>20)&7
	}
	// subnormal e4m3: value = m * 2^-9, m in 0..7 (8 rounds up to the smallest normal)
	if exp < -11 { // below 2^-11 = a quarter of the smallest subnormal
		return sign
	}
	// value/2^-9 = mant * 2^(exp-23+9)
	return sign | uint8(shiftRNE(abs&0x7fffff|0x800000, uint(-exp-9+23)))
}
