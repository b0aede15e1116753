package validate

import (
	"fmt"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/moelayer"
	"math"
	"slices"
)

// tokenRows returns rows [lo,hi) of a [T,H] matrix.
func tokenRows(y []float32, h, lo, hi int) []float32 { return y[lo*h : hi*h] }

// CoverageVerdict is the per-expert reading of a coverage comparison.
type CoverageVerdict struct {
	Exercised, Total int
	// WorstToken is the largest per-token relative L2 error over the forced tokens.
	WorstToken float64
	// Suspects are bank experts all of whose forced tokens exceed the
	// tolerance, worst first (at most 8): the likely corrupted ones.
	Suspects []int
}

// judgeCoverage compares the forced tokens' outputs token by token: a
// corrupted expert shows in every token it serves, however little its share
// of the whole set. bankIDs [Tc,Kb] are the forced tokens' bank slots (routed
// and shared) on the fused side; total is the bank size; skipped lists bank
// experts deliberately left out (a --sample-experts run).
func judgeCoverage(r *LayerResult, got, want []float32, h int, bankIDs []int32, kb, total int, sampled bool, tol judge.Tolerance) CoverageVerdict {
	tc := len(want) / h
	v := CoverageVerdict{Total: total}
	d := judge.Compare(got, want)
	perToken := make([]float64, tc)
	for i := range tc {
		td := judge.Compare(tokenRows(got, h, i, i+1), tokenRows(want, h, i, i+1))
		perToken[i] = td.RelL2
		if math.IsNaN(td.RelL2) {
			perToken[i] = math.Inf(1)
		}
		v.WorstToken = max(v.WorstToken, perToken[i])
	}
	// Each bank expert's score is its best token: only an expert whose
	// every token fails is a suspect, and the one with the most failing
	// tokens comes first (a corrupted shared replica fails all of its many).
	score := map[int32]float64{}
	fails := map[int32]int{}
	for i := range tc {
		for _, id := range bankIDs[i*kb : (i+1)*kb] {
			if s, ok := score[id]; !ok || perToken[i] < s {
				score[id] = perToken[i]
			}
			if perToken[i] > tol.MaxRelL2 {
				fails[id]++
			}
		}
	}
	v.Exercised = len(score)
	for id, s := range score {
		if s > tol.MaxRelL2 {
			v.Suspects = append(v.Suspects, int(id))
		}
	}
	slices.SortFunc(v.Suspects, func(a, b int) int {
		fa, fb := fails[int32(a)], fails[int32(b)]
		sa, sb := score[int32(a)], score[int32(b)]
		switch {
		case fa != fb:
			return fb - fa
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		}
		return a - b
	})
	if len(v.Suspects) > 8 {
		v.Suspects = v.Suspects[:8]
	}
	r.Diff, r.Tolerance = d, tol
	r.TopK = math.NaN()
	r.WorstTokenRelL2 = v.WorstToken
	r.Experts, r.ExpertsUsed = total, v.Exercised
	reason := tol.Verdict(d)
	if v.WorstToken > tol.MaxRelL2 {
		msg := fmt.Sprintf("worst forced token rel_l2 %.3g > %.3g", v.WorstToken, tol.MaxRelL2)
		if len(v.Suspects) > 0 {
			msg += fmt.Sprintf("; every token of bank expert(s) %s fails", intList(v.Suspects))
		}
		reason = join(reason, msg)
	}
	if v.Exercised < total && !sampled {
		reason = join(reason, fmt.Sprintf("only %d of %d experts exercised", v.Exercised, total))
	}
	r.Sampled = sampled
	r.Suspects = v.Suspects
	r.Reason = reason
	r.Pass = reason == ""
	return v
}

// coverageFor draws the forced tokens of one layer of a SRC+DST run, or
// returns nil when there are not both sides to compare.
func (s *session) coverageFor(tg target, h int) (*moelayer.Coverage, error) {
	if tg.src == nil || (tg.fused == nil && tg.stored == nil) || s.src == nil || s.dst == nil {
		return nil, nil
	}
	c := s.contract
	reps := 0
	if c.NumFusedSharedExperts > 0 {
		reps = c.SharedReplicas
	}
	cov, err := moelayer.NewCoverage(moelayer.CoverageOptions{Seed: s.o.Seed, Layer: tg.index, H: h, E: s.srcPlan.NumExperts,
		K: s.srcPlan.TopK, Replicas: reps, Sample: s.o.SampleExperts})
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", tg.index, err)
	}
	return cov, nil
}

// coverageRow compares the forced tokens' rows of a fused output with
// another path's.
func (s *session) coverageRow(base LayerResult, check string, fused *moelayer.FusedResult, other []float32, cov *moelayer.Coverage, h int, tol judge.Tolerance) LayerResult {
	r := base
	r.Check, r.Tokens = check, cov.T
	t0 := fused.Routing.T
	t1 := t0 + cov.T
	ids := fused.Slots.IDs[t0*fused.Slots.K : t1*fused.Slots.K]
	judgeCoverage(&r, tokenRows(fused.Y, h, t0, t1), tokenRows(other, h, t0, t1), h, ids, fused.Slots.K, s.contract.BankSize(), cov.Sampled, tol)
	return r
}

// CoverageSummary is the report's account of which experts were exercised.
type CoverageSummary struct {
	Layers    int  `json:"layers"`
	Complete  int  `json:"layers_every_expert"` // layers in which every bank expert ran
	Exercised int  `json:"experts_exercised"`   // summed over layers
	Total     int  `json:"experts_total"`
	Forced    bool `json:"forced_tokens"`            // forced coverage tokens ran (SRC and DST given)
	Sample    int  `json:"sample_experts,omitempty"` // --sample-experts N, 0: every expert
}

// Line is the report's summary line.
func (c *CoverageSummary) Line() string {
	how := "forced tokens through both paths"
	if !c.Forced {
		how = "routed tokens only: give SRC and DST to exercise every expert"
	}
	if c.Sample > 0 {
		how += fmt.Sprintf("; --sample-experts %d: a sample, not a proof of every expert", c.Sample)
	}
	return fmt.Sprintf("experts exercised: %d of %d; every expert in %d of %d layers (%s)", c.Exercised, c.Total, c.Complete, c.Layers, how)
}

// finishCoverage sums up the rows' coverage and fails the rows of a layer
// whose experts were not all exercised when no forced tokens ran (a run
// against goldens alone), unless --sample-experts accepted a partial run.
func (r *Report) finishCoverage(sample int) {
	type acc struct{ used, total int }
	layers := map[int]*acc{}
	forced := map[int]bool{}
	var order []int
	for _, row := range r.Rows {
		if row.Experts == 0 {
			continue // a non-finite row: nothing ran
		}
		a, ok := layers[row.Layer]
		if !ok {
			a = &acc{}
			layers[row.Layer] = a
			order = append(order, row.Layer)
		}
		isCov := judge.IsCoverage(row.Check)
		if isCov && !forced[row.Layer] {
			forced[row.Layer] = true
			a.used, a.total = 0, 0
		}
		if isCov || !forced[row.Layer] {
			a.used, a.total = max(a.used, row.ExpertsUsed), max(a.total, row.Experts)
		}
	}
	if len(order) == 0 {
		return
	}
	c := &CoverageSummary{Layers: len(order), Forced: len(forced) == len(order), Sample: sample}
	for _, l := range order {
		a := layers[l]
		c.Exercised += a.used
		c.Total += a.total
		if a.used >= a.total {
			c.Complete++
			continue
		}
		if forced[l] || sample > 0 {
			continue // the coverage rows judged it, or a partial run was asked for
		}
		for i := range r.Rows {
			row := &r.Rows[i]
			if row.Layer == l && row.Experts > 0 {
				row.Pass = false
				row.Reason = join(row.Reason, fmt.Sprintf("only %d of %d experts exercised by these tokens: give SRC and DST so forced tokens run every expert, or --sample-experts N to accept a partial check", a.used, a.total))
			}
		}
	}
	r.Coverage = c
}
