// The CPU layer check: the reference on SRC and the fused path on DST, one layer at a time.

package validate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/weightfmt"
)

// checkLayer runs the available paths on one layer and compares them.
func (s *session) checkLayer(ctx context.Context, tg target) ([]LayerResult, error) {
	return s.checkLayerWith(ctx, tg, nil, false)
}

// checkLayerWith is checkLayer, telling release (when set) of each bank
// expert whose weights the paths are done with; parts runs one expert at
// a time, its bands on every core (a pass that cut its experts into parts
// holds them in order).
func (s *session) checkLayerWith(ctx context.Context, tg target, release func(bank int), parts bool) ([]LayerResult, error) {
	if tg.stored != nil {
		return s.checkStoredLayer(ctx, tg)
	}
	x, t, h, g, tokens, cov, err := s.layerStart(tg)
	if err != nil {
		return nil, err
	}
	// A latent MoE's bank reads the down projection of x and its router x.
	lr, err := s.latentStart(tg, x, t)
	if err != nil {
		return nil, err
	}
	bx, srcLayer, fusedLayer := x, tg.src, tg.fused
	var routerX []float32
	if lr != nil {
		bx, routerX, srcLayer, fusedLayer = lr.xl, x, lr.src, lr.fused
	}
	var ref *moelayer.RefResult
	var fused *moelayer.FusedResult
	var refSec, fusedSec float64
	both := tg.src != nil && s.src != nil && tg.fused != nil && s.dst != nil
	if both {
		// One pass over the bank runs both paths, each expert's bytes
		// read once and held while both need them.
		start := time.Now()
		// Each expert's two paths run band by band together, decoding
		// once the bands whose bytes DST holds as SRC does.
		po := cpuref.PairOptions{Tokens: tokens, Coverage: cov, BlockSize: s.o.BlockSize, Workers: s.o.Workers, Release: release, RouterInput: routerX, Paired: true}
		if parts {
			po.Workers = 1 // the pass holds one expert's parts, in order
		}
		var err error
		if po.RequantShared, err = s.requantFormat(); err != nil {
			return nil, err
		}
		if ref, fused, err = cpuref.PairLayer(ctx, s.src, s.srcPlan, srcLayer, s.dst, fusedLayer, bx, t, po); err != nil {
			side := s.o.Src
			if se := (*cpuref.SideError)(nil); errors.As(err, &se) {
				if se.DST {
					side = s.o.Dst
				}
				err = se.Err
			}
			return nonFiniteRows(tg, t, fmt.Errorf("%s: %w", side, err))
		}
		refSec = time.Since(start).Seconds()
		fusedSec = refSec
		s.o.progress("validate: layer %s: %d tokens, reference and fused %.1fs", tg.label(), t, refSec)
	}
	if !both && tg.src != nil && s.src != nil {
		start := time.Now()
		var err error
		ro := cpuref.RefOptions{Tokens: tokens, Coverage: cov, Workers: s.o.Workers, RouterInput: routerX}
		if tg.fused != nil {
			if ro.RequantShared, err = s.requantFormat(); err != nil {
				return nil, err
			}
		}
		if ref, err = cpuref.ReferenceLayer(ctx, s.src, s.srcPlan, srcLayer, bx, t, ro); err != nil {
			return nonFiniteRows(tg, t, fmt.Errorf("%s: %w", s.o.Src, err))
		}
		refSec = time.Since(start).Seconds()
	}
	if !both && tg.fused != nil && s.dst != nil {
		start := time.Now()
		var err error
		if fused, err = cpuref.FusedLayerRun(ctx, s.dst, fusedLayer, bx, t, cpuref.FusedOptions{Tokens: tokens, Coverage: cov, BlockSize: s.o.BlockSize, Workers: s.o.Workers, RouterInput: routerX}); err != nil {
			return nonFiniteRows(tg, t, fmt.Errorf("%s: %w", s.o.Dst, err))
		}
		fusedSec = time.Since(start).Seconds()
	}
	if !both {
		s.o.progress("validate: layer %s: %d tokens, reference %.1fs, fused %.1fs", tg.label(), t, refSec, fusedSec)
	}
	if lr != nil {
		if err := s.latentFinish(ctx, tg, lr, ref, fused); err != nil {
			return nil, err
		}
	}
	rj := rowJudge{s: s, base: LayerResult{Layer: tg.index, MTP: tg.mtp, Bank: tg.bank.String(), Tokens: t}, numerics: judge.CPU, t: t, h: h, cov: cov, g: g}
	if rj.point, err = s.goldenPoint(ctx, tg, g, x, t, h); err != nil {
		return nil, err
	}
	if ref != nil && ref.YRequant != nil {
		rj.requant = judge.RequantStats{WeightErr: ref.RequantWeightErr, Share: ref.SharedShare}
	}
	var rows []LayerResult
	if ref != nil && fused != nil {
		sec := refSec + fusedSec
		if both {
			sec = refSec // the paths ran side by side
		}
		want := ref.Y
		if ref.YRequant != nil { // exact against the same requantised shared expert
			want = ref.YRequant
		}
		rows = append(rows, rj.fusedVs(judge.FusedVsReference, judge.Coverage, sec, fused, want, ref.Routing)...)
		if ref.YRequant != nil { // and what requantising added, against SRC's own
			rows = append(rows, rj.fusedRow(judge.RequantVsReference, sec, fused, ref.Y, ref.Routing))
		}
	}
	if g != nil {
		if fused != nil {
			rows = append(rows, rj.fusedVsGolden(judge.FusedVsGolden, fusedSec, fused))
		}
		if ref != nil {
			rows = append(rows, rj.srcVsGolden(judge.ReferenceVsGolden, refSec, ref.Y, ref.Routing))
		}
	}
	return rows, nil
}

// requantFormat is the format DST's contract says its fused shared expert
// was requantised into (nil: it was not).
func (s *session) requantFormat() (weightfmt.Format, error) {
	if s.contract == nil || s.contract.SharedRequantized == nil {
		return nil, nil
	}
	f, err := s.contract.Format()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.o.Dst, err)
	}
	return f, nil
}
