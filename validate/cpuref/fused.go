package cpuref

import (
	"context"
	"fmt"
	"math"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/weightfmt"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// FusedSlots adds the contract's shared slots to a routing (moe.FusedSlots):
// token t's shared slice s goes to expert E + (t mod R)*S + s with the
// contract's slot weight (1.0 when rsf is folded into the routed experts,
// 1/rsf otherwise), and the final scale is the contract's runtime rsf.
func FusedSlots(r *moe.Routing, c *layout.Contract) (*moe.Slots, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	return moe.FusedSlots(r, c.NumExperts, SharedSlots(c), float32(c.RuntimeScale()))
}

// sharedSlots is the contract's shared slot layout (none when the shared
// experts were not fused).
func SharedSlots(c *layout.Contract) moe.SharedSlots {
	if c.NumFusedSharedExperts == 0 {
		return moe.SharedSlots{}
	}
	return moe.SharedSlots{PerToken: c.SharedSlices, Replicas: c.SharedReplicas, Weight: float32(c.SharedSlotWeight)}
}

// releaseExpert hands a bank expert's weight buffers back to the pool once
// the grouped GEMM is done with it.
func releaseExpert(m *moe.ExpertMats) {
	PutFloats(m.Gate)
	PutFloats(m.Up)
	PutFloats(m.Down)
	m.Gate, m.Up, m.Down = nil, nil, nil
}

// FusedLayer is one converted layer as the fused path reads it.
type FusedLayer struct {
	Index      int
	Router     string // [E,H], the source's name
	RouterBias string // "" if none
	// RouterLogitBias is the router's own bias (gpt-oss), "" if none.
	RouterLogitBias string
	// HashTable is a hash-routed layer's token-to-experts table (DeepSeek-V4), "" if none.
	HashTable string
	// Biases names the bias stacks (gpt-oss); nil when the experts have none.
	Biases   *layout.ExpertBiases
	Spec     moe.RouteSpec
	Contract *layout.Contract
	Names    layout.ExpertTensors
	// Shared is a shared expert that was NOT fused into the bank (convert
	// without fuse-shared): it runs as a separate dense MLP, as engines
	// without fusion do. SharedGate is Qwen2-MoE's per-token gate.
	Shared     *family.MLP
	SharedGate string
	// SharedExperts are shared experts the router weights per token
	// (Inkling), run as dense MLPs with the routing's shared weights;
	// RouterScale is the router's scale tensor ("" if none).
	SharedExperts []family.MLP
	RouterScale   string
}

// FusedResult is the fused path's output for one layer.
type FusedResult struct {
	Y       []float32 // [T,H]
	Routing *moe.Routing
	Slots   *moe.Slots
	Align   *moe.Alignment
}

func (fl *FusedLayer) RouterRef() RouterRef {
	return RouterRef{Router: fl.Router, Bias: fl.RouterBias, LogitBias: fl.RouterLogitBias, Hash: fl.HashTable, Scale: fl.RouterScale}
}

// stackDims reads H and I from the stacked tensors and checks the bank size.
func (fl *FusedLayer) StackDims(src TensorSource) (h, inter int, err error) {
	name := fl.Names.Down
	t, ok := src.Tensor(name)
	if !ok {
		return 0, 0, fmt.Errorf("layer %d: tensor %s is missing", fl.Index, name)
	}
	if len(t.Shape) != 3 || t.Shape[1] <= 0 || t.Shape[2] <= 0 || t.Shape[1] > math.MaxInt32 || t.Shape[2] > math.MaxInt32 {
		return 0, 0, fmt.Errorf("%s: layer %d: tensor %s has shape %v, want [experts,H,I]", t.File, fl.Index, name, t.Shape)
	}
	if fl.Contract.Oriented() == layout.InOut { // [experts,I,H]; never packed (layout.TransposeRefusal)
		return int(t.Shape[2]), int(t.Shape[1]), nil
	}
	if want := int64(fl.Contract.BankSize()); t.Shape[0] != want {
		return 0, 0, fmt.Errorf("%s: layer %d: tensor %s holds %d experts, the contract says %d routed + %d fused shared", t.File, fl.Index, name, t.Shape[0], fl.Contract.NumExperts, fl.Contract.NumFusedSharedExperts)
	}
	h, inter = int(t.Shape[1]), int(t.Shape[2])
	if wf, err := fl.Contract.Format(); err == nil {
		if elems, _ := wf.Packing(); elems > 1 {
			// Packed along a row (INT4: [E, H, ceil(I/8)] I32): I is the
			// rows of the gate stack, half those of gate-up.
			gname, half := fl.Names.Gate, 1
			if fl.Names.Layout.Fused() {
				gname, half = fl.Names.GateUp, 2
			}
			g, ok := src.Tensor(gname)
			if !ok {
				return 0, 0, fmt.Errorf("layer %d: tensor %s is missing", fl.Index, gname)
			}
			if len(g.Shape) != 3 || g.Shape[1] <= 0 || g.Shape[1]%int64(half) != 0 || g.Shape[1] > math.MaxInt32 {
				return 0, 0, fmt.Errorf("%s: layer %d: tensor %s has shape %v, want [experts,%dI,H packed]", g.File, fl.Index, gname, g.Shape, half)
			}
			inter = int(g.Shape[1]) / half
			got := weightfmt.Matrix{Format: wf, Rows: int64(h), Cols: int64(inter)}.Shape()[1]
			if got != t.Shape[2] {
				return 0, 0, fmt.Errorf("%s: layer %d: tensor %s has shape %v, want [experts,%d,%d] for I=%d", t.File, fl.Index, name, t.Shape, h, got, inter)
			}
		}
	}
	return h, inter, nil
}

// loader returns the ExpertLoader of the layer's bank.
// wf is the contract's weight format.
func (fl *FusedLayer) loader(src TensorSource, h, inter int, wf weightfmt.Format) moe.ExpertLoader {
	c, n := fl.Contract, fl.Names
	inOut := c.Oriented() == layout.InOut
	ref := func(name, scale string, e, rows, cols int) MatrixRef {
		return MatrixRef{Name: name, Index: e, Rows: rows, Cols: cols, Scale: scale, Format: wf, InOut: inOut}
	}
	return func(_ context.Context, e int) (*moe.ExpertMats, error) {
		m := &moe.ExpertMats{}
		var err error
		wrap := func(err error) error { return fmt.Errorf("layer %d expert %d: %w", fl.Index, e, err) }
		if n.Layout.Fused() {
			// Two halves of the [2I,H] slice; with a scale the grid is two
			// stacked grids of the [I,H] half's rows each (layout.StackShapesFor).
			first := ref(n.GateUp, n.GateUpScale, e, inter, h)
			first.SliceRows = 2 * inter
			first.Global, first.GlobalIndex = n.GateUpGlobal, 2*e
			second := first
			second.RowStart = inter
			second.GlobalIndex = 2*e + 1
			if _, scaled := wf.Scale(); scaled {
				half, _ := weightfmt.Matrix{Format: wf, Rows: int64(inter), Cols: int64(h)}.ScaleShape()
				first.ScaleSliceRows, second.ScaleSliceRows = 2*int(half), 2*int(half)
				second.ScaleRowStart = int(half)
			}
			a, err := LoadMatrix(src, first)
			if err != nil {
				return nil, wrap(err)
			}
			b, err := LoadMatrix(src, second)
			if err != nil {
				return nil, wrap(err)
			}
			m.Gate, m.Up = a, b
			if n.Layout == layout.UpGate {
				m.Gate, m.Up = b, a
			}
		} else {
			g, u := ref(n.Gate, n.GateScale, e, inter, h), ref(n.Up, n.UpScale, e, inter, h)
			g.Global, g.GlobalIndex, u.Global, u.GlobalIndex = n.GateGlobal, e, n.UpGlobal, e
			if m.Gate, err = LoadMatrix(src, g); err != nil {
				return nil, wrap(err)
			}
			if m.Up, err = LoadMatrix(src, u); err != nil {
				return nil, wrap(err)
			}
		}
		d := ref(n.Down, n.DownScale, e, h, inter)
		d.Global, d.GlobalIndex = n.DownGlobal, e
		if m.Down, err = LoadMatrix(src, d); err != nil {
			return nil, wrap(err)
		}
		m.Act = c.Act()
		if m.GateBias, m.UpBias, m.DownBias, err = fl.ExpertBiases(src, e, h, inter); err != nil {
			return nil, wrap(err)
		}
		return m, nil
	}
}

// expertBiases reads bank expert e's gate, up [inter] and down [h] biases
// from the layer's bias stacks (all nil when the experts have none).
func (fl *FusedLayer) ExpertBiases(src TensorSource, e, h, inter int) (gb, ub, db []float32, err error) {
	b := fl.Biases
	if b == nil {
		return nil, nil, nil, nil
	}
	if b.GateUp != "" {
		gu, err := loadRow(src, b.GateUp, e, 2*inter)
		if err != nil {
			return nil, nil, nil, err
		}
		gb, ub = gu[:inter], gu[inter:]
		if fl.Names.Layout == layout.UpGate {
			gb, ub = gu[inter:], gu[:inter]
		}
	} else {
		if gb, err = loadRow(src, b.Gate, e, inter); err != nil {
			return nil, nil, nil, err
		}
		if ub, err = loadRow(src, b.Up, e, inter); err != nil {
			return nil, nil, nil, err
		}
	}
	if db, err = loadRow(src, b.Down, e, h); err != nil {
		return nil, nil, nil, err
	}
	return gb, ub, db, nil
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
	Coverage *Coverage
	// BlockSize is moe_align_block_size's block.
	BlockSize int
	// Workers is how many experts run at once (0: moe.Workers()).
	Workers int
}

// FusedLayerRun runs one converted layer the way a serving engine does:
// gate (top-k plus shared slots), moe_align_block_size, grouped GEMM over the
// blocks, finalize; plus an unfused shared expert where the contract left one.
func FusedLayerRun(ctx context.Context, src TensorSource, fl *FusedLayer, x []float32, t int, o FusedOptions) (*FusedResult, error) {
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
	x, routed, routing, err := routeCovered(fl.Index, src, fl.Spec, fl.RouterRef(), x, t, h, o.Tokens, o.Coverage)
	if err != nil {
		return nil, err
	}
	t = routing.T
	slots, err := FusedSlots(routing, fl.Contract)
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	al, err := moe.AlignBlockSize(slots.IDs, fl.Contract.BankSize(), o.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	wf, err := fl.Contract.Format() // FusedSlots checked the contract, so it has one
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	gx, gt, gk, weights := x, t, slots.K, slots.Weights
	if fl.Contract.RoutedInputScaled {
		// Llama 4: each slot's row is w * x and the slots sum unweighted.
		gx, gt, gk, weights = SlotRows(x, h, slots.K, slots.Weights), t*slots.K, 1, Ones(len(slots.Weights))
	}
	out, err := moe.GroupedGEMM(ctx, gx, gt, h, inter, gk, al, fl.loader(src, h, inter, wf), moe.GEMMOptions{Workers: o.Workers, Release: releaseExpert})
	if err != nil {
		return nil, err
	}
	y, err := moe.Finalize(out, t, slots.K, h, weights, slots.FinalScale)
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	if fl.Shared != nil {
		if fl.Contract.NumFusedSharedExperts > 0 {
			return nil, fmt.Errorf("layer %d: the contract fuses %d shared experts but shared expert tensors (%s) remain", fl.Index, fl.Contract.NumFusedSharedExperts, fl.Shared.Gate)
		}
		if err := fl.addDenseShared(src, x, t, h, y); err != nil {
			return nil, err
		}
	}
	if len(fl.SharedExperts) > 0 {
		if err := fl.addRoutedShared(src, x, routing, h, slots.FinalScale, y); err != nil {
			return nil, err
		}
	}
	ScaleOutput(y, fl.Contract.Output())
	return &FusedResult{Y: y, Routing: routed, Slots: slots, Align: al}, nil
}

// addDenseShared runs an unfused shared expert over all tokens with one
// GEMM per projection and adds it (gated for Qwen2-MoE) to y.
func (fl *FusedLayer) addDenseShared(src TensorSource, x []float32, t, h int, y []float32) error {
	wrap := func(err error) error { return fmt.Errorf("layer %d shared expert: %w", fl.Index, err) }
	o, err := fl.denseMLP(src, *fl.Shared, x, t, h)
	if err != nil {
		return wrap(err)
	}
	var gw []float32
	if fl.SharedGate != "" {
		if gw, err = LoadVector(src, fl.SharedGate, h); err != nil {
			return wrap(err)
		}
	}
	for tok := range t {
		factor := float32(1)
		if gw != nil {
			var s float32
			for j, v := range x[tok*h : (tok+1)*h] {
				s += v * gw[j]
			}
			factor = float32(1 / (1 + math.Exp(-float64(s))))
		}
		for j := range h {
			y[tok*h+j] += factor * o[tok*h+j]
		}
	}
	return nil
}

// addRoutedShared adds shared experts the router weights per token
// (Inkling), each a dense MLP over all tokens times its routing weight and
// the final scale the routed sum took.
func (fl *FusedLayer) addRoutedShared(src TensorSource, x []float32, r *moe.Routing, h int, finalScale float32, y []float32) error {
	t, ns := r.T, len(fl.SharedExperts)
	if r.S != ns || len(r.Shared) != t*ns {
		return fmt.Errorf("layer %d: the routing weights %d shared experts (%d values for %d tokens), the checkpoint has %d", fl.Index, r.S, len(r.Shared), t, ns)
	}
	for s, m := range fl.SharedExperts {
		o, err := fl.denseMLP(src, m, x, t, h)
		if err != nil {
			return fmt.Errorf("layer %d shared expert %d: %w", fl.Index, s, err)
		}
		for tok := range t {
			w := r.Shared[tok*ns+s] * finalScale
			for j := range h {
				y[tok*h+j] += w * o[tok*h+j]
			}
		}
		PutFloats(o)
	}
	return nil
}

// denseMLP runs one hub-layout MLP over all tokens of x [T,H] with one GEMM
// per projection, in the contract's activation (DeepSeek-V4's shared MLP
// is clamped as its experts are), with its biases where it has them.
func (fl *FusedLayer) denseMLP(src TensorSource, m family.MLP, x []float32, t, h int) ([]float32, error) {
	gt, ok := src.Tensor(m.Gate)
	if !ok {
		return nil, fmt.Errorf("tensor %s is missing", m.Gate)
	}
	if len(gt.Shape) != 2 || gt.Shape[0] <= 0 || gt.Shape[0] > math.MaxInt32 {
		return nil, fmt.Errorf("%s: tensor %s has shape %v, want [I,%d]", gt.File, m.Gate, gt.Shape, h)
	}
	inter := int(gt.Shape[0])
	wf, err := fl.Contract.SharedFormat()
	if err != nil {
		return nil, err
	}
	ref := func(name, scale string, rows, cols int) MatrixRef {
		return MatrixRef{Name: name, Index: -1, Rows: rows, Cols: cols, Scale: scale, Format: wf}
	}
	glob := func(r MatrixRef, g string) MatrixRef { r.Global = g; return r }
	gate, err := LoadMatrix(src, glob(ref(m.Gate, m.GateScale, inter, h), m.GateGlobal))
	if err != nil {
		return nil, err
	}
	defer PutFloats(gate)
	up, err := LoadMatrix(src, glob(ref(m.Up, m.UpScale, inter, h), m.UpGlobal))
	if err != nil {
		return nil, err
	}
	defer PutFloats(up)
	down, err := LoadMatrix(src, glob(ref(m.Down, m.DownScale, h, inter), m.DownGlobal))
	if err != nil {
		return nil, err
	}
	defer PutFloats(down)
	impl := gonum.Implementation{}
	g := make([]float32, t*inter)
	u := make([]float32, t*inter)
	impl.Sgemm(blas.NoTrans, blas.Trans, t, inter, h, 1, x, h, gate, h, 0, g, inter)
	impl.Sgemm(blas.NoTrans, blas.Trans, t, inter, h, 1, x, h, up, h, 0, u, inter)
	var gb, ub, db []float32
	if m.GateBias != "" { // ERNIE 4.5 use_bias
		if gb, err = LoadVector(src, m.GateBias, inter); err != nil {
			return nil, err
		}
		if ub, err = LoadVector(src, m.UpBias, inter); err != nil {
			return nil, err
		}
		if db, err = LoadVector(src, m.DownBias, h); err != nil {
			return nil, err
		}
	}
	moe.Activate(fl.Contract.Act(), g, u, gb, ub)
	o := make([]float32, t*h)
	impl.Sgemm(blas.NoTrans, blas.Trans, t, h, inter, 1, g, inter, down, inter, 0, o, h)
	moe.AddRowBias(o, db)
	return o, nil
}

// scaleOutput multiplies a layer's whole output, shared expert included, by
// the contract's output_scale (Cohere2's average: 0.5, a power of two, so
// the product is exact and the order of the sum does not matter). The GPU
// paths apply it here too, to the output they read back.
func ScaleOutput(y []float32, s float64) {
	if s == 1 {
		return
	}
	f := float32(s)
	for i := range y {
		y[i] *= f
	}
}
