package cpuref

import (
	"fmt"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// BF16ToF32 and F32ToBF16 forward to numfmt for the kernels tests, which
// call them through validate; new code calls numfmt directly.
func BF16ToF32(u uint16) float32 { return numfmt.BF16ToF32(u) }
func F32ToBF16(f float32) uint16 { return numfmt.F32ToBF16(f) }

// Decodable reports whether Decode can widen dtype to float32.
func Decodable(dtype safetensors.DType) bool { return weightfmt.Decodable(dtype) }

// Decode widens little-endian elements of dtype in src to float32 in dst.
// len(src) must be exactly len(dst) * dtype.Size().
func Decode(dtype safetensors.DType, src []byte, dst []float32) error {
	if !Decodable(dtype) {
		return fmt.Errorf("dtype %s is not a floating-point type validate can read", dtype)
	}
	return weightfmt.Decode(dtype, src, dst)
}

// FP8Block is the edge of DeepSeek's square quantisation blocks, the block
// of a matrixRef that names a scale but no block.
const FP8Block = weightfmt.FP8DefaultBlock

// ScaleDims is the shape of the weight_scale_inv of a rows x cols weight
// quantised in blocks of bo rows by bi columns.
func ScaleDims(rows, cols, bo, bi int) (int, int) {
	return (rows + bo - 1) / bo, (cols + bi - 1) / bi
}

// DequantFP8 is weightfmt.DequantE4M3: an F8_E4M3 rows x cols weight times
// its [ScaleDims] grid of block scales, as float32.
func DequantFP8(src []byte, rows, cols int, scale []float32, bo, bi int, dst []float32) error {
	return weightfmt.DequantE4M3(src, rows, cols, scale, bo, bi, dst)
}
