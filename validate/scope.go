package validate

import (
	"slices"

	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/moelayer"
)

// splitLayers divides the MoE layers into those the layer checks run on
// (targets) and the rest, which the report names as not checked.
func splitLayers(all []int, targets []target) (checked, notChecked []int) {
	for _, tg := range targets {
		checked = append(checked, tg.index)
	}
	for _, l := range all {
		if !slices.Contains(checked, l) {
			notChecked = append(notChecked, l)
		}
	}
	return checked, notChecked
}

// expertGaps lists the checked layers whose bank experts were not all
// exercised, counted as finishCoverage counts them: the forced tokens'
// experts where they ran, else the routed tokens'. Where forced tokens ran,
// the experts they missed are named: the forced routing is drawn again
// from the seed, exactly as the run drew it, and its shared slots numbered
// as FusedSlots numbers them after the routed tokens.
func (s *session) expertGaps(targets []target, rep *Report) []ExpertGap {
	var gaps []ExpertGap
	for _, tg := range targets {
		var g ExpertGap
		routedT := -1
		for _, row := range rep.Rows {
			if row.Layer != tg.index || row.Experts == 0 {
				continue
			}
			cov := judge.IsCoverage(row.Check)
			switch {
			case cov && !g.Forced:
				g = ExpertGap{Layer: tg.index, Exercised: row.ExpertsUsed, Total: row.Experts, Forced: true}
			case cov || !g.Forced:
				g.Layer, g.Exercised, g.Total = tg.index, max(g.Exercised, row.ExpertsUsed), max(g.Total, row.Experts)
			}
			if !cov {
				routedT = row.Tokens
			}
		}
		if g.Total == 0 || g.Exercised >= g.Total {
			continue
		}
		if g.Forced && routedT >= 0 {
			if ids := s.forcedBankIDs(tg, routedT); len(ids) == g.Exercised {
				for id := range g.Total {
					if !slices.Contains(ids, id) {
						g.NotExercised = append(g.NotExercised, id)
					}
				}
			}
		}
		gaps = append(gaps, g)
	}
	return gaps
}

// forcedBankIDs are the distinct bank experts the forced tokens of layer
// tg reached after t routed tokens, sorted; nil when they cannot be drawn
// again.
func (s *session) forcedBankIDs(tg target, t int) []int {
	if s.contract == nil {
		return nil
	}
	cov, err := s.coverageFor(tg, s.dstPlanOrSrc().HiddenSize)
	if err != nil || cov == nil {
		return nil
	}
	all := &moe.Routing{T: t + cov.T, K: cov.K, IDs: make([]int32, (t+cov.T)*cov.K), Weights: make([]float32, (t+cov.T)*cov.K)}
	copy(all.IDs[t*cov.K:], cov.Routing.IDs)
	copy(all.Weights[t*cov.K:], cov.Routing.Weights)
	fs, err := moelayer.FusedSlots(all, s.contract)
	if err != nil {
		return nil
	}
	var ids []int
	for _, id := range fs.IDs[t*fs.K:] {
		if !slices.Contains(ids, int(id)) {
			ids = append(ids, int(id))
		}
	}
	slices.Sort(ids)
	return ids
}
