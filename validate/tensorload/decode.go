package tensorload

import (
	"fmt"

	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

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

// FP8Block is the edge of DeepSeek's square quantisation blocks, which
// validate's tests build their FP8 fixtures with (the loaders ask the
// contract's or plan's Format).
const FP8Block = weightfmt.FP8DefaultBlock

// ScaleDims is the shape of the weight_scale_inv of a rows x cols weight
// quantised in blocks of bo rows by bi columns, for validate's tests (the
// loaders ask weightfmt.Matrix.ScaleShape).
func ScaleDims(rows, cols, bo, bi int) (int, int) {
	return (rows + bo - 1) / bo, (cols + bi - 1) / bi
}
