package gpurun

// The layer's routing on the device: the router GEMM and the gate, and the
// forced coverage tokens placed after the routed ones (doc.go's Files).

import (
	"fmt"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// route runs the router GEMM (f32 x, router weights as f32) and the gate on
// the GPU and returns the device outputs and their host copies. The router
// always sees f32 x: for drawn tokens that is the bf16 x exactly, and a
// golden's float32 x routes as HF routed it.
//
// Only the first t of in's tokens are routed: forced coverage tokens may follow.
func (g *Runner) route(src tensorload.TensorSource, spec moe.RouteSpec, gs kernels.GateSpec, rr moelayer.RouterRef, in *Input, t int, finalScale float32, fr *Frees) (*kernels.GateOut, *moe.Routing, *moe.Slots, error) {
	if err := spec.Check(); err != nil {
		return nil, nil, nil, err
	}
	if t <= 0 || t > in.t {
		return nil, nil, nil, fmt.Errorf("routing %d of %d tokens", t, in.t)
	}
	e, rows := spec.NumExperts, spec.Rows()
	wg, err := tensorload.LoadMatrix(src, tensorload.MatrixRef{Name: rr.Router, Index: -1, Rows: rows, Cols: in.routerH()})
	if err != nil {
		return nil, nil, nil, err
	}
	w, err := cuda.FromHost(g.dev, wg)
	tensorload.PutFloats(wg)
	if err != nil {
		return nil, nil, nil, err
	}
	fr.add(w)
	var b *cuda.Buffer[float32]
	var bv []float32
	if rr.Bias != "" {
		if bv, err = tensorload.LoadVector(src, rr.Bias, e); err != nil {
			return nil, nil, nil, err
		}
		if b, err = toDevice(g, bv, fr); err != nil {
			return nil, nil, nil, err
		}
	}
	logits, err := cuda.Alloc[float32](g.dev, t*rows)
	if err != nil {
		return nil, nil, nil, err
	}
	fr.add(logits)
	if err := g.lr.Router(kernels.F32Mat(in.routerX()), kernels.F32Mat(w), logits, t, in.routerH(), rows); err != nil {
		return nil, nil, nil, err
	}
	if rr.LogitBias != "" { // gpt-oss: the router's own bias, added to the logits on the device
		lb, err := tensorload.LoadVector(src, rr.LogitBias, e)
		if err != nil {
			return nil, nil, nil, err
		}
		db, err := toDevice(g, lb, fr)
		if err != nil {
			return nil, nil, nil, err
		}
		if err := kernels.AddBiasRows(g.dev, g.compute, logits, db, t, e); err != nil {
			return nil, nil, nil, err
		}
	}
	if gs.WeightScale, err = moelayer.RouterScale(src, rr); err != nil { // Inkling's global_scale: the gate multiplies every weight by it
		return nil, nil, nil, err
	}
	out, err := kernels.NewGateOut(g.dev, gs, t, true)
	if err != nil {
		return nil, nil, nil, err
	}
	fr.add(gateOutFree{out})
	if rr.Hash != "" { // DeepSeek-V4's hash layers: the table's experts, weighted by the gate kernel
		if len(in.Tokens) != t {
			return nil, nil, nil, fmt.Errorf("hash-routed layer: %d token ids for %d tokens", len(in.Tokens), t)
		}
		ids, err := moelayer.HashIDs(src, rr.Hash, in.Tokens, spec.TopK, e)
		if err != nil {
			return nil, nil, nil, err
		}
		if out.HashIDs, err = toDevice(g, ids, fr); err != nil {
			return nil, nil, nil, err
		}
	}
	if err := g.lr.Gate(gs, t, logits, b, out); err != nil {
		return nil, nil, nil, err
	}
	k := gs.SlotsPerToken()
	if rr.ExpertScale != "" { // Gemma 4's per_expert_scale, on the gate's renormalised weights
		sv, err := moelayer.ExpertScales(src, rr, e)
		if err != nil {
			return nil, nil, nil, err
		}
		ds, err := toDevice(g, sv, fr)
		if err != nil {
			return nil, nil, nil, err
		}
		if err := kernels.ScaleByExpert(g.dev, g.compute, out.Weights, out.IDs, ds, t*k, e); err != nil {
			return nil, nil, nil, err
		}
	}
	sl := &moe.Slots{T: t, K: k, FinalScale: finalScale}
	if sl.IDs, err = out.IDs.ToHost(t * k); err != nil {
		return nil, nil, nil, err
	}
	if sl.Weights, err = out.Weights.ToHost(t * k); err != nil {
		return nil, nil, nil, err
	}
	r := &moe.Routing{T: t, K: spec.TopK, IDs: make([]int32, t*spec.TopK), Weights: make([]float32, t*spec.TopK), Hashed: rr.Hash != ""}
	if r.Choice, err = out.Choice.ToHost(t * e); err != nil {
		return nil, nil, nil, err
	}
	for i := range t {
		copy(r.IDs[i*r.K:(i+1)*r.K], sl.IDs[i*k:])
		copy(r.Weights[i*r.K:(i+1)*r.K], sl.Weights[i*k:])
	}
	if gs.SharedLogits > 0 {
		r.S = gs.SharedLogits
		if r.Shared, err = out.Shared.ToHost(t * r.S); err != nil {
			return nil, nil, nil, err
		}
	}
	return out, r, sl, nil
}

// gate routes in's routed tokens on the device through FusedGate's gate
// (with contract c's shared slots; nil c for the unfused path) and appends
// cov's forced slots (forced): the routed tokens' routing, the slots of all
// tokens and their device copies.
func (g *Runner) gate(src tensorload.TensorSource, spec moe.RouteSpec, rr moelayer.RouterRef, in *Input, cov *moelayer.Coverage, c *layout.Contract, fr *Frees) (*moe.Routing, *moe.Slots, *cuda.Buffer[int32], *cuda.Buffer[float32], error) {
	spec = spec.Ranking() // LongCat-Flash's zero-compute experts are ranked with the routed ones
	gs, finalScale := kernels.FusedGate(spec, c)
	gout, routing, slots, err := g.route(src, spec, gs, rr, in, routedTokens(in, cov), finalScale, fr)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	slots, ids, w, err := g.forced(gout, routing, slots, cov, c, fr)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	return routing, slots, ids, w, nil
}

// forced appends cov's forced slots to the gate's: with a contract (the
// fused bank) each forced token also gets its shared slots, numbered by its
// place after the routed tokens as FusedSlots numbers them. It returns the
// slots of all tokens and their device copies; without cov, the gate's own
// device outputs.
func (g *Runner) forced(gout *kernels.GateOut, routing *moe.Routing, slots *moe.Slots, cov *moelayer.Coverage, c *layout.Contract, fr *Frees) (*moe.Slots, *cuda.Buffer[int32], *cuda.Buffer[float32], error) {
	if cov == nil {
		return slots, gout.IDs, gout.Weights, nil
	}
	_, all, err := moelayer.WithCoverage(nil, routing, cov)
	if err != nil {
		return nil, nil, nil, err
	}
	tail := &moe.Slots{T: cov.T, K: all.K, IDs: cov.Routing.IDs, Weights: cov.Routing.Weights}
	if c != nil {
		fs, err := moelayer.FusedSlots(all, c)
		if err != nil {
			return nil, nil, nil, err
		}
		tail = &moe.Slots{T: cov.T, K: fs.K, IDs: fs.IDs[routing.T*fs.K:], Weights: fs.Weights[routing.T*fs.K:]}
	}
	if tail.K != slots.K {
		return nil, nil, nil, fmt.Errorf("coverage: %d slots per forced token, the gate gives %d", tail.K, slots.K)
	}
	out := &moe.Slots{T: slots.T + tail.T, K: slots.K, FinalScale: slots.FinalScale,
		IDs: append(append([]int32(nil), slots.IDs...), tail.IDs...), Weights: append(append([]float32(nil), slots.Weights...), tail.Weights...)}
	ids, err := toDevice(g, out.IDs, fr)
	if err != nil {
		return nil, nil, nil, err
	}
	w, err := toDevice(g, out.Weights, fr)
	if err != nil {
		return nil, nil, nil, err
	}
	return out, ids, w, nil
}

type gateOutFree struct{ o *kernels.GateOut }

func (f gateOutFree) Free() error { f.o.Free(); return nil }
