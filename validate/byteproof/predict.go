// The prediction: every DST tensor as segments of SRC's bytes, derived from SRC and the contract alone
// (never from convert's code, which it checks).

package byteproof

import (
	"fmt"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// segment is a run of DST bytes and how to predict them: src bytes as they
// are, or src values times fold.
type segment struct {
	off    int64 // within the DST tensor
	n      int64
	src    *checkpoint.Tensor
	ranges [][2]int64 // byte ranges of src, in order, totalling n (dq: src's weight bytes)
	fold   float64    // 0: exact bytes
	// dq: the n bytes are src's weight (ranges) dequantised and rounded
	// once (dequant.go); nil: src's bytes themselves.
	dq     *dequantSeg
	layer  int
	expert int
	io     *ioSeg // an in-out slice (inout.go): its bytes, not ranges
}

// prediction is every DST tensor's segments, by name.
type prediction struct {
	tensors map[string][]segment
	meta    map[string]tensorWant
}

type tensorWant struct {
	dtype  safetensors.DType
	shape  []int64
	layer  int
	expert int // -1
}

// predict lays out what every DST tensor must hold.
func predict(src *checkpoint.Checkpoint, plan *family.Plan, c *layout.Contract) (*prediction, error) {
	p := &prediction{tensors: map[string][]segment{}, meta: map[string]tensorWant{}}
	if c.NumExperts != plan.NumExperts {
		return nil, fmt.Errorf("%s: the contract has %d routed experts, SRC %d", src.Dir, c.NumExperts, plan.NumExperts)
	}
	consumed := map[string]bool{}
	byIndex := map[int]*family.Layer{}
	for i := range plan.Layers {
		byIndex[plan.Layers[i].Key()] = &plan.Layers[i]
	}
	if len(c.Layers) != len(plan.Layers) {
		return nil, fmt.Errorf("%s: the contract lists %d MoE layers, SRC has %d", src.Dir, len(c.Layers), len(plan.Layers))
	}
	for _, li := range c.Layers {
		l, ok := byIndex[li.Index]
		if !ok {
			return nil, fmt.Errorf("%s: contract layer %d is not a MoE layer of SRC", src.Dir, li.Index)
		}
		if c.Layout == layout.AsStored {
			continue // its experts are SRC's tensors, each a copy like the rest
		}
		if err := p.layer(src, plan, c, li, l, consumed); err != nil {
			return nil, err
		}
	}
	if err := p.predictOthers(src, plan, c, consumed); err != nil {
		return nil, err
	}
	for _, t := range src.Tensors {
		if consumed[t.Name] {
			continue
		}
		if _, dup := p.meta[t.Name]; dup {
			return nil, fmt.Errorf("%s: tensor %s would be both a stack and a copied tensor", src.Dir, t.Name)
		}
		p.meta[t.Name] = tensorWant{dtype: t.DType, shape: t.StoredShape(), layer: -1, expert: -1}
		p.tensors[t.Name] = []segment{{n: t.NumBytes(), src: t, ranges: [][2]int64{{0, t.NumBytes()}}, layer: -1, expert: -1}}
	}
	return p, nil
}

// mat is a 2-D view [rows, cols] of a source tensor.
type mat struct {
	t          *checkpoint.Tensor
	rows, cols int64
}

// all is the byte ranges of the whole of m.
func (m mat) all() [][2]int64 {
	return weightfmt.Matrix{Format: weightfmt.Plain(m.t.DType), Rows: m.rows, Cols: m.cols}.Whole().Weight.Ranges()
}
