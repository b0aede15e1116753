package moelayer

import (
	"fmt"
	"math"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/tensorload"
	"github.com/moeprep/moeprep/weightfmt"
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

// SharedSlots is the contract's shared slot layout (none when the shared
// experts were not fused).
func SharedSlots(c *layout.Contract) moe.SharedSlots {
	if c.NumFusedSharedExperts == 0 {
		return moe.SharedSlots{}
	}
	return moe.SharedSlots{PerToken: c.SharedSlices, Replicas: c.SharedReplicas, Weight: float32(c.SharedSlotWeight)}
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
	// ExpertScale is the router's per-expert scale (Gemma 4), "" if none;
	// Prep derives the layer's two inputs (Gemma 4), zero if it has one.
	ExpertScale string
	Prep        InputPrep
	// Info is the layer's contract entry, for its own activations.
	Info layout.LayerInfo
	// Latent is a latent MoE layer's transforms around the bank (Kimi K3:
	// the bank reads Latent.In(x), its sum leaves through Latent.Out), with
	// DST's own tensors; nil for other layers. The GPU's fused path reads
	// it; the CPU check takes the layer apart itself (validate/latent.go).
	Latent *Latent
}

// Act is the bank's activation in this layer (fused shared slots too).
func (fl *FusedLayer) Act() layout.Activation { return fl.Contract.RoutedAct(fl.Info) }

// SharedAct is the unfused shared MLP's activation in this layer.
func (fl *FusedLayer) SharedAct() layout.Activation { return fl.Contract.SharedAct(fl.Info) }

// FusedResult is the fused path's output for one layer.
type FusedResult struct {
	Y       []float32 // [T,H]
	Routing *moe.Routing
	Slots   *moe.Slots
	Align   *moe.Alignment
}

func (fl *FusedLayer) RouterRef() RouterRef {
	return RouterRef{Router: fl.Router, Bias: fl.RouterBias, LogitBias: fl.RouterLogitBias, Hash: fl.HashTable, Scale: fl.RouterScale, ExpertScale: fl.ExpertScale}
}

// stackDims reads H and I from the stacked tensors and checks the bank size.
func (fl *FusedLayer) StackDims(src tensorload.TensorSource) (h, inter int, err error) {
	name := fl.Names.Weight(layout.ProjDown)
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
			gname, half := fl.Names.Weight(layout.ProjGate), 1
			if fl.Names.Layout.Fused() {
				gname, half = fl.Names.Weight(layout.ProjGateUp), 2
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

// expertBiases reads bank expert e's gate, up [inter] and down [h] biases
// from the layer's bias stacks (all nil when the experts have none).
func (fl *FusedLayer) ExpertBiases(src tensorload.TensorSource, e, h, inter int) (gb, ub, db []float32, err error) {
	b := fl.Biases
	if b == nil {
		return nil, nil, nil, nil
	}
	if b.GateUp != "" {
		gu, err := tensorload.LoadRow(src, b.GateUp, e, 2*inter)
		if err != nil {
			return nil, nil, nil, err
		}
		gb, ub = gu[:inter], gu[inter:]
		if fl.Names.Layout == layout.UpGate {
			gb, ub = gu[inter:], gu[:inter]
		}
	} else {
		if gb, err = tensorload.LoadRow(src, b.Gate, e, inter); err != nil {
			return nil, nil, nil, err
		}
		if ub, err = tensorload.LoadRow(src, b.Up, e, inter); err != nil {
			return nil, nil, nil, err
		}
	}
	if db, err = tensorload.LoadRow(src, b.Down, e, h); err != nil {
		return nil, nil, nil, err
	}
	return gb, ub, db, nil
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
