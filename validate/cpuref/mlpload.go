package cpuref

import (
	"fmt"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/blasdot"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/tensorload"
	"github.com/moeprep/moeprep/weightfmt"
)

// projMats are one MLP's matrices (or vectors) by projection: gate, up
// and down (layout.MLPProjs); ProjGateUp stays nil, and so does the gate
// of an ungated MLP.
type projMats [layout.NumProj][]float32

// projDims is projection p's [rows, cols] in an MLP of intermediate size
// inter and hidden size h: gate and up [inter, h], down [h, inter].
func projDims(p layout.Proj, inter, h int) (rows, cols int) {
	if p == layout.ProjDown {
		return h, inter
	}
	return inter, h
}

// projRef is projection p's weight in t (a source MLP's tensors, or a
// layer's stacks) as a MatrixRef: element index of a stack (-1: the whole
// matrix), [rows, cols], stored as wf where t names its scale, with t's
// global scale (element 0 of it: a stack's caller sets GlobalIndex). This
// is the one place the CPU loaders read a projection's roles from the
// table.
func projRef(t layout.Tensors, p layout.Proj, index, rows, cols int, wf weightfmt.Format) tensorload.MatrixRef {
	return tensorload.MatrixRef{Name: t.Weight(p), Index: index, Rows: rows, Cols: cols,
		Scale: t.Get(p, layout.RoleScale), Format: wf, Global: t.Get(p, layout.RoleGlobal)}
}

// projWeights are one MLP's weights by projection, each kept as its
// stored bytes and decoded a band of rows at a time (nil: none).
type projWeights [layout.NumProj]*tensorload.Bands

// weight is projection p's weight as a moe.Weight: nil (no weight) stays
// a nil interface.
func (w *projWeights) weight(p layout.Proj) moe.Weight {
	if w[p] == nil {
		return nil
	}
	return w[p]
}

// release hands every weight's bytes back.
func (w *projWeights) release() {
	for p := range w {
		w[p].Release()
		w[p] = nil
	}
}

// loadWeights loads a hub-layout MLP's weights (m's names, stored as wf
// where m names a scale, with m's global scales), in
// layout.MLPProjs' order, the gate only where m names one. On an error
// the weights loaded so far are returned with it, for the caller to put
// back.
func loadWeights(src tensorload.TensorSource, m family.MLP, inter, h int, wf weightfmt.Format) (projWeights, error) {
	var w projWeights
	for _, p := range layout.MLPProjs {
		if p == layout.ProjGate && m.Weight(p) == "" {
			continue // an ungated MLP (checkGated)
		}
		rows, cols := projDims(p, inter, h)
		var err error
		if w[p], err = tensorload.LoadBands(src, projRef(m.Tensors, p, -1, rows, cols, wf)); err != nil {
			return w, err
		}
	}
	return w, nil
}

// dot64Bands is blasdot.Dot64Rows of the rows xs (each k long) against
// weight w [n,k] into outs, w read a band at a time (each output is what
// the whole matrix gives: it depends on its two rows alone).
func dot64Bands(xs [][]float32, w moe.Weight, n, k int, outs [][]float32) error {
	if w == nil {
		return fmt.Errorf("a projection's weight is missing")
	}
	t := packRows(xs, k)
	defer t.Release()
	p := dot64Product(t, w, n, k, xs, outs)
	return moe.ProductBands(p.W, nil, n, k, p.F)
}

// packRows packs the token rows xs (each k long) once for every band of a
// weight.
func packRows(xs [][]float32, k int) *blasdot.Tokens {
	return blasdot.PackRows(len(xs), k, func(i int) []float32 { return xs[i] })
}

// dot64Product is dot64Bands' product as a stage's (moe.Stages), of the
// tokens xs packed as t; a missing weight (nil w) fails as a weight of no
// values. It names its tokens and outputs, so that DST's copy of the
// expert, paired with it, takes its outputs where both multiply the same
// bytes by the same tokens (moe.BandProduct).
func dot64Product(t *blasdot.Tokens, w moe.Weight, n, k int, xs, outs [][]float32) moe.BandProduct {
	f := func(r0, r1 int, band []float32) {
		view := make([][]float32, len(outs))
		for i, o := range outs {
			view[i] = o[r0:]
		}
		t.Dot64Rows(band, r1-r0, view)
	}
	return moe.BandProduct{W: w, Rows: n, Cols: k, F: f, Tokens: len(xs),
		X: func(i int) []float32 { return xs[i] }, Y: func(i int) []float32 { return outs[i] }}
}

// loadBiases loads m's biases (gate and up [inter], down [h]; ERNIE 4.5's
// use_bias, gpt-oss), all nil when m names no gate bias.
func loadBiases(src tensorload.TensorSource, m family.MLP, inter, h int) (projMats, error) {
	var b projMats
	if m.Get(layout.ProjGate, layout.RoleBias) == "" {
		return b, nil
	}
	for _, p := range layout.MLPProjs {
		n, _ := projDims(p, inter, h) // a bias has its weight's rows
		var err error
		if b[p], err = tensorload.LoadVector(src, m.Get(p, layout.RoleBias), n); err != nil {
			return b, err
		}
	}
	return b, nil
}
