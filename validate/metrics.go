package validate

import (
	"fmt"
	"math"
)

// Diff compares an output with its reference, all in float64.
type Diff struct {
	RelL2   float64 `json:"rel_l2"`  // ||got - want|| / ||want||
	MaxAbs  float64 `json:"max_abs"` // max |got - want|
	Cosine  float64 `json:"cos"`     // got . want / (||got|| ||want||)
	RefNorm float64 `json:"ref_norm"`
	// Problem is why the numbers cannot be trusted ("" when they can): a
	// reference of zeros makes every relative error meaningless, and a
	// non-finite value poisons all three.
	Problem string `json:"problem,omitempty"`
}

// minRefRMS is the root-mean-square below which a reference counts as
// zeros. Real MoE layer outputs on unit-variance inputs are O(1e-3..1) per
// element; 1e-12 is far below any of them and far above float32 underflow
// noise, so a layer whose experts were zeroed or never ran is refused
// rather than "matched" by another all-zero output.
const minRefRMS = 1e-12

// Compare computes the Diff of got against want.
func Compare(got, want []float32) Diff {
	if len(got) != len(want) || len(want) == 0 {
		return Diff{Problem: fmt.Sprintf("compared %d values with %d", len(got), len(want)), RelL2: math.Inf(1), MaxAbs: math.Inf(1)}
	}
	var dd, gg, ww, gw, maxAbs float64
	for i, w := range want {
		g, w := float64(got[i]), float64(w)
		d := g - w
		dd += d * d
		gg += g * g
		ww += w * w
		gw += g * w
		maxAbs = math.Max(maxAbs, math.Abs(d))
	}
	diff := Diff{MaxAbs: maxAbs, RefNorm: math.Sqrt(ww)}
	switch {
	case math.IsNaN(dd) || math.IsInf(dd, 0) || math.IsNaN(gg+ww) || math.IsInf(gg+ww, 0):
		diff.Problem = "non-finite values in the output or the reference"
		diff.RelL2, diff.MaxAbs = math.Inf(1), math.Inf(1)
		return diff
	case math.Sqrt(ww/float64(len(want))) < minRefRMS:
		diff.Problem = "the reference is all zeros: refusing to compare on zeros"
		diff.RelL2 = math.Inf(1)
		return diff
	}
	diff.RelL2 = math.Sqrt(dd) / diff.RefNorm
	if gg > 0 {
		diff.Cosine = gw / (math.Sqrt(gg) * diff.RefNorm)
	}
	return diff
}

// Tolerance is the acceptance threshold for one comparison situation.
type Tolerance struct {
	Name     string  `json:"name"`
	MaxRelL2 float64 `json:"max_rel_l2"`
	// MinCosine follows from MaxRelL2 (for small errors 1 - cos is about
	// rel_l2^2 / 2): it is checked too so a report never shows a pass with an
	// implausible cosine, but rel_l2 is the number that decides.
	MinCosine float64 `json:"min_cos"`
	Reason    string  `json:"reason"`
}

// The tolerances validate applies. Each mutation the test suite plants
// (gate/up swapped, experts swapped, rsf folded twice or lost, a shared
// replica dropped, a bf16-rounded correction bias, a wrong FP8 scale block, a
// transposed down projection) moves the layer output by 1e-2 to 1 relative
// L2, at least 10x above every threshold here.
var (
	// TolFP32 is for float32 compute on identical weights (bf16 or fp8 bytes
	// copied unchanged, FP8 rsf folded into the F32 scales). The two paths
	// differ only in summation order and precision (reference float64
	// accumulation, fused float32 Sgemm): about sqrt(H) * 2^-24, i.e. 1e-7
	// to 1e-6 relative for H up to 7168. Folding rsf into an F32 block scale
	// rounds once, 2^-24 relative. 1e-5 leaves a 10x margin.
	TolFP32 = Tolerance{Name: "fp32", MaxRelL2: 1e-5, MinCosine: 1 - 1e-8,
		Reason: "float32 on identical weights: only summation order differs (~1e-6 at H=7168)"}
	// TolBF16Fold is for rsf folded into bf16/f16/f32 routed down weights
	// (--fold-scaling down): each weight times 2.5 rounds to 8 mantissa bits,
	// a relative change up to 2^-9 per weight, which moved an HF DeepSeek-V3
	// bf16 layer output by about 1.3e-3 relative L2 (numerics.md). 5e-3 is
	// ~4x that while an rsf lost or doubled is > 0.3.
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

// Verdict applies tol to d: "" when it passes, else the reason it fails.
func (tol Tolerance) Verdict(d Diff) string {
	switch {
	case d.Problem != "":
		return d.Problem
	case !(d.RelL2 <= tol.MaxRelL2):
		return fmt.Sprintf("rel_l2 %.3g > %.3g (%s)", d.RelL2, tol.MaxRelL2, tol.Name)
	case !(d.Cosine >= tol.MinCosine):
		return fmt.Sprintf("cos %.9f < %.9f (%s)", d.Cosine, tol.MinCosine, tol.Name)
	}
	return ""
}

// WeightsMatch compares routing weights for the ids both routings chose
// with the serving-kernel tests' tolerance (rtol 1e-4, atol 1e-5),
// returning the largest |got - want| - rtol*|want| excess (<= atol passes).
// got and want are [T,K] (ids gotIDs/wantIDs); ids only one side chose are
// left to TopKAgreement.
func WeightsMatch(gotIDs []int32, got []float32, wantIDs []int32, want []float32, t, k int) (maxErr float64, ok bool) {
	const rtol, atol = 1e-4, 1e-5
	ok = true
	for i := range t {
		for a := range k {
			for b := range k {
				if gotIDs[i*k+a] != wantIDs[i*k+b] {
					continue
				}
				g, w := float64(got[i*k+a]), float64(want[i*k+b])
				d := math.Abs(g - w)
				maxErr = math.Max(maxErr, d)
				if !(d <= atol+rtol*math.Abs(w)) {
					ok = false
				}
			}
		}
	}
	return maxErr, ok
}
