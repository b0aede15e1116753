package judge

import "fmt"

// The tolerances validate applies. Each mutation the test suite plants
// (gate/up swapped, experts swapped, rsf folded twice or lost, a shared
// replica dropped, a bf16-rounded correction bias, a wrong FP8 scale block, a
// transposed down projection) moves the layer output by 1e-2 to 1 relative
// L2, at least 10x above every threshold here.
var (
	// TolFP32 is for float32 compute on identical weights (bf16 or fp8 bytes
	// copied unchanged, FP8 rsf folded into the F32 scales). The two paths
	// differ only in summation order and precision (reference float64
	// accumulation, fused float32 sums): about sqrt(H) * 2^-24, i.e. 1e-7
	// to 1e-6 relative for H up to 7168. Folding rsf into an F32 block scale
	// rounds once, 2^-24 relative. 1e-5 leaves a 10x margin.
	//
	// The CPU products (internal/blasdot's AVX2/FMA kernel) are neither
	// gonum's order nor, in the reference, float64 products: both paths
	// multiply-add in float32, each output in order in a lane of its own
	// (issue 45: float64 products ran at a quarter of the speed). The fused
	// path sums pieces of 256 elements so and adds them in float32; the
	// reference sums pieces of 128 and adds them in float64, rounding once
	// to float32. Their worst cases, u = 2^-24 and S the sum of the
	// products' magnitudes: fused (256 + k/256 + 2) u S, reference u |exact|
	// + 130 u S. Measured against exact dot products at k 2048..14336 on
	// random normals: fused 2.3e-7..3.6e-7 relative L2 (gonum's order
	// 2.6e-7..7.0e-7), reference 1.8e-7..2.3e-7 (1.2e-7..1.6e-7 with
	// pieces of 64, 2.7e-8 when it summed float64 products), the two apart
	// 2.3e-7..3.7e-7, what this tolerance bounds: 27x under it. Data whose
	// sums are exact stay exact (blasdot.TestDeviationFromExact holds the
	// fused path under 5e-7, the reference under 3e-7, the two apart
	// under 8e-7). The router's logits keep gonum's float64 Dsdot, so no
	// routing moves. The bound and its margin stand.
	TolFP32 = Tolerance{Name: "fp32", MaxRelL2: 1e-5, MinCosine: 1 - 1e-8,
		Reason: "float32 on identical weights: only summation order differs (~1e-6 at H=7168)"}
	// TolBF16Fold is for rsf folded into bf16/f16/f32 routed down weights
	// (--fold-scaling down): each weight times 2.5 rounds to 8 mantissa bits,
	// a relative change up to 2^-9 per weight, which moved an HF DeepSeek-V3
	// bf16 layer output by about 1.3e-3 relative L2 (measured on the HF
	// fixture; validate/README.md's tolerance table). 5e-3 is ~4x that while
	// an rsf lost or doubled is > 0.3.
	TolBF16Fold = Tolerance{Name: "bf16-folded-rsf", MaxRelL2: 5e-3, MinCosine: 1 - 1e-4,
		Reason: "rsf folded into bf16 down weights: rounding moves the output ~1.3e-3 (HF DeepSeek-V3)"}
	// TolGolden is for the CPU paths against HF's float32 module outputs: HF
	// sums in float32 in another order (oneDNN/MKL blocking), the same
	// rounding class as TolFP32 but with an independent routing
	// implementation whose float32 logits may differ in the last bit; 1e-4
	// keeps a margin for the larger fixtures while any structural error is > 1e-2.
	TolGolden = Tolerance{Name: "hf-golden", MaxRelL2: 1e-4, MinCosine: 1 - 1e-7,
		Reason: "CPU float32 vs HF float32 module output: summation order only"}
	// TolGPUBF16 is for the GPU kernels with bf16 activations (--precision bf16):
	// bf16 keeps 8 mantissa bits (2^-9 relative per rounding) and the GEMMs
	// round activations at each stage; vLLM's MoE tests accept atol 2e-2 on
	// randn/10 inputs and SGLang's FP8 block MoE mean relative 2e-2.
	TolGPUBF16 = Tolerance{Name: "gpu-bf16", MaxRelL2: 2e-2, MinCosine: 0.999,
		Reason: "bf16 activations on the GPU: 8 mantissa bits per rounding (vLLM/SGLang use 2e-2)"}
)

// TolDequantBF16 is for a DST whose quantised weights convert --dtype bf16
// dequantised: each weight is its exact float32 dequantisation rounded
// once to nearest-even bf16, a relative change of at most 2^-8 (half an
// ulp of 8 significant bits), RMS about 1.7e-3 over uniformly placed
// mantissas. A layer's output goes through three such matrices (gate, up,
// down) whose errors are independent and add in quadrature: at most about
// sqrt(3) * 2^-8 = 6.8e-3 if every weight moved by the most, measured
// 2.3e-3..3.4e-3 whole-layer and up to 5.9e-3 for one forced token on the
// synth presets of every format (validate/README.md). Twice the bound,
// 1.35e-2, leaves that margin, while an ignored scale or a wrong expert
// moves the output by 0.1 to 1. Bit exactness is the byte proof's: it
// requires every dequantised value to be the one rounding, so a double
// rounding or a truncation, which this tolerance would pass, fails there.
var TolDequantBF16 = Tolerance{Name: "bf16-dequantised", MaxRelL2: 1.35e-2, MinCosine: 1 - 1e-4,
	Reason: "weights dequantised and rounded once to bf16: at most 2^-8 each, three matrices in quadrature (sqrt(3)*2^-8 = 6.8e-3), x2"}

// TolDequantF16 is TolDequantBF16 for --dtype f16: one rounding to 11
// significant bits, at most 2^-11 a weight, 2*sqrt(3)*2^-11 = 1.7e-3.
var TolDequantF16 = Tolerance{Name: "f16-dequantised", MaxRelL2: 1.7e-3, MinCosine: 1 - 2e-6,
	Reason: "weights dequantised and rounded once to f16: at most 2^-11 each, three matrices in quadrature, x2"}

// TolGPUF32 is for the GPU kernels in f32 mode (f32 activations, weights as
// stored) against float32/float64 CPU paths or each other on identical
// weights: f32 accumulation in another order, measured 2.6e-7..5.8e-7 by the
// kernels' tests; 1e-5 as TolFP32.
var TolGPUF32 = Tolerance{Name: "gpu-f32", MaxRelL2: 1e-5, MinCosine: 1 - 1e-8,
	Reason: "f32 activations on the GPU: only summation order differs (kernels measured <= 5.8e-7)"}

// TolGPUW8A8 is for the GPU kernels in w8a8 mode (--precision fp8) against
// the CPU reference in the same numerics (cpuref.RefOptions.W8A8) or each
// other: the tensor cores' truncated fp8 accumulation (~1.7e-4 a GEMM) flips
// ~20% of the intermediate's bf16 roundings and ~2% of its e4m3 codes, which
// the kernels' tests measured at 3.5e-3..4.9e-3 over both stages against
// the twin (kernels/GEMM_NOTES.md); bf16 mode's 2e-2 keeps a 4x
// margin and the same sensitivity to conversion errors.
var TolGPUW8A8 = Tolerance{Name: "gpu-w8a8", MaxRelL2: 2e-2, MinCosine: 0.999,
	Reason: "w8a8 on the GPU vs the w8a8 CPU reference: fp8 tensor-core accumulation and e4m3 code flips (kernels measured <= 4.9e-3)"}

// TolW8A8Golden is for a w8a8 path against HF's float32 goldens: two e4m3
// roundings of every expert GEMM's input (~3% RMS each) in quadrature,
// measured 0.042..0.044 relative L2 on random data (validate/README.md);
// 0.08 is the top of that band. Mutations below it are caught only by the
// w8a8 checks against the CPU reference.
var TolW8A8Golden = Tolerance{Name: "w8a8-vs-golden", MaxRelL2: 8e-2, MinCosine: 0.995,
	Reason: "w8a8 numerics vs float32 HF outputs: two 3-bit roundings per expert (0.01..0.08 band)"}

// Numerics is how the compared paths computed: it picks a check's
// tolerance together with the contract's folding.
type Numerics int

const (
	// CPU: the reference (float32 pieces added in float64) and the float32
	// fused twin.
	CPU Numerics = iota
	// GPUBF16: the GPU kernels with bf16 activations (--precision bf16).
	GPUBF16
	// GPUF32: the GPU kernels with f32 activations.
	GPUF32
	// GPUW8A8: the GPU kernels in w8a8 (--precision fp8), with the CPU
	// reference in the same numerics.
	GPUW8A8
)

// Situation is everything a check's tolerance depends on.
type Situation struct {
	Numerics Numerics
	// RoundedFold is true when the contract folded rsf into weights that are
	// not FP8-quantised, so DST's weights were rounded (TolBF16Fold), or
	// into BF16/F16 FP8 scales (per channel or per tensor), rounded as
	// coarsely; FP8 block folding touches only the F32 scales and leaves
	// the weights identical.
	RoundedFold bool
	// Dequantised is the dtype DST's dequantised weights were rounded to
	// (convert --dtype: "BF16", "F16"); "" or "F32" where they were not
	// rounded (F32 holds the exact dequantisation, as SRC's reference
	// computes it).
	Dequantised string
	// Requant is the quantization DST's fused shared expert was
	// requantised into (its contract's shared_requantized), "" when it was
	// not: its paths are then judged against SRC's unrequantised ones at
	// the format's requantisation tolerance, derived from RequantStats
	// where the layer's reference measured them.
	Requant      string
	RequantStats RequantStats
}

// RequantStats is what requantising a layer's shared expert did, measured
// by the reference that ran it both ways.
type RequantStats struct {
	// WeightErr is sqrt(sum over gate, up and down of (||Wq - W|| /
	// ||W||)^2): the shared MLP's relative error to first order.
	WeightErr float64 `json:"weight_rel_err"`
	// Share is ||shared(x)|| / ||y|| over the routed tokens: how much of
	// the layer output the shared expert is.
	Share float64 `json:"shared_share"`
}

// folded widens a tolerance tighter than TolBF16Fold to it when DST's
// weights were rounded by folding rsf, and one tighter than
// TolDequantBF16 or TolDequantF16 to it when they were rounded by
// dequantising.
func folded(base Tolerance, s Situation) Tolerance {
	if s.RoundedFold && base.MaxRelL2 < TolBF16Fold.MaxRelL2 {
		base = TolBF16Fold
	}
	if d, ok := dequantised[s.Dequantised]; ok && base.MaxRelL2 < d.MaxRelL2 {
		base = d
	}
	return base
}

// The requantisation tolerances judge a fused path whose shared expert was
// quantised from BF16 (fuse-shared --requantize-shared) against SRC's
// reference with the BF16 shared expert: the error is the format's, not
// moeprep's, and the row reports it with the bound it is held to.
//
// Rounding to the nearest code moves each weight by at most half a step
// (INT4: amax/15 of its group, E4M3: 2^-4 of the weight), at random with
// respect to the input; to first order the shared MLP's output then moves
// by the three projections' relative errors in quadrature, WeightErr (on
// random normal and heavy-tailed shared experts of 512x2048 the measured
// ratio was 0.99 to 1.07, INT4 groups of 32 and 128, per channel, FP8
// blocks, channel, tensor), and the layer output by that times the shared
// expert's Share of it. The bound is twice that product: a wrong rule (a
// scale off by a factor, codes not clamped, a sign lost) moves the output
// by the shared expert's whole share, far above it; wrong bytes are the
// exact checks' (fused-vs-reference against the same requantisation) and
// the byte proof's to find. How large WeightErr is comes from the step:
// INT4's 1/7.5 of a group's largest weight gave 0.16 (groups of 32) to 0.24
// (one scale a row) for normal weights and 0.22 to 0.61 for heavy-tailed
// ones; E4M3's 3 mantissa bits gave 0.046. Where no reference measured
// them (a golden without SRC), the fixed tolerances below hold: the
// largest WeightErr measured above for each format with the margin, at a
// share of 1.
func requantTolerance(s Situation) Tolerance {
	st := s.RequantStats
	if st.WeightErr > 0 {
		tol := max(2*st.WeightErr*st.Share, TolFP32.MaxRelL2)
		return Tolerance{Name: "requant-" + s.Requant, MaxRelL2: tol, MinCosine: 1 - tol*tol,
			Reason: fmt.Sprintf("shared expert requantised to %s: 2 x its weights' relative error %.3g x its share %.3g of the output", s.Requant, st.WeightErr, st.Share)}
	}
	if s.Requant == "int4_pack" {
		return TolRequantINT4
	}
	return TolRequantFP8
}

var (
	// TolRequantINT4: INT4's largest shared-MLP error measured (0.61,
	// heavy-tailed weights, one scale a row) with margin, at a share of 1.
	TolRequantINT4 = Tolerance{Name: "requant-int4", MaxRelL2: 1, MinCosine: 0.5,
		Reason: "shared expert requantised to INT4, no reference to measure it: up to 0.61 of the shared output measured, share 1"}
	// TolRequantFP8: E4M3's (0.047) with a 2x margin, at a share of 1.
	TolRequantFP8 = Tolerance{Name: "requant-fp8", MaxRelL2: 0.1, MinCosine: 0.99,
		Reason: "shared expert requantised to FP8 E4M3, no reference to measure it: about 0.047 of the shared output, share 1"}
)

// dequantised is the tolerance of weights rounded once to each dtype.
var dequantised = map[string]Tolerance{"BF16": TolDequantBF16, "F16": TolDequantF16}
