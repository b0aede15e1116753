package layout

import "strings"

// ExpertTensors are the output names of one MoE layer's stacked experts. For
// Stacked, Gate/Up/Down are set and GateUp is empty; for the fused layouts,
// GateUp and Down are set and Gate/Up are empty. Scale names are set only for
// FP8 block-quantised checkpoints.
type ExpertTensors struct {
	Layout Layout
	Prefix string // the module that holds the stacks, e.g. "model.layers.3.mlp.experts"

	Gate, Up, GateUp, Down                     string
	GateScale, UpScale, GateUpScale, DownScale string
}

// ExpertsPrefix is the module that holds a layer's stacks in the output, given
// the layer's MoE module prefix in the source. Stacked keeps the source prefix.
// The fused layouts use the names transformers 5 holds in memory, so that
// transformers 5 loads them directly: Mixtral's ".block_sparse_moe" module is
// ".mlp" there (transformers 5 renames ".block_sparse_moe.gate" to ".mlp.gate"
// itself when loading, so the router keeps its source name).
func ExpertsPrefix(l Layout, moePrefix string) string {
	if l.Fused() {
		if p, ok := strings.CutSuffix(moePrefix, ".block_sparse_moe"); ok {
			moePrefix = p + ".mlp"
		}
	}
	return moePrefix + ".experts"
}

// Names gives the output tensor names of the layer whose MoE module is
// moePrefix in the source (e.g. "model.layers.3.mlp").
func Names(l Layout, moePrefix string, fp8 bool) ExpertTensors {
	p := ExpertsPrefix(l, moePrefix)
	t := ExpertTensors{Layout: l, Prefix: p}
	scale := func(w string) string {
		if !fp8 {
			return ""
		}
		return w + "_scale_inv" // "x.weight" -> "x.weight_scale_inv", "gate_up_proj" -> "gate_up_proj_scale_inv"
	}
	switch l {
	case GateUp, UpGate:
		if l == GateUp {
			t.GateUp = p + ".gate_up_proj"
		} else {
			// A different name on purpose: a loader that expects gate rows first
			// must not find up-first data under the gate-first name.
			t.GateUp = p + ".up_gate_proj"
		}
		t.Down = p + ".down_proj"
		t.GateUpScale, t.DownScale = scale(t.GateUp), scale(t.Down)
	default:
		t.Gate, t.Up, t.Down = p+".all_gate.weight", p+".all_up.weight", p+".all_down.weight"
		t.GateScale, t.UpScale, t.DownScale = scale(t.Gate), scale(t.Up), scale(t.Down)
	}
	return t
}

// Shape is a tensor shape.
type Shape []int64

// Shapes are the output shapes of one layer's stacks for n experts (routed plus
// fused shared), intermediate size I, hidden size H and FP8 block [bo, bi]
// (block rows of the output dim, block columns of the input dim).
type Shapes struct {
	Gate, Up, GateUp, Down                     Shape
	GateScale, UpScale, GateUpScale, DownScale Shape
}

// CeilDiv is ceil(a/b) for positive b.
func CeilDiv(a, b int64) int64 { return (a + b - 1) / b }

// StackShapes gives the shapes matching Names. The fused scale tensor is two
// block grids stacked per expert, gate's (or up's) ceil(I/bo) block rows then
// the other's ceil(I/bo): when I is not a multiple of bo this is NOT the
// ceil(2I/bo)-row grid of the [2I,H] weight; readers must index the second
// half's scales from row ceil(I/bo).
func StackShapes(l Layout, n, I, H int64, fp8 bool, bo, bi int64) Shapes {
	var s Shapes
	if l.Fused() {
		s.GateUp, s.Down = Shape{n, 2 * I, H}, Shape{n, H, I}
		if fp8 {
			s.GateUpScale = Shape{n, 2 * CeilDiv(I, bo), CeilDiv(H, bi)}
			s.DownScale = Shape{n, CeilDiv(H, bo), CeilDiv(I, bi)}
		}
		return s
	}
	s.Gate, s.Up, s.Down = Shape{n, I, H}, Shape{n, I, H}, Shape{n, H, I}
	if fp8 {
		s.GateScale = Shape{n, CeilDiv(I, bo), CeilDiv(H, bi)}
		s.UpScale = s.GateScale
		s.DownScale = Shape{n, CeilDiv(H, bo), CeilDiv(I, bi)}
	}
	return s
}

// SharedSlotID is the expert id of shared slice s (0 <= s < S) for token t in a
// bank of E routed experts followed by R replicas of S shared slices: replica
// t mod R, round robin, so results are reproducible.
func SharedSlotID(E, R, S, t, s int) int { return E + (t%R)*S + s }
