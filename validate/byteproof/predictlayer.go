// One contract layer's expert stacks predicted from SRC's layer: each bank expert's parts found in
// SRC, then every stack the contract names laid out from them, bank expert by bank expert. The byte
// arithmetic is the proof's own: it must stay independent of convert's code, which it checks.

package byteproof

import (
	"fmt"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// piece is one part of a bank expert: byte ranges of a source tensor, with
// the fold factor they take.
type piece struct {
	m      mat
	ranges [][2]int64
	fold   float64
	dq     *dequantSeg // dequantised from m's bytes (ranges), nil: those bytes
}

// parts of bank expert b: gate, up, down and their scales, as (tensor, byte
// ranges) with the fold factor of each.
type parts struct {
	gate, up, down, gs, us, ds, gb, ub, db piece
	gg, ug, dg, gi, ui, di                 piece // NVFP4: global and input scales (one F32 each)
}

// layerPrediction predicts the stacks of contract layer li from SRC's
// layer l, marking each SRC tensor it cuts from as consumed.
type layerPrediction struct {
	p        *prediction
	src      *checkpoint.Checkpoint
	c        *layout.Contract
	li       layout.LayerInfo
	l        *family.Layer
	consumed map[string]bool
	I, H     int64
	E        int              // routed experts; bank ids from E on are shared replicas
	S        int64            // slices of the shared expert (1 when it is not sliced)
	of       weightfmt.Format // how DST stores the experts
	wf       weightfmt.Format // how SRC stores the routed experts
	sharedF  weightfmt.Format // and the shared expert
	fold     weightfmt.FoldRule
	rsf      float64 // the factor folded into the routed experts (0: none)
	glob     weightfmt.GlobalScale
	globbed  bool
	// virtual are the tensors of a requantised shared expert
	// (shared_requantized): computed from SRC's bytes, read as SRC's.
	virtual map[string]*checkpoint.Tensor
	requant family.MLP
	banks   []parts // by bank id
	addErr  error   // the first stack that could not be laid out
}

func (p *prediction) layer(src *checkpoint.Checkpoint, plan *family.Plan, c *layout.Contract, li layout.LayerInfo, l *family.Layer, consumed map[string]bool) error {
	lp, err := newLayerPrediction(p, src, plan, c, li, l, consumed)
	if err != nil {
		return err
	}
	bank := c.BankSize()
	lp.banks = make([]parts, bank)
	for b := range bank {
		var err error
		if lp.banks[b], err = lp.expert(b); err != nil {
			return err
		}
	}
	if l.Shared != nil && c.NumFusedSharedExperts == 0 {
		// an unfused shared expert is copied as it is
		for _, n := range l.Shared.NamesOf(layout.RoleWeight, layout.RoleScale, layout.RoleGlobal, layout.RoleInput) {
			delete(consumed, checkpoint.BaseName(n))
		}
	}
	return lp.addStacks()
}

// newLayerPrediction checks what the layer's prediction rests on (the
// formats, the shared expert's split, the fold) and computes a requantised
// shared expert's tensors.
func newLayerPrediction(p *prediction, src *checkpoint.Checkpoint, plan *family.Plan, c *layout.Contract, li layout.LayerInfo, l *family.Layer, consumed map[string]bool) (*layerPrediction, error) {
	lp := &layerPrediction{p: p, src: src, c: c, li: li, l: l, consumed: consumed,
		I: int64(plan.IntermediateOf(*l)), H: int64(plan.HiddenSize), E: c.NumExperts}
	I, H := lp.I, lp.H
	var err error
	if lp.of, err = c.Format(); err != nil { // how DST stores the experts
		return nil, fmt.Errorf("%s: %w", src.Dir, err)
	}
	// How SRC stores them: as DST does, or as the contract records the
	// dequantised experts' source format; a shared expert dequantising
	// leaves plain (Kimi's BF16 beside INT4) is read as plain.
	if lp.wf, lp.sharedF, err = srcFormats(plan, c, lp.of); err != nil {
		return nil, fmt.Errorf("%s: %w", src.Dir, err)
	}
	lp.S = int64(max(c.SharedSlices, 1))
	if c.NumFusedSharedExperts > 0 && l.Shared == nil {
		return nil, fmt.Errorf("%s: layer %d: the contract fuses a shared expert SRC does not have", src.Dir, li.Index)
	}
	gateRows := weightfmt.Matrix{Format: lp.sharedF, Rows: lp.S * I, Cols: H}
	downCols := weightfmt.Matrix{Format: lp.sharedF, Rows: H, Cols: lp.S * I}
	for s := int64(1); c.NumFusedSharedExperts > 0 && s < lp.S; s++ {
		if !gateRows.RowSplitExact(s*I) || !downCols.ColSplitExact(s*I) {
			return nil, fmt.Errorf("%s: layer %d: I %d is not a multiple of the %s block, so the shared expert cannot be split", src.Dir, li.Index, I, lp.sharedF)
		}
	}
	// rsf, when folded, multiplies the routed experts' down weights or
	// their scales, as the format folds it.
	lp.fold = lp.wf.Fold()
	if c.RoutedScalingFactorFolded && lp.fold.Into == weightfmt.FoldNowhere {
		return nil, fmt.Errorf("%s: the contract folds routed_scaling_factor into %s experts, which cannot take it: %s", src.Dir, lp.wf, lp.fold.Refusal("it"))
	}
	// A requantised shared expert (shared_requantized) is predicted by
	// quantising SRC's plain shared expert again into the contract's
	// format: virtual tensors computed from SRC's bytes.
	lp.virtual = map[string]*checkpoint.Tensor{}
	if c.SharedRequantized != nil && l.Shared != nil {
		var err error
		if lp.requant, err = checkpoint.RequantisedMLP(src, *l.Shared, lp.wf, func(t *checkpoint.Tensor) { lp.virtual[t.Name] = t }); err != nil {
			return nil, fmt.Errorf("layer %d: %w", li.Index, err)
		}
		for _, n := range []string{l.Shared.Weight(layout.ProjGate), l.Shared.Weight(layout.ProjUp), l.Shared.Weight(layout.ProjDown)} {
			consumed[checkpoint.BaseName(n)] = true
		}
	}
	lp.glob, lp.globbed = weightfmt.GlobalOf(lp.wf)
	if c.RoutedScalingFactorFolded {
		lp.rsf = c.RoutedScalingFactor
	}
	return lp, nil
}

// get is SRC's tensor name (or a virtual one) as a [rows, cols] matrix,
// consumed.
func (lp *layerPrediction) get(name string, rows, cols int64) (mat, error) {
	t, ok := lp.virtual[name]
	if !ok {
		t, ok = lp.src.Tensor(name)
	}
	if !ok {
		return mat{}, fmt.Errorf("%s: layer %d: tensor %s is missing", lp.src.Dir, lp.li.Index, name)
	}
	if len(t.Shape) != 2 || t.Shape[0] != rows || t.Shape[1] != cols {
		return mat{}, fmt.Errorf("%s: layer %d: tensor %s has shape %v, want [%d,%d]", t.File, lp.li.Index, name, t.Shape, rows, cols)
	}
	lp.consumed[checkpoint.BaseName(name)] = true // a view consumes the stacked tensor it is cut from
	return mat{t, rows, cols}, nil
}

// scalar is SRC's one-value global or input scale name, consumed.
func (lp *layerPrediction) scalar(name string) (piece, error) {
	t, ok := lp.src.Tensor(name)
	if !ok {
		return piece{}, fmt.Errorf("%s: layer %d: tensor %s is missing", lp.src.Dir, lp.li.Index, name)
	}
	if t.DType != lp.glob.DType || t.NumElements() != 1 {
		return piece{}, fmt.Errorf("%s: layer %d: tensor %s is %s %v, want one %s", t.File, lp.li.Index, name, t.DType, t.Shape, lp.glob.DType)
	}
	lp.consumed[checkpoint.BaseName(name)] = true
	m := mat{t, 1, 1}
	return piece{m, m.all(), 0, nil}, nil
}

// expert finds the parts of bank expert b in SRC: routed expert b, or slice
// (b-E) mod S of the shared expert.
func (lp *layerPrediction) expert(b int) (parts, error) {
	c, l, I, H := lp.c, lp.l, lp.I, lp.H
	var pr parts
	m, s, n := family.MLP{}, int64(0), int64(1)
	routed := b < lp.E
	wf := lp.wf
	if routed {
		m = l.Experts[b]
	} else {
		m = *l.Shared
		if c.SharedRequantized != nil {
			m = lp.requant
		}
		s, n = int64((b-lp.E)%int(lp.S)), lp.S
		wf = lp.sharedF
	}
	_, scaled := wf.Scale()
	// The stored [rows, cols]: fewer columns where elements pack
	// (INT4: eight to an I32 along a row).
	gsh := weightfmt.Matrix{Format: wf, Rows: n * I, Cols: H}.Shape()
	dsh := weightfmt.Matrix{Format: wf, Rows: H, Cols: n * I}.Shape()
	var g mat
	var err error
	if m.Weight(layout.ProjGate) != "" { // "": ungated (Nemotron-H), whose contract names no gate stack
		if g, err = lp.get(m.Weight(layout.ProjGate), gsh[0], gsh[1]); err != nil {
			return pr, err
		}
	} else if scaled {
		return pr, fmt.Errorf("%s: layer %d: ungated experts stored in %s are not supported", lp.src.Dir, lp.li.Index, wf)
	}
	u, err := lp.get(m.Weight(layout.ProjUp), gsh[0], gsh[1])
	if err != nil {
		return pr, err
	}
	d, err := lp.get(m.Weight(layout.ProjDown), dsh[0], dsh[1])
	if err != nil {
		return pr, err
	}
	// compressed-tensors' weight_shape (INT4): checked by the plan
	// (it holds the expert's [out, in]) and not written: the contract
	// states every expert's shape.
	for _, sh := range []string{m.Get(layout.ProjGate, layout.RoleShape), m.Get(layout.ProjUp, layout.RoleShape), m.Get(layout.ProjDown, layout.RoleShape)} {
		if sh == "" {
			continue
		}
		if _, ok := lp.src.Tensor(sh); !ok {
			return pr, fmt.Errorf("%s: layer %d: tensor %s is missing", lp.src.Dir, lp.li.Index, sh)
		}
		lp.consumed[checkpoint.BaseName(sh)] = true
	}
	// Slice s of a shared expert of n*I (all of a routed expert, n = 1).
	rows := weightfmt.Matrix{Format: wf, Rows: n * I, Cols: H}.RowBlock(s*I, I)
	cols := weightfmt.Matrix{Format: wf, Rows: H, Cols: n * I}.ColBlock(s*I, I)
	pr.gate = piece{g, rows.Weight.Ranges(), 0, nil}
	pr.up = piece{u, rows.Weight.Ranges(), 0, nil}
	pr.down = piece{d, cols.Weight.Ranges(), 0, nil}
	if routed && lp.fold.Into == weightfmt.FoldWeights {
		pr.down.fold = lp.rsf
	}
	if c.ExpertBias {
		if err := lp.expertBiases(&pr, m, routed, b); err != nil {
			return pr, err
		}
	}
	if lp.globbed {
		if err := lp.expertGlobals(&pr, m, b); err != nil {
			return pr, err
		}
	}
	if !scaled {
		return pr, nil
	}
	return pr, lp.expertScales(&pr, m, wf, n, rows, cols, routed)
}

// expertBiases adds bank expert b's biases to pr: views [I,1], [I,1] and
// [1,H] of the stacked biases.
func (lp *layerPrediction) expertBiases(pr *parts, m family.MLP, routed bool, b int) error {
	if m.Get(layout.ProjGate, layout.RoleBias) == "" || !routed {
		return fmt.Errorf("%s: layer %d: the contract has expert biases, SRC's expert %d has none", lp.src.Dir, lp.li.Index, b)
	}
	for _, x := range []struct {
		name       string
		rows, cols int64
		dst        *piece
	}{{m.Get(layout.ProjGate, layout.RoleBias), lp.I, 1, &pr.gb}, {m.Get(layout.ProjUp, layout.RoleBias), lp.I, 1, &pr.ub}, {m.Get(layout.ProjDown, layout.RoleBias), 1, lp.H, &pr.db}} {
		v, err := lp.get(x.name, x.rows, x.cols)
		if err != nil {
			return err
		}
		*x.dst = piece{v, v.all(), 0, nil}
	}
	return nil
}

// expertGlobals adds bank expert b's global scales to pr, and its input
// scales where DST keeps them (or dequantises with them).
func (lp *layerPrediction) expertGlobals(pr *parts, m family.MLP, b int) error {
	c := lp.c
	ins := []string{m.Get(layout.ProjGate, layout.RoleInput), m.Get(layout.ProjUp, layout.RoleInput), m.Get(layout.ProjDown, layout.RoleInput)}
	if !c.InputScales && c.Dequantized == nil {
		ins = []string{"", "", ""}
	} else if c.InputScales && m.Get(layout.ProjGate, layout.RoleInput) == "" {
		return fmt.Errorf("%s: layer %d: the contract has input_scales, SRC's expert %d has none", lp.src.Dir, lp.li.Index, b)
	}
	var err error
	for i, x := range []struct {
		name string
		dst  *piece
	}{{m.Get(layout.ProjGate, layout.RoleGlobal), &pr.gg}, {m.Get(layout.ProjUp, layout.RoleGlobal), &pr.ug}, {m.Get(layout.ProjDown, layout.RoleGlobal), &pr.dg}, {ins[0], &pr.gi}, {ins[1], &pr.ui}, {ins[2], &pr.di}} {
		if i >= 3 && x.name == "" {
			continue
		}
		if *x.dst, err = lp.scalar(x.name); err != nil {
			return err
		}
	}
	return nil
}

// expertScales adds the scales of a bank expert stored as wf (n slices of
// I) to pr, the blocks of rows and cols, and for a dequantised DST how each
// weight decodes.
func (lp *layerPrediction) expertScales(pr *parts, m family.MLP, wf weightfmt.Format, n int64, rows, cols weightfmt.Slice, routed bool) error {
	c, I, H := lp.c, lp.I, lp.H
	gr, gc := weightfmt.Matrix{Format: wf, Rows: n * I, Cols: H}.ScaleShape()
	dr, dc := weightfmt.Matrix{Format: wf, Rows: H, Cols: n * I}.ScaleShape()
	gs, err := lp.get(m.Get(layout.ProjGate, layout.RoleScale), gr, gc)
	if err != nil {
		return err
	}
	us, err := lp.get(m.Get(layout.ProjUp, layout.RoleScale), gr, gc)
	if err != nil {
		return err
	}
	ds, err := lp.get(m.Get(layout.ProjDown, layout.RoleScale), dr, dc)
	if err != nil {
		return err
	}
	pr.gs = piece{gs, rows.Scale.Ranges(), 0, nil}
	pr.us = piece{us, rows.Scale.Ranges(), 0, nil}
	pr.ds = piece{ds, cols.Scale.Ranges(), 0, nil}
	if routed && lp.fold.Into == weightfmt.FoldScales {
		pr.ds.fold = lp.rsf
	}
	if c.Dequantized != nil {
		// DST holds each weight dequantised: its values from the
		// weight's bytes, its scales' and its global scale's.
		to := safetensors.DType(c.Dequantized.DType)
		for _, x := range []struct {
			w, s, g    *piece
			rows, cols int64
		}{{&pr.gate, &pr.gs, &pr.gg, I, H}, {&pr.up, &pr.us, &pr.ug, I, H}, {&pr.down, &pr.ds, &pr.dg, H, I}} {
			x.w.dq = &dequantSeg{m: weightfmt.Matrix{Format: wf, Rows: x.rows, Cols: x.cols}, to: to,
				scale: x.s.m.t, scaleRanges: x.s.ranges, global: x.g.m.t, globalRanges: x.g.ranges}
		}
	}
	return nil
}

// ioSlice is the in-out slice of pieces, each of an [rows, cols] matrix:
// its transpose, or, where SRC stores the expert transposed (a view of a
// Llama 4 or gpt-oss stack), its stored rows.
func ioSlice(pcs []piece, rows, cols int64) (*ioSeg, error) {
	srcs := make([]ioSrc, len(pcs))
	for i, pc := range pcs {
		es := int64(pc.m.t.DType.Size())
		srcs[i] = ioSrc{t: pc.m.t, ranges: pc.ranges, rows: rows, cols: cols, es: es}
		if st, ok := pc.m.t.Untransposed(); ok {
			if pc.m.rows != rows || pc.m.cols != cols {
				return nil, fmt.Errorf("tensor %s: a slice of an expert stored transposed", pc.m.t.Name)
			}
			srcs[i] = ioSrc{t: st, ranges: [][2]int64{{0, st.NumBytes()}}, rows: cols, cols: rows, es: es, stored: true}
		}
	}
	return newIOSeg(srcs...)
}

// one picks a single piece of each bank expert.
func one(f func(parts) piece) func(parts) []piece {
	return func(pr parts) []piece { return []piece{f(pr)} }
}

// add predicts stack name (dtype d, shape): each bank expert's pieces
// (pick) in bank order. mat is the [out, in] of each piece of a weight or
// scale stack, which an in-out stack holds transposed ({0, 0}: no matrix,
// never transposed). A stack that cannot be laid out leaves its error in
// addErr.
func (lp *layerPrediction) add(name string, d safetensors.DType, shape []int64, mat [2]int64, pick func(parts) []piece) {
	if name == "" {
		return
	}
	li := lp.li
	inOut := lp.c.Oriented() == layout.InOut
	lp.p.meta[name] = tensorWant{dtype: d, shape: shape, layer: li.Index, expert: -1}
	var segs []segment
	var off int64
	for b, pr := range lp.banks {
		if inOut && mat[0] > 0 {
			g, err := ioSlice(pick(pr), mat[0], mat[1])
			if err != nil && lp.addErr == nil {
				lp.addErr = fmt.Errorf("%s: layer %d: %w", lp.src.Dir, li.Index, err)
			}
			if err == nil {
				segs = append(segs, segment{off: off, n: g.size(), src: g.srcs[0].t, fold: pick(pr)[0].fold, layer: li.Index, expert: b, io: g})
				off += g.size()
			}
			continue
		}
		for _, pc := range pick(pr) {
			var n int64
			for _, r := range pc.ranges {
				n += r[1] - r[0]
			}
			if pc.dq != nil {
				n = pc.dq.size()
			}
			segs = append(segs, segment{off: off, n: n, src: pc.m.t, ranges: pc.ranges, fold: pc.fold, dq: pc.dq, layer: li.Index, expert: b})
			off += n
		}
	}
	lp.p.tensors[name] = segs
}

// addStacks predicts every stack the contract names for the layer from the
// bank experts' parts.
func (lp *layerPrediction) addStacks() error {
	c, I, H := lp.c, lp.I, lp.H
	names := c.Names(lp.li)
	shapes := c.Shapes(int64(len(lp.banks)), I, H)
	wd, err := safetensors.ParseDType(c.WeightDType)
	if err != nil {
		return fmt.Errorf("%s: contract weight_dtype: %w", lp.src.Dir, err)
	}
	sf, _ := lp.of.Scale()
	gr, gc := weightfmt.Matrix{Format: lp.wf, Rows: I, Cols: H}.ScaleShape()
	dr, dc := weightfmt.Matrix{Format: lp.wf, Rows: H, Cols: I}.ScaleShape()
	// The [out, in] of each piece of a weight or scale stack, which an
	// in-out stack holds transposed.
	gm, dm, gsm, dsm := [2]int64{I, H}, [2]int64{H, I}, [2]int64{gr, gc}, [2]int64{dr, dc}
	if c.Layout.Fused() {
		first, second := func(pr parts) piece { return pr.gate }, func(pr parts) piece { return pr.up }
		fs, ss := func(pr parts) piece { return pr.gs }, func(pr parts) piece { return pr.us }
		if c.Layout == layout.UpGate {
			first, second, fs, ss = second, first, ss, fs
		}
		lp.add(names.Weight(layout.ProjGateUp), wd, shapes.GateUp, gm, func(pr parts) []piece { return []piece{first(pr), second(pr)} })
		lp.add(names.Get(layout.ProjGateUp, layout.RoleScale), sf.DType, shapes.GateUpScale, gsm, func(pr parts) []piece { return []piece{fs(pr), ss(pr)} })
	} else {
		lp.add(names.Weight(layout.ProjGate), wd, shapes.Gate, gm, one(func(pr parts) piece { return pr.gate }))
		lp.add(names.Weight(layout.ProjUp), wd, shapes.Up, gm, one(func(pr parts) piece { return pr.up }))
		lp.add(names.Get(layout.ProjGate, layout.RoleScale), sf.DType, shapes.GateScale, gsm, one(func(pr parts) piece { return pr.gs }))
		lp.add(names.Get(layout.ProjUp, layout.RoleScale), sf.DType, shapes.UpScale, gsm, one(func(pr parts) piece { return pr.us }))
	}
	lp.add(names.Weight(layout.ProjDown), wd, shapes.Down, dm, one(func(pr parts) piece { return pr.down }))
	lp.add(names.Get(layout.ProjDown, layout.RoleScale), sf.DType, shapes.DownScale, dsm, one(func(pr parts) piece { return pr.ds }))
	if lp.globbed {
		lp.addGlobals(names, shapes)
	}
	if bn, ok := c.Biases(lp.li); ok {
		n, bd := int64(len(lp.banks)), lp.banks[0].gb.m.t.DType
		first, second := func(pr parts) piece { return pr.gb }, func(pr parts) piece { return pr.ub }
		if c.Layout == layout.UpGate {
			first, second = second, first
		}
		lp.add(bn.GateUp, bd, []int64{n, 2 * I}, [2]int64{}, func(pr parts) []piece { return []piece{first(pr), second(pr)} })
		lp.add(bn.Gate, bd, []int64{n, I}, [2]int64{}, one(first))
		lp.add(bn.Up, bd, []int64{n, I}, [2]int64{}, one(second))
		lp.add(bn.Down, bd, []int64{n, H}, [2]int64{}, one(func(pr parts) piece { return pr.db }))
	}
	return lp.addErr
}

// addGlobals predicts the global scale stacks, and the input scale stacks
// where the contract keeps them.
func (lp *layerPrediction) addGlobals(names layout.ExpertTensors, shapes layout.Shapes) {
	c, glob := lp.c, lp.glob
	// each role's pieces of gate, up and down, read from SRC by this proof
	picks := map[layout.Role]func(parts) (piece, piece, piece){
		layout.RoleGlobal: func(pr parts) (piece, piece, piece) { return pr.gg, pr.ug, pr.dg },
		layout.RoleInput:  func(pr parts) (piece, piece, piece) { return pr.gi, pr.ui, pr.di },
	}
	for _, st := range layout.StackOrder {
		pk, ok := picks[st.Role]
		if !ok || (st.Role == layout.RoleInput && !c.InputScales) {
			continue
		}
		var pick func(parts) []piece
		switch st.Proj {
		case layout.ProjGateUp:
			pick = func(pr parts) []piece {
				g, u, _ := pk(pr)
				if c.Layout == layout.UpGate {
					g, u = u, g
				}
				return []piece{g, u}
			}
		case layout.ProjGate:
			pick = one(func(pr parts) piece { g, _, _ := pk(pr); return g })
		case layout.ProjUp:
			pick = one(func(pr parts) piece { _, u, _ := pk(pr); return u })
		default:
			pick = one(func(pr parts) piece { _, _, d := pk(pr); return d })
		}
		lp.add(names.Get(st.Proj, st.Role), glob.DType, shapes.Of(st.Proj, st.Role), [2]int64{}, pick)
	}
}
