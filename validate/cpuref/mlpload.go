package cpuref

import (
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
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

// loadWeights loads a hub-layout MLP's weights (m's names, stored as wf
// where m names a scale, with m's global scales) through dec, in
// layout.MLPProjs' order, the gate only where m names one. On an error
// the weights loaded so far are returned with it, for the caller to put
// back.
func loadWeights(dec *tensorload.Decoder, src tensorload.TensorSource, m family.MLP, inter, h int, wf weightfmt.Format) (projMats, error) {
	var w projMats
	for _, p := range layout.MLPProjs {
		if p == layout.ProjGate && m.Weight(p) == "" {
			continue // an ungated MLP (checkGated)
		}
		rows, cols := projDims(p, inter, h)
		var err error
		w[p], err = dec.Load(src, tensorload.MatrixRef{Name: m.Weight(p), Index: -1, Rows: rows, Cols: cols,
			Scale: m.Get(p, layout.RoleScale), Format: wf, Global: m.Get(p, layout.RoleGlobal)})
		if err != nil {
			return w, err
		}
	}
	return w, nil
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
