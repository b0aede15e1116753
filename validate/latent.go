// A latent MoE layer's CPU check (Kimi K3): the bank between the layer's
// down projection and its norm and up projection, the shared experts on
// the hidden state.

package validate

import (
	"context"
	"fmt"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// latentRun is one latent MoE layer's check: both paths run their bank on
// xl, the same down projection of x, route on x, and leave through the
// same norm and up projection (one checkpoint's tensors: SRC's where it is
// given, which the byte proof holds DST's copies to), then add their own
// shared experts, each path's as its checkpoint stores them, on x.
type latentRun struct {
	lt    *moelayer.Latent
	from  tensorload.TensorSource // whose latent tensors both paths use
	x, xl []float32               // the block's input [t,H]; the bank's [t,L]
	t     int
	// src and fused are the target's layers without their shared experts,
	// which the bank's paths would otherwise run on the latent.
	src   *family.Layer
	fused *moelayer.FusedLayer
}

// latentStart is tg's latentRun for its input x [t,H]; nil for a layer of
// a plan with no latent MoE.
func (s *session) latentStart(tg target, x []float32, t int) (*latentRun, error) {
	plan, layer, from := s.srcPlan, tg.src, tensorload.TensorSource(s.src)
	if layer == nil || s.src == nil {
		plan, layer, from = s.dstPlan, s.dstLayer(tg), s.dst
	}
	lt, err := moelayer.LatentOf(plan, layer)
	if err != nil || lt == nil {
		return nil, err
	}
	lr := &latentRun{lt: lt, from: from, x: x, t: t}
	if lr.xl, err = lt.In(from, x, t); err != nil {
		return nil, fmt.Errorf("layer %d: %w", tg.index, err)
	}
	if tg.src != nil {
		c := *tg.src
		c.Shared = nil
		lr.src = &c
	}
	if tg.fused != nil {
		c := *tg.fused
		c.Shared = nil
		lr.fused = &c
	}
	return lr, nil
}

// dstLayer is DST's planned layer of tg (nil: none).
func (s *session) dstLayer(tg target) *family.Layer {
	if s.dstPlan == nil {
		return nil
	}
	for i := range s.dstPlan.Layers {
		if l := &s.dstPlan.Layers[i]; l.Key() == tg.index && l.Bank == tg.bank {
			return l
		}
	}
	return nil
}

// finish turns a path's bank output y (its routed rows, then any forced
// coverage rows, each L wide) into the block's: every row through the norm
// and the up projection, then the shared experts (shared, of plan and
// src; nil: none) over x added to the routed rows, each sum rounded to
// float32 as the engines add in their activation dtype's wider float.
func (lr *latentRun) finish(ctx context.Context, y []float32, src tensorload.TensorSource, plan *family.Plan, layer *family.Layer, shared *family.MLP, workers int) ([]float32, error) {
	if len(y)%lr.lt.L != 0 {
		return nil, fmt.Errorf("latent MoE: the bank's output has %d values, not rows of %d", len(y), lr.lt.L)
	}
	out, err := lr.lt.Out(lr.from, y, len(y)/lr.lt.L)
	if err != nil {
		return nil, err
	}
	if shared == nil {
		return out, nil
	}
	sh, err := cpuref.SharedMLPOutput(ctx, src, plan, layer, *shared, lr.x, lr.t, lr.lt.H, workers)
	if err != nil {
		return nil, err
	}
	for i, v := range sh {
		out[i] = float32(float64(out[i]) + float64(v))
	}
	return out, nil
}

// latentFinish turns both paths' bank outputs into the block's (finish):
// the reference's with SRC's shared experts, the fused path's with DST's.
func (s *session) latentFinish(ctx context.Context, tg target, lr *latentRun, ref *moelayer.RefResult, fused *moelayer.FusedResult) error {
	var err error
	if ref != nil {
		if ref.Y, err = lr.finish(ctx, ref.Y, s.src, s.srcPlan, tg.src, tg.src.Shared, s.o.Workers); err != nil {
			return fmt.Errorf("%s: %w", s.o.Src, err)
		}
	}
	if fused != nil {
		dl := s.dstLayer(tg)
		if dl == nil {
			return fmt.Errorf("%s: layer %d: DST's plan holds no such latent MoE layer", s.o.Dst, tg.index)
		}
		if fused.Y, err = lr.finish(ctx, fused.Y, s.dst, s.dstPlan, dl, tg.fused.Shared, s.o.Workers); err != nil {
			return fmt.Errorf("%s: %w", s.o.Dst, err)
		}
	}
	return nil
}
