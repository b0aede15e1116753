// Package validate proves that a converted (stacked, shared-fused, rsf-folded)
// checkpoint computes the same MoE layers as its source: an unfused reference
// on the source plan and a fused path that is the CPU twin of the serving
// kernels (gate, moe_align_block_size, grouped GEMM, finalize) run on the same
// token vectors, and their outputs, routings and HF goldens are compared.
package validate

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/moeprep/moeprep/safetensors"
)

// Lookup tables for the 8-bit float formats: one entry per byte value.
var (
	e4m3Table [256]float32
	e5m2Table [256]float32
	e8m0Table [256]float32
)

func init() {
	for i := range 256 {
		b := byte(i)
		e4m3Table[i] = e4m3ToF32(b)
		e5m2Table[i] = e5m2ToF32(b)
		e8m0Table[i] = e8m0ToF32(b)
	}
}

// e4m3ToF32 decodes torch.float8_e4m3fn: sign, 4 exponent bits (bias 7), 3
// mantissa bits; no infinities, S.1111.111 is NaN, so the largest finite value
// is 1.75 * 2^8 = 448; exponent 0 holds subnormals m/8 * 2^-6.
func e4m3ToF32(b byte) float32 {
	sign := float32(1)
	if b&0x80 != 0 {
		sign = -1
	}
	exp := int(b>>3) & 0xF
	man := float32(b & 0x7)
	switch {
	case exp == 0xF && b&0x7 == 0x7:
		return float32(math.Copysign(math.NaN(), float64(sign)))
	case exp == 0:
		return sign * man / 8 * float32(math.Ldexp(1, -6))
	}
	return sign * (1 + man/8) * float32(math.Ldexp(1, exp-7))
}

// e5m2ToF32 decodes torch.float8_e5m2, an IEEE-style format: 5 exponent bits
// (bias 15), 2 mantissa bits, infinities and NaNs at exponent 31.
func e5m2ToF32(b byte) float32 {
	sign := float32(1)
	if b&0x80 != 0 {
		sign = -1
	}
	exp := int(b>>2) & 0x1F
	man := float32(b & 0x3)
	switch {
	case exp == 0x1F && man == 0:
		return sign * float32(math.Inf(1))
	case exp == 0x1F:
		return float32(math.Copysign(math.NaN(), float64(sign)))
	case exp == 0:
		return sign * man / 4 * float32(math.Ldexp(1, -14))
	}
	return sign * (1 + man/4) * float32(math.Ldexp(1, exp-15))
}

// e8m0ToF32 decodes the unsigned power-of-two scale format (OCP MX E8M0):
// 2^(b-127), with 0xFF the NaN encoding.
func e8m0ToF32(b byte) float32 {
	if b == 0xFF {
		return float32(math.NaN())
	}
	return float32(math.Ldexp(1, int(b)-127))
}

// BF16ToF32 widens a bfloat16 bit pattern exactly.
func BF16ToF32(u uint16) float32 { return math.Float32frombits(uint32(u) << 16) }

// F32ToBF16 rounds to the nearest bfloat16, ties to even, as torch's
// .to(torch.bfloat16) does. NaNs stay NaN (quiet, sign kept).
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if f != f {
		return uint16(u>>16) | 0x0040
	}
	u += 0x7FFF + (u>>16)&1
	return uint16(u >> 16)
}

// RoundBF16 rounds f to the nearest bf16-representable float32.
func RoundBF16(f float32) float32 { return BF16ToF32(F32ToBF16(f)) }

// F16ToF32 widens an IEEE half-precision bit pattern exactly.
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

// E4M3ToF32, E5M2ToF32 and E8M0ToF32 decode one 8-bit float.
func E4M3ToF32(b byte) float32 { return e4m3Table[b] }
func E5M2ToF32(b byte) float32 { return e5m2Table[b] }
func E8M0ToF32(b byte) float32 { return e8m0Table[b] }

// Decodable reports whether Decode can widen dtype to float32.
func Decodable(dtype safetensors.DType) bool {
	switch dtype {
	case safetensors.BF16, safetensors.F16, safetensors.F32, safetensors.F64,
		safetensors.F8E4M3, safetensors.F8E5M2, safetensors.F8E8M0:
		return true
	}
	return false
}

// Decode widens little-endian elements of dtype in src to float32 in dst.
// len(src) must be exactly len(dst) * dtype.Size().
func Decode(dtype safetensors.DType, src []byte, dst []float32) error {
	if !Decodable(dtype) {
		return fmt.Errorf("dtype %s is not a floating-point type validate can read", dtype)
	}
	if len(src) != len(dst)*dtype.Size() {
		return fmt.Errorf("decoding %s: %d bytes for %d elements", dtype, len(src), len(dst))
	}
	switch dtype {
	case safetensors.BF16:
		for i := range dst {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case safetensors.F16:
		for i := range dst {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case safetensors.F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case safetensors.F64:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
		}
	case safetensors.F8E4M3:
		decodeTable(&e4m3Table, src, dst)
	case safetensors.F8E5M2:
		decodeTable(&e5m2Table, src, dst)
	case safetensors.F8E8M0:
		decodeTable(&e8m0Table, src, dst)
	}
	return nil
}

func decodeTable(t *[256]float32, src []byte, dst []float32) {
	dst = dst[:len(src)]
	for i, b := range src {
		dst[i] = t[b]
	}
}

// FP8Block is the edge of DeepSeek's square quantisation blocks
// (quantization_config.weight_block_size [128,128]).
const FP8Block = 128

// ScaleDims is the shape of the weight_scale_inv of a rows x cols weight
// quantised in blocks of bo rows by bi columns.
func ScaleDims(rows, cols, bo, bi int) (int, int) {
	return (rows + bo - 1) / bo, (cols + bi - 1) / bi
}

// DequantFP8 decodes an F8_E4M3 rows x cols weight whose element (r,c) is
// scaled by scale[r/bo][c/bi] (scale has ScaleDims(rows, cols, bo, bi)),
// writing rows*cols float32 values to dst: fp8 value times scale, rounded
// once to float32, as weight.float() * scale does. It builds one scaled copy
// of the 256-entry table per block so each element costs a single lookup.
func DequantFP8(src []byte, rows, cols int, scale []float32, bo, bi int, dst []float32) error {
	if bo <= 0 || bi <= 0 {
		return fmt.Errorf("fp8 block size %dx%d", bo, bi)
	}
	if rows < 0 || cols < 0 || len(src) != rows*cols || len(dst) != rows*cols {
		return fmt.Errorf("fp8 dequant: %d bytes, %d outputs for a %dx%d weight", len(src), len(dst), rows, cols)
	}
	sr, sc := ScaleDims(rows, cols, bo, bi)
	if len(scale) != sr*sc {
		return fmt.Errorf("fp8 dequant: %d scales for a %dx%d weight, want %dx%d", len(scale), rows, cols, sr, sc)
	}
	var tab [256]float32
	for br := range sr {
		r0, r1 := br*bo, min((br+1)*bo, rows)
		for bc := range sc {
			c0, c1 := bc*bi, min((bc+1)*bi, cols)
			s := scale[br*sc+bc]
			for i := range tab {
				tab[i] = e4m3Table[i] * s
			}
			for r := r0; r < r1; r++ {
				row := src[r*cols+c0 : r*cols+c1]
				out := dst[r*cols+c0 : r*cols+c1]
				out = out[:len(row)] // lets the compiler drop the bounds check
				for i, b := range row {
					out[i] = tab[b]
				}
			}
		}
	}
	return nil
}
