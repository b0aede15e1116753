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

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
)

// BF16ToF32 and F32ToBF16 forward to numfmt for the kernels tests, which
// call them through validate; new code calls numfmt directly.
func BF16ToF32(u uint16) float32 { return numfmt.BF16ToF32(u) }
func F32ToBF16(f float32) uint16 { return numfmt.F32ToBF16(f) }

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
			dst[i] = numfmt.BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case safetensors.F16:
		for i := range dst {
			dst[i] = numfmt.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
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
		decodeBytes(numfmt.E4M3ToF32, src, dst)
	case safetensors.F8E5M2:
		decodeBytes(numfmt.E5M2ToF32, src, dst)
	case safetensors.F8E8M0:
		decodeBytes(numfmt.E8M0ToF32, src, dst)
	}
	return nil
}

// decodeBytes widens one-byte floats; numfmt's decoders are table lookups.
func decodeBytes(dec func(byte) float32, src []byte, dst []float32) {
	dst = dst[:len(src)]
	for i, b := range src {
		dst[i] = dec(b)
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
				tab[i] = numfmt.E4M3ToF32(byte(i)) * s
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
