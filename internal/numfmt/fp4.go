package numfmt

import "math"

// E2M1 is the 4-bit float of MXFP4 and NVFP4 (OCP Microscaling spec v1.0,
// FP4 E2M1): bit 3 the sign, bits 2-1 the exponent (bias 1), bit 0 the
// mantissa; exponent 0 holds the subnormal 0.5. No infinities or NaNs, so
// the 16 codes are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (code 8
// is -0). The same table is compressed-tensors' kE2M1ToFloat
// (compressors/nvfp4/helpers.py, sign applied by multiplying by -1, which
// gives -0 for code 8), transformers' FP4_VALUES (integrations/mxfp4.py)
// and DeepSeek-V4's FP4_TABLE (inference/convert.py, which writes +0 for
// code 8: the two zeros are equal as numbers).
var e2m1Table [16]float32

func init() {
	for i := range 16 {
		e2m1Table[i] = e2m1Value(byte(i))
	}
}

// E2M1ToF32 decodes the low 4 bits of b as an E2M1 code (the high bits
// are ignored): one table load.
func E2M1ToF32(b byte) float32 { return e2m1Table[b&0x0F] }

// e2m1Value decodes by the definition, for the table.
func e2m1Value(b byte) float32 {
	e, m := int(b>>1)&3, float64(b&1)
	v := m / 2 // subnormal: m * 2^-1
	if e != 0 {
		v = math.Ldexp(1+m/2, e-1)
	}
	if b&8 != 0 {
		v = math.Copysign(v, -1)
	}
	return float32(v)
}
