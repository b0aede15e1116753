// A golden's point: where its y was taken (its metadata's "point"), and the
// matching quantity of each path's output, the sum moeprep plans.

package validate

import (
	"context"
	"fmt"
	"math"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// pointMap turns the paths' outputs (the planned sum, the routed tokens'
// rows first) into the quantity a golden holds where the two differ: a
// golden taken at the output of the module transformers calls the MoE
// block, for a family whose module returns something else than the sum
// (family.ModuleOutput). src maps the paths run on SRC (the reference, the
// GPU's unfused path), dst the fused path on DST; nil for a side that did
// not run.
type pointMap struct {
	what     string // the quantity compared, for the report
	src, dst func(y []float32) []float32
}

// goldenPoint is the layer's pointMap for golden g, whose tokens are x
// [t,h]; nil where the golden holds the sum (it states no point, or the
// sum, or the family's module returns the sum).
func (s *session) goldenPoint(ctx context.Context, tg target, g *Golden, x []float32, t, h int) (*pointMap, error) {
	if g == nil || g.Point != GoldenPointModule {
		return nil, nil
	}
	plan := s.dstPlanOrSrc()
	onSrc := tg.src != nil && s.src != nil
	onDst := tg.fused != nil && tg.dst != nil && s.dst != nil
	pm := &pointMap{what: fmt.Sprintf("the golden is the output of the module transformers calls the MoE block, for %s %s", plan.Family, plan.ModuleOutput)}
	switch plan.ModuleOutput {
	case family.ModuleSum:
		return nil, nil
	case family.ModulePostNorm:
		norm := func(side string, src tensorload.TensorSource, l *family.Layer) (func([]float32) []float32, error) {
			if l.PostNorm == "" {
				return nil, fmt.Errorf("%s: layer %s: the golden %s is taken after the MoE block's post norm (its metadata point %q), and %s holds no post norm for the layer", g.Path, tg.label(), g.Path, g.Point, side)
			}
			w, err := tensorload.LoadVector(src, l.PostNorm, h)
			if err != nil {
				return nil, fmt.Errorf("%s: layer %s post norm: %w", side, tg.label(), err)
			}
			return func(y []float32) []float32 { return rmsNormRows(y[:t*h], w, plan.PostNormEps, t, h) }, nil
		}
		var err error
		if onSrc {
			if pm.src, err = norm(s.o.Src, s.src, tg.src); err != nil {
				return nil, err
			}
		}
		if onDst {
			if pm.dst, err = norm(s.o.Dst, s.dst, tg.dst); err != nil {
				return nil, err
			}
		}
		return pm, nil
	case family.ModuleRouted:
		var srcShared []float32
		if onSrc && tg.src.Shared != nil {
			var err error
			if srcShared, err = cpuref.SharedOutput(ctx, s.src, s.srcPlan, tg.src, x, t, s.o.Workers); err != nil {
				return nil, fmt.Errorf("%s: %w", s.o.Src, err)
			}
			pm.src = minus(srcShared, t, h)
		}
		if onDst {
			switch {
			case tg.fused.Shared != nil:
				sh, err := cpuref.FusedSharedOutput(s.dst, tg.fused, x, t, h)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", s.o.Dst, err)
				}
				pm.dst = minus(sh, t, h)
			case s.contract != nil && s.contract.NumFusedSharedExperts > 0 && srcShared != nil:
				// DST fused the shared MLP into its bank: SRC's, which
				// fused-vs-reference holds DST's to, is taken out.
				pm.dst = minus(srcShared, t, h)
				pm.what += " (DST's shared MLP is fused into its bank: SRC's is taken out of the fused output)"
			case s.contract != nil && s.contract.NumFusedSharedExperts > 0:
				return nil, fmt.Errorf("%s: layer %s: the golden %s holds the routed part alone (its metadata point %q: %s's MoE module leaves the shared MLP to the decoder layer), and %s fused the shared MLP into its bank: give SRC, whose shared MLP is taken out",
					g.Path, tg.label(), g.Path, g.Point, plan.Family, s.o.Dst)
			}
		}
		return pm, nil
	}
	return nil, fmt.Errorf("layer %s: no rule for the module output %d of family %s", tg.label(), plan.ModuleOutput, plan.Family)
}

// minus returns a function of y: its first t rows less sh [t,h].
func minus(sh []float32, t, h int) func([]float32) []float32 {
	return func(y []float32) []float32 {
		out := make([]float32, t*h)
		for i := range out {
			out[i] = y[i] - sh[i]
		}
		return out
	}
}

// rmsNormRows is each of y's t rows [h] RMS-normalised with eps and times
// w, as transformers' RMSNorms compute it in float32 (the mean square
// accumulated here in float64).
func rmsNormRows(y, w []float32, eps float64, t, h int) []float32 {
	out := make([]float32, t*h)
	for i := range t {
		row := y[i*h : (i+1)*h]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		inv := float32(1 / math.Sqrt(float64(float32(ss/float64(h))+float32(eps))))
		for j, v := range row {
			out[i*h+j] = w[j] * (v * inv)
		}
	}
	return out
}
