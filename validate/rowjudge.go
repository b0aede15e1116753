// Judging a layer's outputs into report rows, at each check's tolerance.

package validate

import (
	"fmt"
	"math"

	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/moelayer"
)

// rowJudge makes one layer's report rows: each judged in numerics against
// the check's tolerance, over the layer's t routed tokens of width h (and
// the forced coverage tokens cov, nil without) or the golden g.
type rowJudge struct {
	s        *session
	base     LayerResult
	numerics judge.Numerics
	t, h     int
	cov      *moelayer.Coverage
	g        *Golden
	// point maps the paths' outputs to the golden's point where the two
	// differ (goldenPoint); nil: the golden holds the sum.
	point *pointMap
	// requant is what the reference measured of a requantised shared
	// expert (zero: nothing measured).
	requant judge.RequantStats
}

// tolerance is the threshold of check for this layer's rows.
func (rj rowJudge) tolerance(check string) judge.Tolerance {
	return rj.s.tolerance(check, rj.numerics, rj.requant)
}

// fusedVs compares the fused path with another path's output y and routing
// rt (the reference, or the GPU's unfused path): the check's row, and the
// cover check's for the coverage tokens; sec is the two paths' time.
func (rj rowJudge) fusedVs(check, cover string, sec float64, fused *moelayer.FusedResult, y []float32, rt *moe.Routing) []LayerResult {
	rows := []LayerResult{rj.fusedRow(check, sec, fused, y, rt)}
	if rj.cov != nil {
		r := rj.s.coverageRow(rj.base, cover, fused, y, rj.cov, rj.h, rj.tolerance(cover))
		r.Seconds = sec
		rows = append(rows, r)
	}
	return rows
}

// fusedRow is fusedVs's row of the routed tokens alone.
func (rj rowJudge) fusedRow(check string, sec float64, fused *moelayer.FusedResult, y []float32, rt *moe.Routing) LayerResult {
	h, t := rj.h, rj.t
	r := rj.base
	r.Check, r.Seconds = check, sec
	fusedUsage(&r, fused, rj.s.contract)
	judgeRow(&r, judge.Compare(tokenRows(fused.Y, h, 0, t), tokenRows(y, h, 0, t)), rj.tolerance(check),
		fused.Routing.IDs, fused.Routing.Weights, rt.IDs, rt.Weights, rt)
	return r
}

// fusedVsGolden compares the fused path (on DST) with the golden.
func (rj rowJudge) fusedVsGolden(check string, sec float64, fused *moelayer.FusedResult) LayerResult {
	r := rj.base
	r.Check, r.Seconds = check, sec
	fusedUsage(&r, fused, rj.s.contract)
	y := tokenRows(fused.Y, rj.h, 0, rj.t)
	if rj.point != nil && rj.point.dst != nil {
		y = rj.point.dst(y)
	}
	judgeGolden(&r, y, fused.Routing, rj.s.contract.RoutedScalingFactor, rj.g, rj.tolerance(check))
	rj.pointReason(&r)
	return r
}

// pointReason says, on a failed golden row, which quantity was compared
// when the golden is not the sum.
func (rj rowJudge) pointReason(r *LayerResult) {
	if !r.Pass && rj.point != nil {
		r.Reason = join(r.Reason, rj.point.what)
	}
}

// srcVsGolden compares a path on SRC (output y, routing rt) with the golden.
func (rj rowJudge) srcVsGolden(check string, sec float64, y []float32, rt *moe.Routing) LayerResult {
	s := rj.s
	r := rj.base
	r.Check, r.Seconds = check, sec
	r.Experts, r.ExpertsUsed = s.srcPlan.NumExperts, distinct(rt.IDs, s.srcPlan.NumExperts)
	y = tokenRows(y, rj.h, 0, rj.t)
	if rj.point != nil && rj.point.src != nil {
		y = rj.point.src(y)
	}
	judgeGolden(&r, y, rt, s.srcPlan.RouteSpec().RoutedScalingFactor, rj.g, rj.tolerance(check))
	rj.pointReason(&r)
	return r
}

// tolerance is the threshold of the check named check when its paths
// computed in numerics: its row in judge.Checks picks it, given whether the
// contract folded rsf into values it rounded coarser than float32: plain
// weights, or the BF16/F16 scales of FP8 per channel or per tensor (FP8
// block folding touches only the F32 scales and leaves the weights
// identical; a BF16 scale rounds like a bf16 weight, 2^-9 relative, so
// the output moves no more than a folded bf16 weight moves it).
func (s *session) tolerance(check string, numerics judge.Numerics, requant judge.RequantStats) judge.Tolerance {
	c := s.contract
	roundedScales := c != nil && c.ScaleDType != "" && c.ScaleDType != "F32"
	roundedFold := c != nil && c.RoutedScalingFactorFolded && (!c.Quantized() || roundedScales)
	sit := judge.Situation{Numerics: numerics, RoundedFold: roundedFold}
	if d := s.dequantized(); d != nil {
		sit.Dequantised = d.DType
	}
	if c != nil && c.SharedRequantized != nil {
		sit.Requant, sit.RequantStats = c.SharedRequantized.Quantization, requant
	}
	return judge.Lookup(check).Tolerance(sit)
}

// requantNote says, for a DST whose shared expert was requantised, what
// that did to the checked layers' outputs (the requantized-vs-reference
// rows, each judged at its own bound), so that a run that passes does not
// pass in silence; "" for any other DST.
func (s *session) requantNote(rows []LayerResult) string {
	if s.contract == nil || s.contract.SharedRequantized == nil {
		return ""
	}
	r := s.contract.SharedRequantized
	lo, hi, maxAbs, minCos, n := math.Inf(1), 0.0, 0.0, 1.0, 0
	for _, row := range rows {
		if row.Check != judge.RequantVsReference || math.IsNaN(row.RelL2) {
			continue
		}
		lo, hi, maxAbs, minCos, n = min(lo, row.RelL2), max(hi, row.RelL2), max(maxAbs, row.MaxAbs), min(minCos, row.Cosine), n+1
	}
	what := fmt.Sprintf("DST's shared expert is SRC's %s one requantised to %s (%s: scale = amax / %g, codes in [%g, %g], %s)",
		r.SourceDType, r.Quantization, r.Rule, r.ScaleDivisor, r.CodeRange[0], r.CodeRange[1], r.Rounding)
	gpu := s.o.Device == DeviceCUDA
	if n == 0 {
		if gpu && s.src != nil && s.o.CPUCheck == CPUCheckNone {
			return what + "; no layer measured the error it adds (no CPU reference ran: --cpu-check none)"
		}
		return what + "; no layer measured the error it adds (no SRC reference ran)"
	}
	exact := fmt.Sprintf("%s is exact against the same requantisation", judge.FusedVsReference)
	if gpu {
		// The GPU's unfused path and the reference run the shared expert
		// requantised too, so the GPU's checks compare like with like.
		exact = fmt.Sprintf("%s and %s compare against the same requantisation, at the GPU's tolerance", judge.GPUFusedVsGPUUnfused, judge.GPUFusedVsReference)
	}
	return fmt.Sprintf("%s: against SRC's %s shared expert it moves the layer output by rel_l2 %.3g..%.3g, max_abs up to %.3g, cos down to %.6f over %d layers (%s rows, each within 2 x the shared weights' relative error x the shared expert's share of the output); %s",
		what, r.SourceDType, lo, hi, maxAbs, minCos, n, judge.RequantVsReference, exact)
}

// fusedUsage counts the bank experts the routed tokens chose (the forced
// coverage tokens, if any, have rows of their own).
func fusedUsage(r *LayerResult, f *moelayer.FusedResult, c *layout.Contract) {
	r.Experts = c.BankSize()
	r.ExpertsUsed = distinct(f.Slots.IDs[:f.Routing.T*f.Slots.K], r.Experts)
}

// distinct counts the experts below n that ids name (ids past them are
// LongCat-Flash's zero-compute experts, which are no expert of the bank).
func distinct(ids []int32, n int) int {
	seen := map[int32]bool{}
	for _, id := range ids {
		if int(id) < n {
			seen[id] = true
		}
	}
	return len(seen)
}

// judgeRow fills a row's numbers and verdict: the output within tol, and
// the routing (ids tie-robustly against want's scores, weights on shared
// ids) equal. Weights are compared on the same scale (both with or both
// without rsf).
func judgeRow(r *LayerResult, d judge.Diff, tol judge.Tolerance, gotIDs []int32, gotW []float32, wantIDs []int32, wantW []float32, scores *moe.Routing) {
	r.Diff, r.Tolerance = d, tol
	r.TopK = math.NaN()
	reason := tol.Verdict(d)
	if wantIDs != nil {
		var routing string
		r.TopK, r.TopKWeightMaxErr, routing = judge.RoutingAgreement(gotIDs, gotW, wantIDs, wantW, scores)
		if routing != "" {
			reason = join(reason, routing)
		}
	}
	r.Reason = reason
	r.Pass = reason == ""
}

func join(a, b string) string { return judge.Join(a, b) }

// judgeGolden compares a path's output and routing with an HF golden. The
// golden weights include rsf, so the path's are scaled by it first; ids are
// compared tie-robustly against the path's own scores.
func judgeGolden(r *LayerResult, y []float32, rt *moe.Routing, rsf float64, g *Golden, tol judge.Tolerance) {
	d := judge.Compare(y, g.Y)
	if g.IDs == nil {
		judgeRow(r, d, tol, nil, nil, nil, nil, rt)
		return
	}
	if g.K != rt.K {
		judgeRow(r, d, tol, nil, nil, nil, nil, rt)
		r.Reason = join(r.Reason, fmt.Sprintf("golden has top-%d, the config top-%d", g.K, rt.K))
		r.Pass = false
		return
	}
	w := make([]float32, len(rt.Weights))
	for i, v := range rt.Weights {
		w[i] = v * float32(rsf)
	}
	judgeRow(r, d, tol, rt.IDs, w, g.IDs, g.Weights, rt)
}
