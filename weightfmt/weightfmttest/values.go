package weightfmttest

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/moeprep/moeprep/safetensors"
)

// The element and scale codes, as the formats' own documents define them
// (OCP MX v1.0 for E4M3, E2M1 and E8M0; IEEE 754 binary16; bfloat16 as
// the top half of a binary32). They are written here from those
// definitions and not taken from weightfmt or numfmt, so that the suite
// states what a decode must give without asking the code it checks.

// e4m3 is the value of an FP8 E4M3 (fn: no infinities) code: sign, four
// exponent bits of bias 7, three mantissa bits; S.1111.111 is NaN.
func e4m3(code byte) float64 {
	e, m := int(code>>3&0xf), float64(code&7)
	var v float64
	switch {
	case e == 15 && m == 7:
		return math.NaN()
	case e == 0:
		v = m / 8 * math.Ldexp(1, -6)
	default:
		v = (1 + m/8) * math.Ldexp(1, e-7)
	}
	if code&0x80 != 0 {
		v = -v
	}
	return v
}

// e2m1Values are the sixteen FP4 E2M1 codes' values: 0 .. 7 positive,
// 8 .. 15 the same with the sign bit set (8 is -0).
var e2m1Values = [16]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6,
	math.Copysign(0, -1), -0.5, -1, -1.5, -2, -3, -4, -6}

// e8m0 is the value of an E8M0 scale code: 2^(code-127), 255 NaN; 0 is
// 2^-127, a binary32 subnormal.
func e8m0(code byte) float64 {
	if code == 255 {
		return math.NaN()
	}
	return math.Ldexp(1, int(code)-127)
}

// f16 is the value of an IEEE binary16 code: five exponent bits of bias
// 15, ten mantissa bits, subnormals m * 2^-24.
func f16(b uint16) float64 {
	e, m := int(b>>10&0x1f), float64(b&0x3ff)
	var v float64
	switch {
	case e == 31 && m == 0:
		v = math.Inf(1)
	case e == 31:
		return math.NaN()
	case e == 0:
		v = m * math.Ldexp(1, -24)
	default:
		v = (1 + m/1024) * math.Ldexp(1, e-15)
	}
	if b&0x8000 != 0 {
		v = -v
	}
	return v
}

// bf16 is the value of a bfloat16 code: the top 16 bits of a binary32.
func bf16(b uint16) float64 { return float64(math.Float32frombits(uint32(b) << 16)) }

// float formats by their significand bits (with the implicit one) and
// exponent range, for rounding.
type floatFmt struct{ p, emin, emax int }

var (
	fmtF32  = floatFmt{24, -126, 127}
	fmtBF16 = floatFmt{8, -126, 127}
	fmtF16  = floatFmt{11, -14, 15}
)

// round is x rounded once to nearest, ties to even, in f: a value past
// f's largest finite one by half a step or more is an infinity, a value
// below its subnormals keeps its sign as a zero. x is exact (every
// formula of the suite is exact in float64, but compressed-tensors'
// NVFP4 quotient, whose float64 rounding first is innocuous: 53 >= 2*24+2).
func round(x float64, f floatFmt) float64 {
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	_, exp := math.Frexp(math.Abs(x)) // |x| = frac * 2^exp, frac in [0.5, 1)
	e := max(exp-1, f.emin)
	q := math.Ldexp(1, e-f.p+1) // the step of f's values at x's exponent
	r := math.RoundToEven(math.Abs(x)/q) * q
	if r > (2-math.Ldexp(1, 1-f.p))*math.Ldexp(1, f.emax) {
		r = math.Inf(1)
	}
	return math.Copysign(r, x)
}

// f32 is x rounded once to float32.
func f32(x float64) float32 { return float32(round(x, fmtF32)) }

// roundTo is a float32 value as an implementation that writes dtype d
// writes it: F32 as it is, BF16 and F16 rounded once to nearest even.
func roundTo(v float32, d safetensors.DType) (float32, error) {
	switch d {
	case safetensors.F32:
		return v, nil
	case safetensors.BF16:
		return float32(round(float64(v), fmtBF16)), nil
	case safetensors.F16:
		return float32(round(float64(v), fmtF16)), nil
	}
	return 0, fmt.Errorf("weightfmttest: output dtype %s: want F32, BF16 or F16", d)
}

// finite reports whether x is neither an infinity nor NaN.
func finite(x float64) bool { return !math.IsInf(x, 0) && !math.IsNaN(x) }

// scaleValue is the value of the scale entry i of grid b stored as d.
func scaleValue(d safetensors.DType, b []byte, i int) float64 {
	switch d {
	case safetensors.F32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case safetensors.BF16:
		return bf16(binary.LittleEndian.Uint16(b[2*i:]))
	case safetensors.F16:
		return f16(binary.LittleEndian.Uint16(b[2*i:]))
	case safetensors.F8E4M3:
		return e4m3(b[i])
	case safetensors.F8E8M0, safetensors.U8:
		return e8m0(b[i])
	}
	panic("weightfmttest: scale dtype " + string(d))
}

// encodeExact stores x as d in b at entry i, and reports whether d holds
// x exactly (the cases pick scale values each dtype holds; one it does
// not hold is left out rather than rounded by a rule of the suite's own).
func encodeExact(d safetensors.DType, x float64, b []byte, i int) bool {
	switch d {
	case safetensors.F32:
		v := float32(x)
		if float64(v) != x && !math.IsNaN(x) {
			return false
		}
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		return true
	case safetensors.BF16:
		u := math.Float32bits(float32(x))
		if math.IsNaN(x) {
			u = 0x7fc00000
		}
		if u&0xffff != 0 || float64(math.Float32frombits(u)) != x && !math.IsNaN(x) {
			return false
		}
		binary.LittleEndian.PutUint16(b[2*i:], uint16(u>>16))
		return true
	case safetensors.F16:
		for c := range 1 << 16 { // the first code of that value: the search is the definition
			if v := f16(uint16(c)); v == x && math.Signbit(v) == math.Signbit(x) || math.IsNaN(x) && math.IsNaN(v) {
				binary.LittleEndian.PutUint16(b[2*i:], uint16(c))
				return true
			}
		}
		return false
	}
	panic("weightfmttest: scale dtype " + string(d))
}
