// Package quantweights finds a checkpoint's quantised weights outside the
// experts a plan stacks (attention, dense MLPs, a shared expert left
// unfused), each checked against the format it is stored in: what
// convert --dtype dequantises and the byte proof predicts. A mixed-format
// checkpoint's second format is found by its tensors (mixed.go).
package quantweights

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// Weight is one quantised weight of a checkpoint that is not among the
// experts a plan stacks (attention, dense MLPs, a shared expert left
// unfused): what convert --dtype dequantises under its plain name, and the
// stored tensors it drops.
type Weight struct {
	// Name is the plain name the dequantised weight takes ("x.weight"), as
	// an unquantised checkpoint of the family names it.
	Name string
	// Tensors are its stored tensors: the weight (x.weight, or
	// x.weight_packed) and its scale, global scale and weight_shape.
	Tensors weightfmt.Tensors
	// Input is its static activation scale (x.input_scale, ModelOpt), ""
	// when it has none: dropped with the scales, since the dequantised
	// weight runs with unquantised activations.
	Input      string
	Rows, Cols int64
	// Format is how it is stored: the format Find was asked
	// for (FindMixed: the experts' or the second one).
	Format weightfmt.Format
}

// Dropped lists the stored tensors that the dequantised weight replaces
// (its weight tensor included), in a fixed order.
func (q Weight) Dropped() []string {
	var out []string
	for _, n := range []string{q.Tensors.Weight, q.Tensors.Scale, q.Tensors.Global, q.Tensors.Shape, q.Input} {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

// maxQuantWeights bounds how many quantised weights Find lists:
// the checkpoint's own tensor limit (checkpoint: 1,048,576) already bounds
// it; this only keeps a listing from a hostile Tensors finite.
const maxQuantWeights = 1 << 20

// Find finds every weight of t stored in format f (a quantised
// format, as the plan's Format gives it) whose tensors skip does not claim
// (the experts a plan stacks: skip is given base names), in t's order: a
// tensor of f's weight dtype named as f names a weight (x.weight,
// x.weight_packed, x.gate_up_proj_blocks) whose scale tensor is there. It
// checks each one's shapes and dtypes against f (a [rows, cols] weight, its
// scale grid, its global scale, INT4's weight_shape) and refuses, naming
// the tensor, what it cannot dequantise: a tensor of an FP8 dtype without
// its scale (its values mean nothing alone), a weight that is not 2-D, a
// plain name that is taken. Integer tensors of f's dtype without a scale
// (token tables) are not weights and are left alone.
func Find(t family.Tensors, f weightfmt.Format, skip func(string) bool) ([]Weight, error) {
	sc, scaled := f.Scale()
	if !scaled {
		return nil, fmt.Errorf("%s weights are not quantised: nothing to dequantise", f)
	}
	wsuffix := strings.TrimPrefix(weightfmt.TensorsOf(f, "w").Weight, "w")
	fp8 := f.DType() == safetensors.F8E4M3 || f.DType() == safetensors.F8E5M2
	var out []Weight
	for _, n := range t.Names() {
		meta, ok := t.Lookup(n)
		if !ok || meta.DType != f.DType() || skip(n) {
			continue
		}
		plain, named := strings.CutSuffix(n, wsuffix)
		ts := weightfmt.TensorsOf(f, plain)
		sm, hasScale := t.Lookup(ts.Scale)
		if !named || ts.Weight != n || !hasScale {
			if fp8 {
				return nil, fmt.Errorf("tensor %s is %s without a %s scale next to it (%s): its values mean nothing alone, so it cannot be dequantised", n, meta.DType, f, ts.Scale)
			}
			continue
		}
		if len(out) >= maxQuantWeights {
			return nil, fmt.Errorf("more than %d quantised weights", maxQuantWeights)
		}
		q, err := quantWeight(t, f, sc, plain, ts, meta, sm)
		if err != nil {
			return nil, err
		}
		out = append(out, q)
	}
	return out, nil
}

// quantWeight checks one weight found by Find: weight meta and
// scale sm, ts its tensors named from the plain name plain.
func quantWeight(t family.Tensors, f weightfmt.Format, sc weightfmt.Scale, plain string, ts weightfmt.Tensors, meta, sm family.TensorMeta) (Weight, error) {
	q := Weight{Name: plain, Tensors: ts, Format: f}
	if _, taken := t.Lookup(plain); taken && plain != ts.Weight {
		return q, fmt.Errorf("tensor %s is stored both plain and as %s %s: moeprep cannot tell which to keep", plain, f, ts.Weight)
	}
	if len(meta.Shape) != 2 {
		return q, fmt.Errorf("tensor %s: %s weight of shape %s, not a 2-D [out, in] matrix: moeprep dequantises only those", ts.Weight, f, shapeString(meta.Shape))
	}
	elems, unit := f.Packing()
	q.Rows = meta.Shape[0]
	// The stored columns times elements per byte-unit: exact for every
	// format but a packed one whose last unit is padding (INT4), whose
	// weight_shape says the true width.
	q.Cols = meta.Shape[1] * int64(f.DType().Size()) / unit * elems
	if ts.Shape != "" {
		cols, err := packedWidth(t, ts.Shape, q.Rows)
		if err != nil {
			return q, err
		}
		q.Cols = cols
	}
	m := weightfmt.Matrix{Format: f, Rows: q.Rows, Cols: q.Cols}
	if want := m.Shape(); !slices.Equal(meta.Shape, want) {
		return q, fmt.Errorf("tensor %s: shape %s, a %dx%d %s weight is stored as %s", ts.Weight, shapeString(meta.Shape), q.Rows, q.Cols, f, shapeString(want))
	}
	if elems > 1 && sc.Block[1] > 0 && q.Cols%sc.Block[1] != 0 {
		return q, fmt.Errorf("tensor %s: %d columns, not a whole number of %d-column %s scale groups", ts.Weight, q.Cols, sc.Block[1], f)
	}
	gr, gc := m.ScaleShape()
	if sm.DType != sc.DType || !slices.Equal(sm.Shape, []int64{gr, gc}) {
		return q, fmt.Errorf("tensor %s: %s %s, the scale of %s (%dx%d %s) is %s [%d,%d]", ts.Scale, sm.DType, shapeString(sm.Shape), ts.Weight, q.Rows, q.Cols, f, sc.DType, gr, gc)
	}
	if g, ok := weightfmt.GlobalOf(f); ok {
		gm, ok := t.Lookup(ts.Global)
		if !ok || gm.DType != g.DType || !oneElement(gm.Shape) {
			return q, fmt.Errorf("tensor %s: the %s weight needs its one %s global scale %s", ts.Weight, f, g.DType, ts.Global)
		}
	}
	if base, ok := strings.CutSuffix(plain, ".weight"); ok {
		if _, has := t.Lookup(base + ".input_scale"); has {
			q.Input = base + ".input_scale"
		}
	}
	return q, nil
}

// packedWidth reads compressed-tensors' weight_shape tensor name (I64 [2],
// [rows, cols]) and returns cols, checking rows; without the tensor bytes
// (a Tensors that is not a family.TensorBytes) the tensor's dtype and shape are
// still checked and the width is refused.
func packedWidth(t family.Tensors, name string, rows int64) (int64, error) {
	meta, ok := t.Lookup(name)
	if !ok || meta.DType != safetensors.I64 || !slices.Equal(meta.Shape, []int64{2}) {
		return 0, fmt.Errorf("tensor %s: missing or not I64 [2] (compressed-tensors' unpacked [out, in])", name)
	}
	tb, ok := t.(family.TensorBytes)
	if !ok {
		return 0, fmt.Errorf("tensor %s: its values cannot be read here", name)
	}
	b, err := tb.SmallTensorBytes(name, maxShapeBytes)
	if err != nil {
		return 0, err
	}
	if len(b) != 16 {
		return 0, fmt.Errorf("tensor %s holds %d bytes, expected 16", name, len(b))
	}
	r, c := int64(binary.LittleEndian.Uint64(b)), int64(binary.LittleEndian.Uint64(b[8:]))
	if r != rows || c < 0 {
		return 0, fmt.Errorf("tensor %s says [%d, %d], the weight has %d rows", name, r, c, rows)
	}
	return c, nil
}

// oneElement reports whether shape holds exactly one element ([], [1],
// [1,1], ...).
func oneElement(shape []int64) bool {
	for _, d := range shape {
		if d != 1 {
			return false
		}
	}
	return true
}

// maxShapeBytes bounds what packedWidth reads of a weight_shape tensor.
const maxShapeBytes = 64

// shapeString writes a shape as the planner's messages do: [2,3].
func shapeString(s []int64) string {
	return strings.ReplaceAll(fmt.Sprint(s), " ", ",")
}
