// The layer check of a DST whose experts are stored as SRC stores them
// (layout as-stored, what convert --layout transformers writes for the
// families transformers 5 converts nothing for): no stacks exist, so the
// unfused reference runs on both sides, on the same tokens.

package validate

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/moelayer"
)

// asStored reports whether DST's contract says its experts are SRC's own
// tensors.
func (s *session) asStored() bool { return s.contract != nil && s.contract.Layout == layout.AsStored }

// checkStoredLayer runs the CPU reference on SRC's layer and on DST's
// (planned by the family from DST's own tensors, as SRC's is) and
// compares them, the forced tokens that exercise every expert included.
// The two read the same bytes through the same code, so their outputs
// must be equal bit for bit: any difference fails the row, whatever the
// tolerance would allow.
func (s *session) checkStoredLayer(ctx context.Context, tg target) ([]LayerResult, error) {
	withSrc := tg.src != nil && s.src != nil
	x, t, h, g, tokens, cov, err := s.layerStart(tg)
	if err != nil {
		return nil, err
	}
	if !withSrc && g == nil {
		return nil, fmt.Errorf("%s: layer %s: its experts are stored as the source stores them (layout %s): give SRC or a golden to check it against", s.o.Dst, tg.label(), layout.AsStored)
	}
	ro := cpuref.RefOptions{Tokens: tokens, Coverage: cov, Workers: s.o.Workers}
	var ref *moelayer.RefResult
	var refSec float64
	if withSrc {
		start := time.Now()
		if ref, err = cpuref.ReferenceLayer(ctx, s.src, s.srcPlan, tg.src, x, t, ro); err != nil {
			return nonFiniteRows(tg, t, fmt.Errorf("%s: %w", s.o.Src, err))
		}
		refSec = time.Since(start).Seconds()
	}
	start := time.Now()
	got, err := cpuref.ReferenceLayer(ctx, s.dst, s.dstPlan, tg.stored, x, t, ro)
	if err != nil {
		return nonFiniteRows(tg, t, fmt.Errorf("%s: %w", s.o.Dst, err))
	}
	dstSec := time.Since(start).Seconds()
	s.o.progress("validate: layer %s: %d tokens, reference on SRC %.1fs, on DST %.1fs", tg.label(), t, refSec, dstSec)
	// The coverage rows read each forced token's slots: DST's routing of
	// the routed and the forced tokens, with no shared slots (none fused).
	_, all, err := moelayer.WithCoverage(x, got.Routing, cov)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", tg.label(), err)
	}
	slots, err := moe.FusedSlots(all, s.contract.NumExperts, moe.SharedSlots{}, 1)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", tg.label(), err)
	}
	dst := &moelayer.FusedResult{Y: got.Y, Routing: got.Routing, Slots: slots}
	rj := rowJudge{s: s, base: LayerResult{Layer: tg.index, MTP: tg.mtp, Bank: tg.bank.String(), Tokens: t}, numerics: judge.CPU, t: t, h: h, cov: cov, g: g}
	var rows []LayerResult
	if ref != nil {
		rows = rj.fusedVs(judge.StoredVsReference, judge.StoredCoverage, refSec+dstSec, dst, ref.Y, ref.Routing)
		if !slices.Equal(got.Y, ref.Y) {
			for i := range rows {
				if rows[i].Pass {
					rows[i].Pass = false
					rows[i].Reason = "DST's experts are SRC's bytes run by the same code, so the outputs must be identical, and they differ"
				}
			}
		}
	}
	if g != nil {
		rows = append(rows, rj.fusedVsGolden(judge.StoredVsGolden, dstSec, dst))
		if ref != nil {
			rows = append(rows, rj.srcVsGolden(judge.ReferenceVsGolden, refSec, ref.Y, ref.Routing))
		}
	}
	return rows, nil
}
