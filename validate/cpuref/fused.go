package cpuref

import (
	"context"
	"fmt"
	"math"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/tensorload"
	"github.com/moeprep/moeprep/weightfmt"
)

// fusedLoader returns the ExpertLoader of the layer's bank, decoding through
// wf is the contract's weight format.
func fusedLoader(fl *moelayer.FusedLayer, src tensorload.TensorSource, h, inter int, wf weightfmt.Format) moe.ExpertLoader {
	c, n := fl.Contract, fl.Names
	inOut := c.Oriented() == layout.InOut
	// ref is stack p's slice e of [rows, cols], with its scales and its
	// global scale (element e of the global stack), and for a routed
	// expert the factor the contract says was folded into it.
	ref := func(p layout.Proj, e, rows, cols int) tensorload.MatrixRef {
		r := projRef(n.Tensors, p, e, rows, cols, wf)
		r.GlobalIndex, r.InOut = e, inOut
		if c.RoutedScalingFactorFolded && e < c.NumExperts {
			r.Folded = c.RoutedScalingFactor
		}
		return r
	}
	return func(_ context.Context, e int) (*moe.ExpertMats, error) {
		m := &moe.ExpertMats{}
		var err error
		wrap := func(err error) error { return fmt.Errorf("layer %d expert %d: %w", fl.Index, e, err) }
		projs := layout.MLPProjs[:]
		if n.Layout.Fused() {
			// Two halves of the [2I,H] slice; with a scale the grid is two
			// stacked grids of the [I,H] half's rows each (layout.StackShapesFor).
			first := ref(layout.ProjGateUp, e, inter, h)
			first.SliceRows = 2 * inter
			first.GlobalIndex = 2 * e
			second := first
			second.RowStart = inter
			second.GlobalIndex = 2*e + 1
			if _, scaled := wf.Scale(); scaled {
				half, _ := weightfmt.Matrix{Format: wf, Rows: int64(inter), Cols: int64(h)}.ScaleShape()
				first.ScaleSliceRows, second.ScaleSliceRows = 2*int(half), 2*int(half)
				second.ScaleRowStart = int(half)
			}
			a, err := tensorload.LoadBands(src, first)
			if err != nil {
				return nil, wrap(err)
			}
			b, err := tensorload.LoadBands(src, second)
			if err != nil {
				a.Release()
				return nil, wrap(err)
			}
			m.GateW, m.UpW = a, b
			if n.Layout == layout.UpGate {
				m.GateW, m.UpW = b, a
			}
			projs = []layout.Proj{layout.ProjDown}
		}
		for _, p := range projs {
			if p == layout.ProjGate && n.Weight(p) == "" {
				continue // ungated experts (Contract.Names)
			}
			rows, cols := projDims(p, inter, h)
			w, err := tensorload.LoadBands(src, ref(p, e, rows, cols))
			if err != nil {
				tensorload.ReleaseExpert(m)
				return nil, wrap(err)
			}
			*expertWeight(m, p) = w
		}
		m.Act = fl.Act()
		if m.GateBias, m.UpBias, m.DownBias, err = fl.ExpertBiases(src, e, h, inter); err != nil {
			tensorload.ReleaseExpert(m)
			return nil, wrap(err)
		}
		return m, nil
	}
}

// expertWeight is where projection p's weight goes in m (p a source MLP's
// projection: gate, up or down), decoded by bands.
func expertWeight(m *moe.ExpertMats, p layout.Proj) *moe.Weight {
	switch p {
	case layout.ProjGate:
		return &m.GateW
	case layout.ProjUp:
		return &m.UpW
	}
	return &m.DownW
}

// FusedOptions are FusedLayerRun's settings beyond the layer and its
// tokens.
type FusedOptions struct {
	// Tokens are the routed tokens' ids, needed by a hash-routed layer only.
	Tokens []int32
	// Coverage adds forced tokens after the routed ones (nil: none): their
	// slots (forced routed ids, then the contract's shared slots) go through
	// the same align, grouped GEMM and finalize. Y and Slots then hold both
	// sets of tokens; Routing stays the routed tokens' alone.
	Coverage *moelayer.Coverage
	// BlockSize is moe_align_block_size's block.
	BlockSize int
	// Workers is how many experts run at once (0: moe.Workers()).
	Workers int
	// RouterInput is RefOptions.RouterInput.
	RouterInput []float32
}

// FusedLayerRun runs one converted layer the way a serving engine does:
// gate (top-k plus shared slots), moe_align_block_size, grouped GEMM over the
// blocks, finalize; plus an unfused shared expert where the contract left one.
func FusedLayerRun(ctx context.Context, src tensorload.TensorSource, fl *moelayer.FusedLayer, x []float32, t int, o FusedOptions) (*moelayer.FusedResult, error) {
	f, err := newFusedRun(src, fl, x, t, o)
	if err != nil {
		return nil, err
	}
	if f.out, err = moe.GroupedGEMM(ctx, f.gx, f.gt, f.h, f.inter, f.gk, f.al, fusedLoader(fl, src, f.h, f.inter, f.wf),
		moe.GEMMOptions{Workers: o.Workers, Release: tensorload.ReleaseExpert, BankExperts: fl.Contract.BankSize()}); err != nil {
		return nil, err
	}
	return f.finish()
}

// fusedRun is one fused layer from its routing to its finalize: what
// FusedLayerRun and PairLayer share.
type fusedRun struct {
	src             tensorload.TensorSource
	fl              *moelayer.FusedLayer
	x               []float32    // the routed tokens' rows, then the forced ones'
	routed, routing *moe.Routing // the routed tokens'; all of them
	h, inter, t     int
	slots           *moe.Slots
	al              *moe.Alignment
	wf              weightfmt.Format
	// The grouped GEMM's input: its rows gx [gt,H], gk slots a row, and
	// the finalize weights (Llama 4 runs one slot a row, scaled).
	gx      []float32
	gt, gk  int
	weights []float32
	out     []float32 // the grouped GEMM's output [Numel,H]
	dense   *sharedOut
}

// newFusedRun checks, routes and aligns a fused layer: everything before
// its grouped GEMM.
func newFusedRun(src tensorload.TensorSource, fl *moelayer.FusedLayer, x []float32, t int, o FusedOptions) (*fusedRun, error) {
	h, inter, err := fl.StackDims(src)
	if err != nil {
		return nil, err
	}
	if len(x) != t*h {
		return nil, fmt.Errorf("layer %d: x has %d values for %d tokens x %d", fl.Index, len(x), t, h)
	}
	if fl.Spec.NumExperts != fl.Contract.NumExperts {
		return nil, fmt.Errorf("layer %d: config routes over %d experts, the contract says %d", fl.Index, fl.Spec.NumExperts, fl.Contract.NumExperts)
	}
	x, xr, cov, err := fl.Prep.Prepare(src, x, t, h, o.Coverage)
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	if o.RouterInput != nil {
		xr = o.RouterInput
	}
	x, routed, routing, err := routeCovered(fl.Index, src, fl.Spec, fl.RouterRef(), x, xr, t, h, o.Tokens, cov)
	if err != nil {
		return nil, err
	}
	f := &fusedRun{src: src, fl: fl, x: x, routed: routed, routing: routing, h: h, inter: inter, t: routing.T}
	if f.slots, err = moelayer.FusedSlots(routing, fl.Contract); err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	if f.al, err = moe.AlignBlockSize(f.slots.IDs, fl.Contract.AlignExperts(), o.BlockSize); err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	if f.wf, err = fl.Contract.Format(); err != nil { // moelayer.FusedSlots checked the contract, so it has one
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	f.gx, f.gt, f.gk, f.weights = x, f.t, f.slots.K, f.slots.Weights
	if fl.Contract.RoutedInputScaled {
		// Llama 4: each slot's row is w * x and the slots sum unweighted.
		f.gx, f.gt, f.gk, f.weights = moelayer.SlotRows(x, h, f.slots.K, f.slots.Weights), f.t*f.slots.K, 1, moelayer.Ones(len(f.slots.Weights))
	}
	return f, nil
}

// runJob runs one bank expert's blocks with its weights m into f.out.
func (f *fusedRun) runJob(j moe.ExpertJob, m *moe.ExpertMats) error {
	return j.Run(f.gx, f.h, f.inter, f.gk, f.al, m, f.out, false)
}

// denseSharedErr is why the layer's unfused shared expert cannot run (nil:
// it can, or there is none).
func (f *fusedRun) denseSharedErr() error {
	if fl := f.fl; fl.Shared != nil && fl.Contract.NumFusedSharedExperts > 0 {
		return fmt.Errorf("layer %d: the contract fuses %d shared experts but shared expert tensors (%s) remain", fl.Index, fl.Contract.NumFusedSharedExperts, fl.Shared.First())
	}
	return nil
}

// runDense runs the unfused shared expert over every token, its weights
// for finish to add.
func (f *fusedRun) runDense() error {
	fl := f.fl
	wrap := func(err error) error { return fmt.Errorf("layer %d shared expert: %w", fl.Index, err) }
	o, err := denseMLP(fl, f.src, *fl.Shared, f.x, f.t, f.h)
	if err != nil {
		return wrap(err)
	}
	sh := &sharedOut{out: o}
	if fl.SharedGate != "" {
		if sh.gate, err = tensorload.LoadVector(f.src, fl.SharedGate, f.h); err != nil {
			return wrap(err)
		}
	}
	f.dense = sh
	return nil
}

// finish finalizes the grouped GEMM's output, adds the shared experts
// (the unfused one run here unless runDense already did) and scales.
func (f *fusedRun) finish() (*moelayer.FusedResult, error) {
	fl, t, h := f.fl, f.t, f.h
	if z := fl.Contract.ZeroExperts; z > 0 { // LongCat-Flash: the slots past the bank return their input
		bank := fl.Contract.BankSize()
		if err := moe.IdentityRows(f.gx, h, f.gk, f.al, bank, bank+z, f.out); err != nil {
			return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
		}
	}
	y, err := moe.Finalize(f.out, t, f.slots.K, h, f.weights, f.slots.FinalScale)
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	if fl.Shared != nil {
		if err := f.denseSharedErr(); err != nil {
			return nil, err
		}
		if f.dense == nil {
			if err := f.runDense(); err != nil {
				return nil, err
			}
		}
		f.dense.addDense(y, f.x, t, h)
	}
	if len(fl.SharedExperts) > 0 {
		if err := addRoutedShared(fl, f.src, f.x, f.routing, h, f.slots.FinalScale, y); err != nil {
			return nil, err
		}
	}
	moelayer.ScaleOutput(y, fl.Contract.Output())
	return &moelayer.FusedResult{Y: y, Routing: f.routed, Slots: f.slots, Align: f.al}, nil
}

// addDense adds an unfused shared expert's output to y [T,H] the way the
// fused path sums, in float32, gated per token for Qwen2-MoE.
func (sh *sharedOut) addDense(y, x []float32, t, h int) {
	for tok := range t {
		factor := float32(1)
		if sh.gate != nil {
			var s float32
			for j, v := range x[tok*h : (tok+1)*h] {
				s += v * sh.gate[j]
			}
			factor = float32(1 / (1 + math.Exp(-float64(s))))
		}
		for j := range h {
			y[tok*h+j] += factor * sh.out[tok*h+j]
		}
	}
}

// addRoutedShared adds shared experts the router weights per token
// (Inkling), each a dense MLP over all tokens times its routing weight and
// the final scale the routed sum took.
func addRoutedShared(fl *moelayer.FusedLayer, src tensorload.TensorSource, x []float32, r *moe.Routing, h int, finalScale float32, y []float32) error {
	t, ns := r.T, len(fl.SharedExperts)
	if r.S != ns || len(r.Shared) != t*ns {
		return fmt.Errorf("layer %d: the routing weights %d shared experts (%d values for %d tokens), the checkpoint has %d", fl.Index, r.S, len(r.Shared), t, ns)
	}
	for s, m := range fl.SharedExperts {
		o, err := denseMLP(fl, src, m, x, t, h)
		if err != nil {
			return fmt.Errorf("layer %d shared expert %d: %w", fl.Index, s, err)
		}
		for tok := range t {
			w := r.Shared[tok*ns+s] * finalScale
			for j := range h {
				y[tok*h+j] += w * o[tok*h+j]
			}
		}
		tensorload.PutFloats(o)
	}
	return nil
}

// denseMLP runs one hub-layout MLP over all tokens of x [T,H] with one GEMM
// per projection, in the contract's activation (DeepSeek-V4's shared MLP
// is clamped as its experts are), with its biases where it has them.
func denseMLP(fl *moelayer.FusedLayer, src tensorload.TensorSource, m family.MLP, x []float32, t, h int) ([]float32, error) {
	gt, ok := src.Tensor(m.First())
	if !ok {
		return nil, fmt.Errorf("tensor %s is missing", m.First())
	}
	if len(gt.Shape) != 2 || gt.Shape[0] <= 0 || gt.Shape[0] > math.MaxInt32 {
		return nil, fmt.Errorf("%s: tensor %s has shape %v, want [I,%d]", gt.File, m.First(), gt.Shape, h)
	}
	inter := int(gt.Shape[0])
	wf, err := fl.Contract.SharedFormat()
	if err != nil {
		return nil, err
	}
	act := fl.SharedAct()
	if err := checkGated(m.Weight(layout.ProjGate), act); err != nil {
		return nil, err
	}
	w, err := loadWeights(src, m, inter, h, wf)
	defer w.release()
	if err != nil {
		return nil, err
	}
	u := make([]float32, t*inter)
	if err := moe.SgemmNTBands(t, inter, h, x, h, w.weight(layout.ProjUp), nil, u, inter); err != nil {
		return nil, err
	}
	g := u // an ungated MLP's act reads u alone, in place
	if w[layout.ProjGate] != nil {
		g = make([]float32, t*inter)
		if err := moe.SgemmNTBands(t, inter, h, x, h, w.weight(layout.ProjGate), nil, g, inter); err != nil {
			return nil, err
		}
	}
	bias, err := loadBiases(src, m, inter, h) // ERNIE 4.5 use_bias
	if err != nil {
		return nil, err
	}
	moe.Activate(fl.SharedAct(), g, u, bias[layout.ProjGate], bias[layout.ProjUp])
	o := make([]float32, t*h)
	if err := moe.SgemmNTBands(t, h, inter, g, inter, w.weight(layout.ProjDown), nil, o, h); err != nil {
		return nil, err
	}
	moe.AddRowBias(o, bias[layout.ProjDown])
	return o, nil
}
