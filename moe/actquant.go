package moe

import (
	"math"

	"github.com/moeprep/moeprep/internal/numfmt"
)

// W8A8 serving numerics: block-FP8 engines
// (DeepSeek's inference code, SGLang's and vLLM's fused MoE with
// use_fp8_w8a8) quantise the activations of each expert GEMM to
// float8_e4m3fn per token per ActGroup consecutive channels, one float32
// scale a group, and multiply fp8 x fp8 on the tensor cores with the
// weights' 128x128 block scales. Within one 128-wide K block the fp8
// products are summed, then scaled by the activation group's scale times
// the weight block's scale. Dequantising both operands to float32 first and
// multiplying in float32, as the CPU twin does, computes the same function
// up to float32 rounding of the scale products, summation order and the
// tensor cores' own accumulation: on Hopper they sum each k32 chain with a
// truncated mantissa, ~1.7e-4 relative L2 a GEMM on random codes (measured
// on the H100, kernels/GEMM_NOTES.md), which the GPU tests'
// tolerances against this twin allow for.

// ActGroup is the width of an activation quantisation group: 128, the K
// extent of the weights' scale blocks, so one activation scale and one
// weight scale cover each K block.
const ActGroup = 128

// actQuantEps is the smallest amax a group's scale is made from, so that an
// all-zero group gets a finite scale (its codes are all zero either way).
// SGLang and vLLM use 1e-10.
const actQuantEps = 1e-10

// QuantizeActGroups quantises each row of x [rows, cols] to e4m3 in groups
// of group consecutive columns (the last group of a row may be shorter):
// scale = max(amax, eps) / 448 in float32, code = e4m3(x / scale) rounded
// to nearest, ties to even, saturating at +-448. q receives rows*cols codes,
// scales rows*ceil(cols/group) scales, row-major. Non-finite input: a NaN
// anywhere in a group makes its scale NaN (amax is NaN), as in the engines.
func QuantizeActGroups(x []float32, rows, cols, group int, q []byte, scales []float32) {
	ng := (cols + group - 1) / group
	for r := range rows {
		row := x[r*cols : (r+1)*cols]
		for g := range ng {
			lo, hi := g*group, min((g+1)*group, cols)
			amax := float32(actQuantEps)
			nan := false
			for _, v := range row[lo:hi] {
				a := float32(math.Abs(float64(v)))
				if a != a {
					nan = true
				}
				amax = max(amax, a)
			}
			s := amax / numfmt.E4M3Max
			if nan {
				s = float32(math.NaN())
			}
			scales[r*ng+g] = s
			for c := lo; c < hi; c++ {
				q[r*cols+c] = numfmt.F32ToE4M3(row[c] / s)
			}
		}
	}
}

// RoundTripServing replaces each row of x [rows, cols] by what a w8a8
// kernel multiplies when x is an activation engines hold in bf16 (a layer
// input, or the activated intermediate): each value rounded to bf16, then
// RoundTripActGroups over groups of ActGroup channels.
func RoundTripServing(x []float32, rows, cols int) {
	for i, v := range x {
		x[i] = numfmt.RoundBF16(v)
	}
	RoundTripActGroups(x, rows, cols, ActGroup)
}

// RoundTripActGroups replaces each row of x [rows, cols] by what a w8a8
// kernel multiplies: its e4m3 codes times their group's scale, in float32.
// Its scratch is one row of codes and scales.
func RoundTripActGroups(x []float32, rows, cols, group int) {
	ng := (cols + group - 1) / group
	q := make([]byte, cols)
	s := make([]float32, ng)
	for r := range rows {
		row := x[r*cols : (r+1)*cols]
		QuantizeActGroups(row, 1, cols, group, q, s)
		for c := range row {
			row[c] = numfmt.E4M3ToF32(q[c]) * s[c/group]
		}
	}
}
