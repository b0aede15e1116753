package cpuref

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/blasdot"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/tensorload"
	"github.com/moeprep/moeprep/weightfmt"
	"golang.org/x/sync/errgroup"
)

// RefOptions are ReferenceLayer's settings beyond the layer and its tokens;
// the zero value runs the routed tokens alone, precisely, on Workers()
// experts at once.
type RefOptions struct {
	// Tokens are the routed tokens' ids, needed by a hash-routed layer only.
	Tokens []int32
	// Coverage adds forced tokens (nil: none): their x follows the routed
	// tokens' and their experts are the forced ones, computed in the same
	// pass over the experts. Y then holds both sets of rows; Routing stays
	// the routed tokens' alone.
	Coverage *moelayer.Coverage
	// Workers is how many experts run at once (0: moe.Workers()).
	Workers int
	// W8A8 runs every expert MLP (routed and shared) as the w8a8 serving
	// path does: its input row rounded to bf16 (the activations engines
	// keep) and quantised to e4m3 per 128 channels, the activated
	// intermediate rounded to bf16 and quantised the same way
	// (moe.RoundTripServing), products and sums in float64 as before.
	// Router and shared-expert gate stay precise.
	W8A8 bool
	// RequantShared is the format a fused DST quantised the layer's plain
	// shared expert into (its contract's shared_requantized): the shared
	// expert also runs so quantised (weightfmt.Requant from SRC's bytes,
	// dequantised exactly) into RefResult.YRequant, beside Y with the
	// shared expert as SRC stores it. nil: no requantisation.
	RequantShared weightfmt.Format
	// Pace, when set, paces the reads of the experts' weights (a streamed
	// run shares them with other readers); nil: none.
	Pace moelayer.Pace
	// NoZeroExperts leaves the zero-compute experts' output (the token's
	// input, LongCat-Flash) out of Y: a --moe-tp part after the first,
	// whose sum with the others must hold that output once, not M times.
	NoZeroExperts bool
	// RouterInput is the router's input [t, its width] where it is not
	// x (a latent MoE's: the hidden state, x its down projection); nil: x.
	RouterInput []float32
}

// ReferenceLayer runs one MoE layer of a source (hub-layout) plan the way
// the HF modules do, on x [T,H]: router in fp32, routing, each selected
// expert's SwiGLU, the weighted sum with weights times rsf, plus the shared
// expert (times sigmoid(x . w_sg) for Qwen2-MoE). Weights are dequantised
// to float32; every dot product accumulates in float64 and is stored as
// float32. It shares only decoding, routing and swiGLU with the fused path,
// not its alignment or GEMM, so a bug there cannot hide in both.
func ReferenceLayer(ctx context.Context, src tensorload.TensorSource, plan *family.Plan, layer *family.Layer, x []float32, t int, o RefOptions) (*moelayer.RefResult, error) {
	r, err := newRefLayer(src, plan, layer, x, t, o)
	if err != nil {
		return nil, err
	}
	// The shared expert (and its requantised twin) reads the layer's head,
	// which a streamed pass brings in before the routed experts: it runs
	// beside them instead of after them, so that the last routed expert
	// does not end alone with the shared products still to do. finish adds
	// it in the same place as before, so Y does not change; its error still
	// comes after the routed experts' (finish reports it).
	sctx, stopShared := context.WithCancel(ctx)
	sharedDone := r.startShared(sctx)
	defer func() {
		stopShared()
		<-sharedDone
	}()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.workers)
	pace := o.Pace
	for id := range r.e {
		if !r.uses(id) {
			if pace != nil {
				pace.Done(id)
			}
			continue
		}
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			if pace != nil {
				// The decoded weights are the worker's own: the bytes go
				// as soon as they are read.
				if err := pace.Take(gctx, id); err != nil {
					return err
				}
			}
			m, err := r.loadExpert(id)
			if pace != nil {
				pace.Done(id)
			}
			if err != nil {
				return err
			}
			err = r.runExpert(id, m)
			m.release()
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	<-sharedDone
	return r.finish(ctx)
}

// startShared runs the layer's shared expert as SRC stores it, and
// requantised where RefOptions.RequantShared says, in the background (the
// returned channel closes when it is done); finish takes their outputs, or
// their errors, as if it had run them itself.
func (r *refLayer) startShared(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	if r.layer.Shared == nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		r.early = &earlyShared{}
		if r.early.err = r.runShared(ctx); r.early.err != nil || r.o.RequantShared == nil {
			return
		}
		r.early.requant, r.early.werr, r.early.requantErr = r.requantShared(ctx)
	}()
	return done
}

// earlyShared is what startShared computed: the shared expert's error
// (r.shared holds its output), and the requantised shared expert's output
// and weight error, or its error (requant nil: not run).
type earlyShared struct {
	err        error
	requant    *sharedOut
	werr       float64
	requantErr error
}

// refLayer is one reference layer from its routing to its sum: what
// ReferenceLayer and PairLayer share. Each expert's output rows land in
// contrib, one per slot, whichever order the experts run in; finish sums
// them in slot order, so the result does not depend on that order.
type refLayer struct {
	src               tensorload.TensorSource
	plan              *family.Plan
	layer             *family.Layer
	o                 RefOptions
	x                 []float32    // the routed tokens' rows, then the forced ones'
	routed, routing   *moe.Routing // the routed tokens'; all of them
	h, inter, e, k, t int
	workers           int
	wf                weightfmt.Format
	users             [][]int   // slots t*K+k per expert
	contrib           []float32 // [T*K,H]: each slot's unweighted expert output
	shared            *sharedOut
	early             *earlyShared // the shared experts run beside the routed ones (nil: finish runs them)
}

// sharedOut is the shared expert's output over all tokens [T,H] and its
// per-token gate vector (nil: ungated).
type sharedOut struct{ out, gate []float32 }

// newRefLayer checks and routes a reference layer: everything before its
// experts run.
func newRefLayer(src tensorload.TensorSource, plan *family.Plan, layer *family.Layer, x []float32, t int, o RefOptions) (*refLayer, error) {
	h, inter, e := plan.HiddenSize, plan.IntermediateOf(*layer), plan.NumExperts
	if len(x) != t*h {
		return nil, fmt.Errorf("layer %d: x has %d values for %d tokens x %d", layer.Key(), len(x), t, h)
	}
	if len(layer.Experts) != e {
		return nil, fmt.Errorf("layer %d: plan lists %d experts, config says %d", layer.Key(), len(layer.Experts), e)
	}
	x, xr, cov, err := moelayer.PrepOf(plan, layer).Prepare(src, x, t, h, o.Coverage)
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", layer.Key(), err)
	}
	if o.RouterInput != nil {
		xr = o.RouterInput
	}
	x, routed, routing, err := routeCovered(layer.Key(), src, plan.RouteSpec(), moelayer.RouterOf(layer), x, xr, t, h, o.Tokens, cov)
	if err != nil {
		return nil, err
	}
	r := &refLayer{src: src, plan: plan, layer: layer, o: o, x: x, routed: routed, routing: routing,
		h: h, inter: inter, e: e, k: routing.K, t: routing.T, workers: o.Workers}
	if r.workers <= 0 {
		r.workers = moe.Workers()
	}
	r.contrib = make([]float32, r.t*r.k*h)
	r.users = make([][]int, e)
	for s, id := range routing.IDs {
		if z := plan.ZeroExperts; int(id) >= e && int(id) < e+z {
			// a zero-compute expert (LongCat-Flash's identity_expert): its
			// output is the token's input itself
			if !o.NoZeroExperts {
				tok := s / r.k
				copy(r.contrib[s*h:(s+1)*h], x[tok*h:(tok+1)*h])
			}
			continue
		}
		if id < 0 || int(id) >= e {
			return nil, fmt.Errorf("layer %d: slot %d names expert %d of %d", layer.Key(), s, id, e)
		}
		r.users[id] = append(r.users[id], s)
	}
	if r.wf, err = plan.Format(); err != nil {
		return nil, fmt.Errorf("layer %d: %w", layer.Key(), err)
	}
	return r, nil
}

// uses reports whether any slot chose expert id.
func (r *refLayer) uses(id int) bool { return len(r.users[id]) > 0 }

// loadExpert reads expert id's weights.
func (r *refLayer) loadExpert(id int) (*refMLP, error) {
	m, err := loadSourceMLP(r.src, r.layer.Experts[id], r.inter, r.h, r.wf, r.plan.RoutedAct(*r.layer))
	if err != nil {
		return nil, fmt.Errorf("layer %d expert %d: %w", r.layer.Key(), id, err)
	}
	m.w8a8 = r.o.W8A8
	return m, nil
}

// runExpert computes expert id, loaded as m, on every slot that chose it,
// in one pass over its weights.
func (r *refLayer) runExpert(id int, m *refMLP) error {
	if err := m.applyBatch(r.expertRows(id)); err != nil {
		return r.expertErr(id, err)
	}
	return nil
}

// expertRows are the input and output rows of every slot that chose
// expert id.
func (r *refLayer) expertRows(id int) (xs, outs [][]float32) {
	h, users := r.h, r.users[id]
	xs = make([][]float32, len(users))
	outs = make([][]float32, len(users))
	for i, s := range users {
		tok := s / r.k
		xs[i], outs[i] = r.x[tok*h:(tok+1)*h], r.contrib[s*h:(s+1)*h]
		if r.plan.RoutedInputScaled {
			xs[i] = scaledRow(xs[i], r.routing.Weights[s])
		}
	}
	return xs, outs
}

// expertErr names expert id's layer and expert in err.
func (r *refLayer) expertErr(id int, err error) error {
	return fmt.Errorf("layer %d expert %d: %w", r.layer.Key(), id, err)
}

// finish sums the experts' outputs in slot order, adds the shared experts
// (run here unless runShared already did) and scales.
func (r *refLayer) finish(ctx context.Context) (*moelayer.RefResult, error) {
	h, t, layer, plan := r.h, r.t, r.layer, r.plan
	y64 := make([]float64, t*h)
	rsf := float32(plan.RouteSpec().RoutedScalingFactor)
	for s := range t * r.k {
		w := float64(r.routing.Weights[s] * rsf) // HF scales each weight by rsf in float32
		if plan.RoutedInputScaled {
			w = float64(rsf) // the weight went into the expert's input
		}
		tok := s / r.k
		row := r.contrib[s*h : (s+1)*h]
		for j, v := range row {
			y64[tok*h+j] += w * float64(v)
		}
	}
	var yq64, routedSum []float64 // the routed sum, then the requantised shared expert; the routed sum
	var werr float64
	if layer.Shared != nil && r.o.RequantShared != nil {
		routedSum = slices.Clone(y64)
	}
	if layer.Shared != nil {
		// As stored first: a non-finite weight fails the layer here, by
		// name, before requantising it could refuse it.
		if r.early != nil && r.early.err != nil {
			return nil, r.early.err
		}
		if r.shared == nil {
			if err := r.runShared(ctx); err != nil {
				return nil, err
			}
		}
		r.shared.addTo(y64, r.x, t, h)
	}
	if routedSum != nil {
		yq64 = slices.Clone(routedSum)
		var sh *sharedOut
		var err error
		if e := r.early; e != nil && (e.requant != nil || e.requantErr != nil) {
			sh, werr, err = e.requant, e.werr, e.requantErr
		} else {
			sh, werr, err = r.requantShared(ctx)
		}
		if err != nil {
			return nil, err
		}
		sh.addTo(yq64, r.x, t, h)
	}
	if len(layer.SharedExperts) > 0 {
		if err := addRoutedSharedReference(ctx, r.src, plan, layer, r.x, r.routing, rsf, r.workers, r.wf, r.o.W8A8, y64); err != nil {
			return nil, err
		}
	}
	scale := plan.Output() // Cohere2's average: (routed + shared) / 2, after the sum as HF does
	res := &moelayer.RefResult{Y: scaled32(y64, scale), Routing: r.routed}
	if yq64 != nil {
		res.YRequant = scaled32(yq64, scale)
		var sh, all float64 // the shared expert's part of y over the routed tokens
		for i, v := range y64[:r.routed.T*h] {
			sh += (v - routedSum[i]) * (v - routedSum[i])
			all += v * v
		}
		res.RequantWeightErr, res.SharedShare = werr, math.Sqrt(sh/max(all, math.SmallestNonzeroFloat64))
	}
	return res, nil
}

// scaled32 is y times scale, each rounded to float32.
func scaled32(y []float64, scale float64) []float32 {
	out := make([]float32, len(y))
	for i, v := range y {
		out[i] = float32(v * scale)
	}
	return out
}

// requantShared is the output of the layer's plain shared expert quantised
// into format RefOptions.RequantShared (checkpoint.Requantised, from SRC's
// bytes) and dequantised exactly, for finish to add as the shared expert as
// stored is added, and how far that moved its weights: sqrt of the sum over
// gate, up and down of (||Wq - W|| / ||W||)^2. Its reads go straight to
// SRC (a streamed pass serves them where it still holds the bytes, else
// they read the files) and to the requantised tensors computed here.
func (r *refLayer) requantShared(ctx context.Context) (*sharedOut, float64, error) {
	src, plan, layer, f := r.src, r.plan, r.layer, r.o.RequantShared
	names, rsrc, err := tensorload.RequantisedShared(src, *layer.Shared, f)
	if err != nil {
		return nil, 0, fmt.Errorf("layer %d: %w", layer.Key(), err)
	}
	inter := sharedInter(plan)
	q, err := loadSourceMLP(rsrc, names, inter, plan.HiddenSize, f, plan.SharedActOf(*layer))
	if err != nil {
		return nil, 0, fmt.Errorf("layer %d requantised shared expert: %w", layer.Key(), err)
	}
	defer q.release()
	// Each projection as SRC stores it, one at a time beside the
	// requantised MLP, a band of rows of each at a time: a whole one in
	// float32 (59 MB at Kimi-K2's 7168 x 2048) and its bytes were the
	// largest thing the reference held for a requantised shared expert.
	h, werr := plan.HiddenSize, 0.0
	for _, p := range layout.MLPProjs {
		name := layer.Shared.Weight(p)
		if name == "" {
			continue // an ungated MLP's gate
		}
		rows, cols := projDims(p, inter, h)
		w, err := tensorload.LoadBands(src, tensorload.MatrixRef{Name: name, Index: -1, Rows: rows, Cols: cols})
		if err != nil {
			return nil, 0, fmt.Errorf("layer %d shared expert: %w", layer.Key(), err)
		}
		// SRC's band first, then the requantised one, as SRC's whole
		// matrix was read before: SRC's error is reported as before.
		qw := q.w.weight(p)
		var d, n float64
		var got []float32 // the requantised rows of the band (EachBand runs one band at a time)
		var qErr error
		err = moe.EachBand(bandsOf{w, qw.Band()}, nil, rows, cols, func(r0, r1 int, want []float32) {
			if qErr != nil {
				return
			}
			got = slices.Grow(got[:0], len(want))[:len(want)]
			if qErr = qw.Rows(r0, r1, got); qErr != nil {
				return
			}
			for j, v := range want {
				d += (float64(got[j]) - float64(v)) * (float64(got[j]) - float64(v))
				n += float64(v) * float64(v)
			}
		})
		w.Release()
		if err != nil {
			return nil, 0, fmt.Errorf("layer %d shared expert: %w", layer.Key(), err)
		}
		if qErr != nil {
			return nil, 0, fmt.Errorf("layer %d requantised shared expert: %w", layer.Key(), qErr)
		}
		if n == 0 && d > 0 {
			return nil, 0, fmt.Errorf("layer %d: requantised shared expert %s is not zero where the source's is", layer.Key(), name)
		}
		werr += d / max(n, math.SmallestNonzeroFloat64)
	}
	q.w8a8 = r.o.W8A8
	sh, err := r.sharedWith(ctx, q)
	if err != nil {
		return nil, 0, err
	}
	return sh, math.Sqrt(werr), nil
}

// bandsOf is a weight read in bands that start on multiples of band (the
// requantised weight's, which a plain one read beside it must follow).
type bandsOf struct {
	moe.Weight
	band int
}

// Band is the least multiple of both weights' bands, so that every band
// starts where each of them may (a plain weight's band is one row; the
// requantised one's its scale block's rows).
func (b bandsOf) Band() int {
	x, y := max(b.band, 1), max(b.Weight.Band(), 1)
	for g, h := x, y; ; {
		if h == 0 {
			return x / g * y
		}
		g, h = h, g%h
	}
}

// SharedMLPOutput is layer's shared MLP (as src stores it, under plan) over
// the t rows of x [t,h], run apart from the bank: a latent MoE's shared
// experts read the hidden state while its bank reads the latent.
func SharedMLPOutput(ctx context.Context, src tensorload.TensorSource, plan *family.Plan, layer *family.Layer, shared family.MLP, x []float32, t, h, workers int) ([]float32, error) {
	sf, err := plan.SharedFormat()
	if err != nil {
		return nil, err
	}
	m, err := loadSourceMLP(src, shared, sharedInter(plan), h, sf, plan.SharedActOf(*layer))
	if err != nil {
		return nil, fmt.Errorf("layer %d shared expert: %w", layer.Key(), err)
	}
	defer m.release()
	if workers <= 0 {
		workers = moe.Workers()
	}
	return m.applyAll(ctx, x, t, workers)
}

// sharedInter is the plan's shared MLP's intermediate size (S*I when not stated).
func sharedInter(plan *family.Plan) int {
	if plan.SharedIntermediateSize > 0 {
		return plan.SharedIntermediateSize
	}
	return plan.NumSharedExperts * plan.MoEIntermediateSize
}

// routeCovered routes layer index's t tokens x [t,h] (routed; by the
// router's own input xr where non-nil, Gemma 4's) and appends the forced
// coverage tokens cov (nil: none) to x and the routing (all).
func routeCovered(index int, src tensorload.TensorSource, spec moe.RouteSpec, rr moelayer.RouterRef, x, xr []float32, t, h int, tokens []int32, cov *moelayer.Coverage) (xAll []float32, routed, all *moe.Routing, err error) {
	hr := h // the router's width: x's, or its own input's
	if xr == nil {
		xr = x
	} else if t > 0 {
		hr = len(xr) / t
	}
	if routed, err = routeLayer(src, spec, rr, xr, t, hr, tokens); err != nil {
		return nil, nil, nil, fmt.Errorf("layer %d: %w", index, err)
	}
	if xAll, all, err = moelayer.WithCoverage(x, routed, cov); err != nil {
		return nil, nil, nil, fmt.Errorf("layer %d: %w", index, err)
	}
	return xAll, routed, all, nil
}

// routeLayer loads a router (and its correction bias, its own logit bias
// and its hash table, where named) and routes x; tokens are the token ids
// of x's rows, needed only by a hash-routed layer.
func routeLayer(src tensorload.TensorSource, spec moe.RouteSpec, rr moelayer.RouterRef, x []float32, t, h int, tokens []int32) (*moe.Routing, error) {
	spec = spec.Ranking() // LongCat-Flash's zero-compute experts are ranked with the routed ones
	wg, err := tensorload.LoadMatrix(src, tensorload.MatrixRef{Name: rr.Router, Index: -1, Rows: spec.Rows(), Cols: h})
	if err != nil {
		return nil, err
	}
	var b []float32
	if rr.Bias != "" {
		if b, err = tensorload.LoadVector(src, rr.Bias, spec.NumExperts); err != nil {
			return nil, err
		}
	}
	logits, err := moe.RouterLogits(x, t, h, wg, spec.Rows())
	if err != nil {
		return nil, err
	}
	if rr.LogitBias != "" {
		lb, err := tensorload.LoadVector(src, rr.LogitBias, spec.NumExperts)
		if err != nil {
			return nil, err
		}
		moe.AddRowBias(logits, lb) // gpt-oss: F.linear(x, W, b), the sum rounded to float32
	}
	var ids []int32
	if rr.Hash != "" {
		if len(tokens) != t {
			return nil, fmt.Errorf("hash-routed layer: %d token ids for %d tokens", len(tokens), t)
		}
		if ids, err = moelayer.HashIDs(src, rr.Hash, tokens, spec.TopK, spec.NumExperts); err != nil {
			return nil, err
		}
	}
	return routeLogits(src, spec, rr, logits, b, ids, t)
}

// routeLogits is the gate on a layer's logits [T, router rows], on the
// host: through the hash table's ids where non-nil, else top-k with the
// correction bias b (nil: none), then times the router's scale tensor.
// The CPU paths run it; the GPU's gate kernel is checked against it.
func routeLogits(src tensorload.TensorSource, spec moe.RouteSpec, rr moelayer.RouterRef, logits, b []float32, ids []int32, t int) (*moe.Routing, error) {
	if ids != nil {
		return moe.RouteHashed(spec, logits, ids, t)
	}
	r, err := moe.Route(spec, logits, b, t)
	if err != nil {
		return nil, err
	}
	if rr.Scale != "" {
		s, err := moelayer.RouterScale(src, rr)
		if err != nil {
			return nil, err
		}
		moe.ScaleRouting(r, s)
	}
	if err := moelayer.ScaleByExpert(src, rr, r, spec.NumExperts); err != nil {
		return nil, err
	}
	return r, nil
}

// checkGated refuses an MLP whose gate projection and activation disagree:
// an ungated activation (relu2) with a gate tensor, or a gated one without.
func checkGated(gate string, act layout.Activation) error {
	switch {
	case act.Ungated() && gate != "":
		return fmt.Errorf("tensor %s: the experts' activation (%s) is ungated, yet the plan names a gate projection", gate, act.Describe())
	case !act.Ungated() && gate == "":
		return fmt.Errorf("the experts' activation (%s) needs a gate projection, and the plan names none", act.Describe())
	}
	return nil
}

// refMLP is one gated MLP in float32 for the reference (gate nil:
// ungated).
type refMLP struct {
	w        projWeights // weights: gate, up [I,H], down [H,I]
	bias     projMats    // biases: gate, up [I], down [H]; nil when none
	act      layout.Activation
	h, inter int
	w8a8     bool // RefOptions.W8A8: quantise input and intermediate (applyBatch)
}

// loadSourceMLP reads one source MLP whose weights are stored in format wf
// (the plan's).
func loadSourceMLP(src tensorload.TensorSource, names family.MLP, inter, h int, wf weightfmt.Format, act layout.Activation) (*refMLP, error) {
	m := &refMLP{h: h, inter: inter, act: act}
	var err error
	if m.bias, err = loadBiases(src, names, inter, h); err != nil {
		return nil, err
	}
	if err := checkGated(names.Weight(layout.ProjGate), act); err != nil {
		return nil, err
	}
	if m.w, err = loadWeights(src, names, inter, h, wf); err != nil {
		m.w.release()
		return nil, err
	}
	return m, nil
}

func (m *refMLP) release() { m.w.release() }

// applyBatch writes down(silu(gate x) * up x) for each token xs[r] into
// outs[r] [H]: every output blasdot.Dot64Rows' dot product (pieces of 128
// summed in float32, added in float64, rounded once to float32; its
// bound is in blasdot's doc), all tokens against each weight row at once,
// so each row is read from memory once for all of them.
func (m *refMLP) applyBatch(xs, outs [][]float32) error {
	return moe.RunStages(m.stages(xs, outs), moe.BandsAtOnce())
}

// stages is applyBatch's work as moe.Stages, for a caller that runs it
// beside DST's copy of the expert (moe.RunPaired).
func (m *refMLP) stages(xs, outs [][]float32) *refStages {
	n := len(xs)
	if m.w8a8 {
		q := make([][]float32, n)
		for r, x := range xs {
			q[r] = slices.Clone(x)
			moe.RoundTripServing(q[r], 1, m.h)
		}
		xs = q
	}
	s := &refStages{m: m, xs: xs, outs: outs, n: n}
	s.u = make([]float32, n*m.inter)
	s.us = rowsOf(s.u, n, m.inter)
	s.g, s.gs = s.u, s.us // an ungated expert's act reads u alone, in place
	if m.w[layout.ProjGate] != nil {
		s.g = make([]float32, n*m.inter)
		s.gs = rowsOf(s.g, n, m.inter)
	}
	return s
}

// refStages is one source MLP on its tokens xs: the gate and up products
// (g, u, and their rows gs, us) and the down product into outs.
type refStages struct {
	m        *refMLP
	xs, outs [][]float32
	n        int
	g, u     []float32
	gs, us   [][]float32
	xt, at   *blasdot.Tokens // xs and the activations packed, each released once its products are done
}

func (s *refStages) Product(i int) (moe.BandProduct, bool) {
	m := s.m
	switch i {
	case moe.StageGate:
		if m.w[layout.ProjGate] == nil {
			return moe.BandProduct{}, false
		}
		return dot64Product(s.tokens(), m.w.weight(layout.ProjGate), m.inter, m.h, s.xs, s.gs), true
	case moe.StageUp:
		return dot64Product(s.tokens(), m.w.weight(layout.ProjUp), m.inter, m.h, s.xs, s.us), true
	}
	// The down product's tokens are the activations, packed once the
	// gate and up products are done (After has run).
	s.at = packRows(s.gs, m.inter)
	return dot64Product(s.at, m.w.weight(layout.ProjDown), m.h, m.inter, s.gs, s.outs), true
}

// tokens is xs packed for the gate and up products, once for both.
func (s *refStages) tokens() *blasdot.Tokens {
	if s.xt == nil {
		s.xt = packRows(s.xs, s.m.h)
	}
	return s.xt
}

func (s *refStages) After(i int) error {
	m := s.m
	switch i {
	case moe.StageUp:
		s.xt.Release() // the up product's bands are done: the buffer serves the next expert
		moe.Activate(m.act, s.g, s.u, m.bias[layout.ProjGate], m.bias[layout.ProjUp])
		if m.w8a8 {
			moe.RoundTripServing(s.g, s.n, m.inter)
		}
	case moe.StageDown:
		s.at.Release()
		if db := m.bias[layout.ProjDown]; db != nil {
			for _, o := range s.outs {
				for j, b := range db {
					o[j] += b
				}
			}
		}
	}
	return nil
}

// rowsOf cuts m [n,cols] into its rows.
func rowsOf(m []float32, n, cols int) [][]float32 {
	rows := make([][]float32, n)
	for r := range rows {
		rows[r] = m[r*cols : (r+1)*cols]
	}
	return rows
}

// runShared runs the shared expert (one MLP of intermediate S*I, not
// split) over every token, for finish to
// add, gated per token by sigmoid(x . w_sg) for Qwen2-MoE.
func (r *refLayer) runShared(ctx context.Context) error {
	m, err := r.loadShared()
	if err != nil {
		return err
	}
	defer m.release()
	return r.runSharedWith(ctx, m)
}

// loadShared reads the shared expert's weights, in the format it is
// stored in (apart from the routed experts' where the plan says so).
func (r *refLayer) loadShared() (*refMLP, error) {
	plan := r.plan
	sf, err := plan.SharedFormat()
	if err != nil {
		return nil, err
	}
	m, err := loadSourceMLP(r.src, *r.layer.Shared, sharedInter(plan), r.h, sf, plan.SharedActOf(*r.layer))
	if err != nil {
		return nil, fmt.Errorf("layer %d shared expert: %w", r.layer.Key(), err)
	}
	m.w8a8 = r.o.W8A8
	return m, nil
}

// runSharedWith runs the shared expert, loaded as m.
func (r *refLayer) runSharedWith(ctx context.Context, m *refMLP) error {
	sh, err := r.sharedWith(ctx, m)
	if err != nil {
		return err
	}
	r.shared = sh
	return nil
}

// sharedWith is the output of the shared MLP m (as stored, or
// requantised) over every token, with the layer's shared expert gate.
func (r *refLayer) sharedWith(ctx context.Context, m *refMLP) (*sharedOut, error) {
	sh := &sharedOut{}
	if g := r.layer.SharedGate; g != "" {
		var err error
		if sh.gate, err = tensorload.LoadVector(r.src, g, r.h); err != nil {
			return nil, fmt.Errorf("layer %d shared expert gate: %w", r.layer.Key(), err)
		}
	}
	var err error
	if sh.out, err = m.applyAll(ctx, r.x, r.t, r.workers); err != nil {
		return nil, err
	}
	return sh, nil
}

// addTo adds the shared expert's output to y64 [T,H], gated per token
// where it has a gate.
func (sh *sharedOut) addTo(y64 []float64, x []float32, t, h int) {
	for tok := range t {
		factor := 1.0
		if sh.gate != nil {
			factor = float64(float32(1 / (1 + math.Exp(-moe.Dot64(x[tok*h:(tok+1)*h], sh.gate)))))
		}
		for j := range h {
			y64[tok*h+j] += factor * float64(sh.out[tok*h+j])
		}
	}
}

// applyAll runs the MLP over every token of x [T,H], the tokens split into
// one chunk per worker, each chunk one pass over the weights.
func (m *refMLP) applyAll(ctx context.Context, x []float32, t, workers int) ([]float32, error) {
	h := m.h
	out := make([]float32, t*h)
	g, gctx := errgroup.WithContext(ctx)
	chunk := (t + workers - 1) / workers
	for lo := 0; lo < t; lo += chunk {
		hi := min(t, lo+chunk)
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			var xs, outs [][]float32
			for tok := lo; tok < hi; tok++ {
				xs = append(xs, x[tok*h:(tok+1)*h])
				outs = append(outs, out[tok*h:(tok+1)*h])
			}
			return m.applyBatch(xs, outs)
		})
	}
	return out, g.Wait()
}

// addRoutedSharedReference adds shared experts the router weights per token
// (Inkling): sum over s of w[t,s] * rsf * shared_s(x), w the routing's
// shared weights (the router scale already in them), times rsf in float32
// as the routed weights are.
func addRoutedSharedReference(ctx context.Context, src tensorload.TensorSource, plan *family.Plan, layer *family.Layer, x []float32, r *moe.Routing, rsf float32, workers int, wf weightfmt.Format, w8a8 bool, y64 []float64) error {
	h, t, ns := plan.HiddenSize, r.T, len(layer.SharedExperts)
	if r.S != ns || len(r.Shared) != t*ns {
		return fmt.Errorf("layer %d: the routing weights %d shared experts (%d values for %d tokens), the plan has %d", layer.Key(), r.S, len(r.Shared), t, ns)
	}
	for s, names := range layer.SharedExperts {
		m, err := loadSourceMLP(src, names, plan.MoEIntermediateSize, h, wf, plan.SharedActOf(*layer))
		if err != nil {
			return fmt.Errorf("layer %d shared expert %d: %w", layer.Key(), s, err)
		}
		m.w8a8 = w8a8
		out, err := m.applyAll(ctx, x, t, workers)
		m.release()
		if err != nil {
			return err
		}
		for tok := range t {
			w := float64(r.Shared[tok*ns+s] * rsf)
			for j := range h {
				y64[tok*h+j] += w * float64(out[tok*h+j])
			}
		}
	}
	return nil
}

// scaledRow is Llama 4's routed input for one slot: w * x, each product
// rounded to float32 as HF multiplies in the model dtype (float32 for the
// goldens).
func scaledRow(x []float32, w float32) []float32 {
	out := make([]float32, len(x))
	for j, v := range x {
		out[j] = w * v
	}
	return out
}
