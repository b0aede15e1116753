package judge

import (
	"fmt"
	"math"

	"github.com/moeprep/moeprep/moe"
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

// RoutingAgreement compares got's routing with want's: ids tie-robustly
// against scores (a different id is wrong only when its score is beyond
// moe.TieTolerance of the one it displaced), or, where scores took its ids
// from a hash table (Hashed), as the same multiset of table entries per
// token (moe.HashAgreement), weights on the ids both chose
// (WeightsMatch). topK is the matching fraction (NaN when the ids could not
// be compared), maxErr the largest weight difference; reason is "" when
// both agree, else why not, in the words of a report row.
func RoutingAgreement(gotIDs []int32, gotW []float32, wantIDs []int32, wantW []float32, scores *moe.Routing) (topK, maxErr float64, reason string) {
	topK = math.NaN()
	okIDs, total, err := 0, 0, error(nil)
	beyond := "beyond ties"
	if scores.Hashed {
		okIDs, total, err = moe.HashAgreement(gotIDs, wantIDs, scores.T, scores.K)
		beyond = "taken from the hash table"
	} else {
		okIDs, total, err = moe.TopKAgreement(gotIDs, wantIDs, scores.T, scores.K, scores.Choice, len(scores.Choice)/max(scores.T, 1), moe.TieTolerance)
	}
	switch {
	case err != nil:
		reason = err.Error()
	default:
		topK = float64(okIDs) / float64(total)
		if okIDs != total {
			reason = fmt.Sprintf("routing differs on %d of %d ids %s", total-okIDs, total, beyond)
		}
	}
	maxErr, ok := WeightsMatch(gotIDs, gotW, wantIDs, wantW, scores.T, scores.K)
	if !ok {
		reason = Join(reason, fmt.Sprintf("routing weights differ by %.3g (rtol 1e-4, atol 1e-5)", maxErr))
	}
	return topK, maxErr, reason
}

// Join appends one reason to another with "; ", either may be "".
func Join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
