package layout

import (
	"strings"

	"github.com/moeprep/moeprep/weightfmt"
)

// ExpertTensors are the output names of one MoE layer's stacked experts, by
// projection and role (Tensors). For Stacked, ProjGate/ProjUp/ProjDown are
// set and ProjGateUp is empty; for the fused layouts, ProjGateUp and
// ProjDown are set and ProjGate/ProjUp are empty. Scale names are set only
// when the expert weights' format has scale tensors. RoleGlobal and
// RoleInput are the per-expert scalars of a format with a second,
// per-tensor scale (NVFP4: weight_scale_2 or weight_global_scale) and its
// static activation scales (input_scale or input_global_scale, written
// where the contract says input_scales): [N] stacks, and [N,2] for GateUp
// (gate's and up's in the layout's order, kept apart: they need not be
// equal).
type ExpertTensors struct {
	Layout Layout
	Prefix string // the module that holds the stacks, e.g. "model.layers.3.mlp.experts"
	Tensors
}

// ExpertsPrefix is the module that holds a layer's stacks in the output, given
// the layer's MoE module prefix in the source. Stacked keeps the source prefix.
// The fused layouts use the names transformers 5 holds in memory, so that
// transformers 5 loads them directly: Mixtral's ".block_sparse_moe" module is
// ".mlp" there (transformers 5 renames ".block_sparse_moe.gate" to ".mlp.gate"
// itself when loading, so the router keeps its source name).
func ExpertsPrefix(l Layout, moePrefix string) string {
	return ExpertsPrefixIn(l, moePrefix, "")
}

// ExpertsPrefixIn is ExpertsPrefix with the stacks under module, the last
// name of the MoE module replaced ("" keeps ExpertsPrefix's rule): where
// transformers 5 calls a family's MoE module otherwise than its checkpoint
// does (Step-3.7's "moe" is "mlp" there) or keeps a name the rule would
// change (Granite's "block_sparse_moe"), --layout transformers writes the
// stacks where transformers holds them (Contract.ExpertsModule).
func ExpertsPrefixIn(l Layout, moePrefix, module string) string {
	if module != "" {
		if i := strings.LastIndexByte(moePrefix, '.'); i >= 0 {
			return moePrefix[:i+1] + module + ".experts"
		}
		return module + ".experts"
	}
	if l.Fused() {
		if p, ok := strings.CutSuffix(moePrefix, ".block_sparse_moe"); ok {
			moePrefix = p + ".mlp"
		}
	}
	return moePrefix + ".experts"
}

// NamesFor gives the output tensor names of the layer whose MoE module is
// moePrefix in the source (e.g. "model.layers.3.mlp"), for expert weights
// stored in format f: where f has a scale tensor, each stack's is named
// after it (nil f: unquantised).
func NamesFor(l Layout, moePrefix string, f weightfmt.Format) ExpertTensors {
	return NamesIn(l, moePrefix, "", f)
}

// NamesIn is NamesFor with the stacks under module (ExpertsPrefixIn).
func NamesIn(l Layout, moePrefix, module string, f weightfmt.Format) ExpertTensors {
	p := ExpertsPrefixIn(l, moePrefix, module)
	t := ExpertTensors{Layout: l, Prefix: p}
	sc, scaled := scaleOf(f)
	scale := func(w string) string {
		if !scaled {
			return ""
		}
		if f != nil {
			// A Renamed format (INT4: x.weight_packed, x.weight_scale).
			return weightfmt.TensorsOf(f, w).Scale
		}
		return sc.Name(w) // "x.weight" -> "x.weight_scale_inv", "gate_up_proj" -> "gate_up_proj_scale_inv"
	}
	weight := func(w string) string {
		if f == nil {
			return w
		}
		return weightfmt.TensorsOf(f, w).Weight
	}
	// The weights' names before the format renames them (INT4:
	// x.weight_packed): each scale tensor is named after them.
	switch l {
	case GateUp, UpGate:
		if l == GateUp {
			t.Set(ProjGateUp, RoleWeight, p+".gate_up_proj")
		} else {
			// A different name on purpose: a loader that expects gate rows first
			// must not find up-first data under the gate-first name.
			t.Set(ProjGateUp, RoleWeight, p+".up_gate_proj")
		}
		t.Set(ProjDown, RoleWeight, p+".down_proj")
	default:
		t.Set(ProjGate, RoleWeight, p+".all_gate.weight")
		t.Set(ProjUp, RoleWeight, p+".all_up.weight")
		t.Set(ProjDown, RoleWeight, p+".all_down.weight")
	}
	_, global := globalOf(f)
	for q := Proj(0); q < NumProj; q++ {
		w := t.Weight(q)
		if w == "" {
			continue
		}
		t.Set(q, RoleScale, scale(w))
		if global {
			ts := weightfmt.TensorsOf(f, w)
			t.Set(q, RoleGlobal, ts.Global)
			t.Set(q, RoleInput, ts.Input)
		}
		t.Set(q, RoleWeight, weight(w))
	}
	return t
}

// Ungated is t without gate stacks, for experts that have no gate
// projection (Activation.Ungated): all_up and all_down alone. Only the
// Stacked layout has such names; a gate-up layout has none to drop, and
// convert and Contract.Check refuse it for ungated experts.
func (t ExpertTensors) Ungated() ExpertTensors {
	t.Clear(ProjGate)
	return t
}

// Names is NamesFor for unquantised weights, or for FP8 block-scaled ones
// when fp8 is set.
func Names(l Layout, moePrefix string, fp8 bool) ExpertTensors {
	return NamesFor(l, moePrefix, fp8Or(fp8, weightfmt.FP8DefaultBlock, weightfmt.FP8DefaultBlock))
}

// fp8Or is the FP8 block format when fp8 is set, nil (unquantised) otherwise.
func fp8Or(fp8 bool, bo, bi int64) weightfmt.Format {
	if !fp8 {
		return nil
	}
	return weightfmt.FP8Block(bo, bi, false)
}

// scaleOf is f's scale tensor; nil f has none.
// packingOf is f's Packing, (1, 0) for nil (unquantised).
func packingOf(f weightfmt.Format) (elems, bytes int64) {
	if f == nil {
		return 1, 0
	}
	return f.Packing()
}

// globalOf is f's global scale; nil f has none.
func globalOf(f weightfmt.Format) (weightfmt.GlobalScale, bool) {
	if f == nil {
		return weightfmt.GlobalScale{}, false
	}
	return weightfmt.GlobalOf(f)
}

func scaleOf(f weightfmt.Format) (weightfmt.Scale, bool) {
	if f == nil {
		return weightfmt.Scale{}, false
	}
	return f.Scale()
}

// Shape is a tensor shape.
type Shape []int64

// Shapes are the output shapes of one layer's stacks for n experts (routed
// plus fused shared), intermediate size I, hidden size H, and the scale
// grids of their weights' format.
type Shapes struct {
	Gate, Up, GateUp, Down                     Shape
	GateScale, UpScale, GateUpScale, DownScale Shape
	// The global (and input) scale stacks: [n], GateUp [n,2]; nil when
	// the format has none.
	GateGlobal, UpGlobal, GateUpGlobal, DownGlobal Shape
}

// Of is the shape of p's stack of role r: an input scale stack has its
// global scale stack's shape; nil where there is none.
func (s Shapes) Of(p Proj, r Role) Shape {
	var by [NumProj]Shape
	switch r {
	case RoleWeight:
		by = [NumProj]Shape{s.Gate, s.Up, s.GateUp, s.Down}
	case RoleScale:
		by = [NumProj]Shape{s.GateScale, s.UpScale, s.GateUpScale, s.DownScale}
	case RoleGlobal, RoleInput:
		by = [NumProj]Shape{s.GateGlobal, s.UpGlobal, s.GateUpGlobal, s.DownGlobal}
	default:
		return nil
	}
	return by[p]
}

// CeilDiv is ceil(a/b) for positive b.
func CeilDiv(a, b int64) int64 { return (a + b - 1) / b }

// StackShapesFor gives the shapes matching NamesFor for expert weights in
// format f (nil: unquantised). The fused scale tensor is two grids stacked
// per expert, gate's (or up's) rows then the other's: with FP8 blocks of bo
// rows, ceil(I/bo) block rows each. When I is not a multiple of bo this is
// NOT the ceil(2I/bo)-row grid of the [2I,H] weight; readers must index the
// second half's scales from row ceil(I/bo).
func StackShapesFor(l Layout, n, I, H int64, f weightfmt.Format) Shapes {
	var s Shapes
	_, scaled := scaleOf(f)
	var gr, gc, dr, dc int64
	if scaled {
		gr, gc = weightfmt.Matrix{Format: f, Rows: I, Cols: H}.ScaleShape()
		dr, dc = weightfmt.Matrix{Format: f, Rows: H, Cols: I}.ScaleShape()
	}
	// Stored columns: H and I, or fewer where elements pack into a dtype
	// unit (INT4: eight to an I32 along a row).
	hc, ic := H, I
	if elems, _ := packingOf(f); elems > 1 {
		hc = weightfmt.Matrix{Format: f, Rows: 1, Cols: H}.Shape()[1]
		ic = weightfmt.Matrix{Format: f, Rows: 1, Cols: I}.Shape()[1]
	}
	if _, ok := globalOf(f); ok {
		if l.Fused() {
			s.GateUpGlobal, s.DownGlobal = Shape{n, 2}, Shape{n}
		} else {
			s.GateGlobal, s.UpGlobal, s.DownGlobal = Shape{n}, Shape{n}, Shape{n}
		}
	}
	if l.Fused() {
		s.GateUp, s.Down = Shape{n, 2 * I, hc}, Shape{n, H, ic}
		if scaled {
			s.GateUpScale = Shape{n, 2 * gr, gc}
			s.DownScale = Shape{n, dr, dc}
		}
		return s
	}
	s.Gate, s.Up, s.Down = Shape{n, I, hc}, Shape{n, I, hc}, Shape{n, H, ic}
	if scaled {
		s.GateScale = Shape{n, gr, gc}
		s.UpScale = s.GateScale
		s.DownScale = Shape{n, dr, dc}
	}
	return s
}

// Oriented is s for stacks of orientation o: InOut swaps the last two
// dimensions of every weight stack and scale grid stack ([N, H, I] for
// gate, [N, ceil(H/bi), ceil(I/bo)] for its FP8 grid, [N, H, 2I] and
// [N, ceil(H/bi), 2*ceil(I/bo)] for gate-up); the per-expert global
// scales keep their shapes.
func (s Shapes) Oriented(o Orientation) Shapes {
	if o != InOut {
		return s
	}
	for _, sh := range []*Shape{&s.Gate, &s.Up, &s.GateUp, &s.Down, &s.GateScale, &s.UpScale, &s.GateUpScale, &s.DownScale} {
		if len(*sh) == 3 {
			*sh = Shape{(*sh)[0], (*sh)[2], (*sh)[1]}
		}
	}
	return s
}

// StackShapes is StackShapesFor for unquantised weights, or for FP8 ones
// in blocks of bo rows (output dim) by bi columns (input dim) when fp8 is set.
func StackShapes(l Layout, n, I, H int64, fp8 bool, bo, bi int64) Shapes {
	return StackShapesFor(l, n, I, H, fp8Or(fp8, bo, bi))
}

// SharedSlotID is the expert id of shared slice s (0 <= s < S) for token t in a
// bank of E routed experts followed by R replicas of S shared slices: replica
// t mod R, round robin, so results are reproducible.
func SharedSlotID(E, R, S, t, s int) int { return E + (t%R)*S + s }
