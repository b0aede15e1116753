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

// parts of bank expert b: each projection's tensors (gate, up, down;
// ProjGateUp is an output stack only) by role, as (tensor, byte ranges)
// with the fold factor of each. The roles the proof reads are the weight,
// its scale, the bias and NVFP4's global and input scales (one F32 each).
type parts [layout.NumProj][layout.NumRole]piece

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
		for _, p := range layout.MLPProjs {
			consumed[checkpoint.BaseName(l.Shared.Weight(p))] = true
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

// projMatrix is projection p of a bank expert stored as wf, n slices of I
// (a routed expert one): gate and up (and the fused gate-up's halves)
// [n*I, H], down [H, n*I].
func (lp *layerPrediction) projMatrix(p layout.Proj, wf weightfmt.Format, n int64) weightfmt.Matrix {
	if p == layout.ProjDown {
		return weightfmt.Matrix{Format: wf, Rows: lp.H, Cols: n * lp.I}
	}
	return weightfmt.Matrix{Format: wf, Rows: n * lp.I, Cols: lp.H}
}

// projSlice is slice s of I of projection p's matrix m: rows of gate and
// up, columns of down.
func (lp *layerPrediction) projSlice(p layout.Proj, m weightfmt.Matrix, s int64) weightfmt.Slice {
	if p == layout.ProjDown {
		return m.ColBlock(s*lp.I, lp.I)
	}
	return m.RowBlock(s*lp.I, lp.I)
}

// expert finds the parts of bank expert b in SRC: routed expert b, or slice
// (b-E) mod S of the shared expert.
func (lp *layerPrediction) expert(b int) (parts, error) {
	c, l := lp.c, lp.l
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
	for _, p := range layout.MLPProjs {
		// The stored [rows, cols]: fewer columns where elements pack
		// (INT4: eight to an I32 along a row).
		full := lp.projMatrix(p, wf, n)
		var w mat
		if name := m.Weight(p); name != "" || p != layout.ProjGate {
			sh := full.Shape()
			var err error
			if w, err = lp.get(name, sh[0], sh[1]); err != nil {
				return pr, err
			}
		} else if scaled { // ungated (Nemotron-H), whose contract names no gate stack
			return pr, fmt.Errorf("%s: layer %d: ungated experts stored in %s are not supported", lp.src.Dir, lp.li.Index, wf)
		}
		pr[p][layout.RoleWeight] = piece{w, lp.projSlice(p, full, s).Weight.Ranges(), 0, nil}
	}
	if routed && lp.fold.Into == weightfmt.FoldWeights {
		pr[layout.ProjDown][layout.RoleWeight].fold = lp.rsf
	}
	// compressed-tensors' weight_shape (INT4): checked by the plan
	// (it holds the expert's [out, in]) and not written: the contract
	// states every expert's shape.
	for _, p := range layout.MLPProjs {
		sh := m.Get(p, layout.RoleShape)
		if sh == "" {
			continue
		}
		if _, ok := lp.src.Tensor(sh); !ok {
			return pr, fmt.Errorf("%s: layer %d: tensor %s is missing", lp.src.Dir, lp.li.Index, sh)
		}
		lp.consumed[checkpoint.BaseName(sh)] = true
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
	return pr, lp.expertScales(&pr, m, wf, s, n, routed)
}

// expertBiases adds bank expert b's biases to pr: views [I,1], [I,1] and
// [1,H] of the stacked biases.
func (lp *layerPrediction) expertBiases(pr *parts, m family.MLP, routed bool, b int) error {
	if m.Get(layout.ProjGate, layout.RoleBias) == "" || !routed {
		return fmt.Errorf("%s: layer %d: the contract has expert biases, SRC's expert %d has none", lp.src.Dir, lp.li.Index, b)
	}
	for _, p := range layout.MLPProjs {
		rows, cols := lp.I, int64(1)
		if p == layout.ProjDown {
			rows, cols = 1, lp.H
		}
		v, err := lp.get(m.Get(p, layout.RoleBias), rows, cols)
		if err != nil {
			return err
		}
		pr[p][layout.RoleBias] = piece{v, v.all(), 0, nil}
	}
	return nil
}

// expertGlobals adds bank expert b's global scales to pr, and its input
// scales where DST keeps them (or dequantises with them).
func (lp *layerPrediction) expertGlobals(pr *parts, m family.MLP, b int) error {
	c := lp.c
	inputs := c.InputScales || c.Dequantized != nil
	if c.InputScales && m.Get(layout.ProjGate, layout.RoleInput) == "" {
		return fmt.Errorf("%s: layer %d: the contract has input_scales, SRC's expert %d has none", lp.src.Dir, lp.li.Index, b)
	}
	for _, r := range []layout.Role{layout.RoleGlobal, layout.RoleInput} {
		for _, p := range layout.MLPProjs {
			name := m.Get(p, r)
			if r == layout.RoleInput && (!inputs || name == "") {
				continue
			}
			var err error
			if pr[p][r], err = lp.scalar(name); err != nil {
				return err
			}
		}
	}
	return nil
}

// expertScales adds the scales of a bank expert stored as wf (slice s of
// n slices of I) to pr, and for a dequantised DST how each weight decodes.
func (lp *layerPrediction) expertScales(pr *parts, m family.MLP, wf weightfmt.Format, s, n int64, routed bool) error {
	c := lp.c
	for _, p := range layout.MLPProjs {
		full := lp.projMatrix(p, wf, n)
		r, cl := full.ScaleShape()
		sc, err := lp.get(m.Get(p, layout.RoleScale), r, cl)
		if err != nil {
			return err
		}
		pr[p][layout.RoleScale] = piece{sc, lp.projSlice(p, full, s).Scale.Ranges(), 0, nil}
	}
	if routed && lp.fold.Into == weightfmt.FoldScales {
		pr[layout.ProjDown][layout.RoleScale].fold = lp.rsf
	}
	if c.Dequantized != nil {
		// DST holds each weight dequantised: its values from the
		// weight's bytes, its scales' and its global scale's.
		to := safetensors.DType(c.Dequantized.DType)
		for _, p := range layout.MLPProjs {
			w1 := lp.projMatrix(p, wf, 1) // one slice of I
			x := &pr[p]
			x[layout.RoleWeight].dq = &dequantSeg{m: w1, to: to,
				scale: x[layout.RoleScale].m.t, scaleRanges: x[layout.RoleScale].ranges,
				global: x[layout.RoleGlobal].m.t, globalRanges: x[layout.RoleGlobal].ranges}
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

// pick is the pieces of each bank expert that stack (p, r) holds: p's, or
// for the fused gate-up stack gate's and up's in the layout's order.
func (lp *layerPrediction) pick(st layout.Stack) func(parts) []piece {
	if st.Proj != layout.ProjGateUp {
		return func(pr parts) []piece { return []piece{pr[st.Proj][st.Role]} }
	}
	first, second := layout.ProjGate, layout.ProjUp
	if lp.c.Layout == layout.UpGate {
		first, second = second, first
	}
	return func(pr parts) []piece { return []piece{pr[first][st.Role], pr[second][st.Role]} }
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

// proofOrder is the order in which the proof lays out a layer's stacks:
// the gate and up (or gate-up) weights, their scales, down's weight and
// scale, then the rest of layout.StackOrder (the global and input scales)
// in its order. It is not StackOrder's weight-scale pairs: the order
// decides which of several stacks that cannot be laid out (addErr) is
// reported, and the proof keeps the order it has always reported in. A
// stack the contract does not name is passed over.
var proofOrder = func() []layout.Stack {
	out := []layout.Stack{
		{Proj: layout.ProjGate, Role: layout.RoleWeight}, {Proj: layout.ProjUp, Role: layout.RoleWeight}, {Proj: layout.ProjGateUp, Role: layout.RoleWeight},
		{Proj: layout.ProjGate, Role: layout.RoleScale}, {Proj: layout.ProjUp, Role: layout.RoleScale}, {Proj: layout.ProjGateUp, Role: layout.RoleScale},
		{Proj: layout.ProjDown, Role: layout.RoleWeight}, {Proj: layout.ProjDown, Role: layout.RoleScale},
	}
	for _, st := range layout.StackOrder {
		if st.Role != layout.RoleWeight && st.Role != layout.RoleScale {
			out = append(out, st)
		}
	}
	return out
}()

// addStacks predicts every stack the contract names for the layer from the
// bank experts' parts, in proofOrder, then the per-expert biases.
func (lp *layerPrediction) addStacks() error {
	c, I, H := lp.c, lp.I, lp.H
	names := c.Names(lp.li)
	shapes := c.Shapes(int64(len(lp.banks)), I, H)
	wd, err := safetensors.ParseDType(c.WeightDType)
	if err != nil {
		return fmt.Errorf("%s: contract weight_dtype: %w", lp.src.Dir, err)
	}
	sf, _ := lp.of.Scale()
	for _, st := range proofOrder {
		// each role's dtype, and the [out, in] of each piece of a weight
		// or scale stack, which an in-out stack holds transposed
		var d safetensors.DType
		var mat [2]int64
		w := lp.projMatrix(st.Proj, lp.wf, 1)
		switch st.Role {
		case layout.RoleWeight:
			d, mat = wd, [2]int64{w.Rows, w.Cols}
		case layout.RoleScale:
			d = sf.DType
			mat[0], mat[1] = w.ScaleShape()
		case layout.RoleGlobal, layout.RoleInput:
			if !lp.globbed || (st.Role == layout.RoleInput && !c.InputScales) {
				continue
			}
			d = lp.glob.DType
		}
		lp.add(names.Get(st.Proj, st.Role), d, shapes.Of(st.Proj, st.Role), mat, lp.pick(st))
	}
	if bn, ok := c.Biases(lp.li); ok {
		lp.addBiases(bn)
	}
	return lp.addErr
}

// addBiases predicts the per-expert bias stacks bn names: the fused
// gate-up's (gate's and up's in the layout's order), or the first and
// second of the pair apart, and down's.
func (lp *layerPrediction) addBiases(bn layout.ExpertBiases) {
	n, bd := int64(len(lp.banks)), lp.banks[0][layout.ProjGate][layout.RoleBias].m.t.DType
	first, second := layout.ProjGate, layout.ProjUp
	if lp.c.Layout == layout.UpGate {
		first, second = second, first
	}
	bias := func(p layout.Proj) func(parts) []piece { return lp.pick(layout.Stack{Proj: p, Role: layout.RoleBias}) }
	lp.add(bn.GateUp, bd, []int64{n, 2 * lp.I}, [2]int64{}, bias(layout.ProjGateUp))
	lp.add(bn.Gate, bd, []int64{n, lp.I}, [2]int64{}, bias(first))
	lp.add(bn.Up, bd, []int64{n, lp.I}, [2]int64{}, bias(second))
	lp.add(bn.Down, bd, []int64{n, lp.H}, [2]int64{}, bias(layout.ProjDown))
}
