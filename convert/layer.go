package convert

import (
	"fmt"
	"slices"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// mlpParts are the regions of one expert (routed, or one slice of the shared
// expert) in the order the stacks need them.
type mlpParts struct {
	gate, up, down                part
	gateScale, upScale, downScale part
	gateBias, upBias, downBias    part // gpt-oss; zero parts when the family has none
	// NVFP4: the per-tensor second scales and the input scales (F32
	// scalars, 4 bytes each); zero parts for other formats.
	gateGlobal, upGlobal, downGlobal part
	gateInput, upInput, downInput    part
}

// get finds a tensor and checks its dtype and shape.
func (p *planner) get(name, what string, dtype safetensors.DType, shape ...int64) (*checkpoint.Tensor, error) {
	if name == "" {
		return nil, fmt.Errorf("%s: %s: no tensor name in the family plan", p.ck.Dir, what)
	}
	t, ok := p.tensor(name)
	if !ok {
		return nil, fmt.Errorf("%s: %s: tensor %s is missing", p.ck.Dir, what, name)
	}
	if t.DType != dtype {
		return nil, fmt.Errorf("%s: %s: tensor %s is %s, want %s like the other experts", t.File, what, name, t.DType, dtype)
	}
	if !slices.Equal(t.Shape, shape) {
		return nil, fmt.Errorf("%s: %s: tensor %s has shape %v, want %v", t.File, what, name, t.Shape, shape)
	}
	return t, nil
}

// whole is a part covering all of t.
func whole(t *checkpoint.Tensor) part {
	n := t.NumBytes()
	return part{region: region{src: t.Data, file: t.File, tensor: t.Name, rows: 1, rowLen: n, stride: n}, dtype: t.DType}
}

// whole is a part covering all of t, for an in-out output the matrix as
// stored where t is a transposed view of it (Llama 4, gpt-oss).
func (p *planner) whole(t *checkpoint.Tensor) part {
	if p.o.Orientation == layout.InOut {
		if st, ok := t.Untransposed(); ok {
			w := whole(st)
			w.inOut = true
			return w
		}
	}
	return whole(t)
}

// piece is the bytes r of t (a weight or its scale tensor, cut as a
// weightfmt.Matrix says).
func piece(t *checkpoint.Tensor, r weightfmt.Region) part {
	return part{region: region{src: t.Data, file: t.File, tensor: t.Name, off: r.Off, rows: r.Rows, rowLen: r.RowLen, stride: r.Stride}, dtype: t.DType}
}

// layer plans one MoE layer's stacks and lists the source tensors they replace.
func (p *planner) layer(l *family.Layer) ([]*outTensor, []string, error) {
	fp := p.fp
	E, I, H := int64(len(l.Experts)), int64(fp.IntermediateOf(*l)), int64(fp.HiddenSize)
	where := fmt.Sprintf("layer %s (%s)", family.LayerLabel(l.Index), l.Prefix)
	if E != int64(fp.NumExperts) || E == 0 {
		return nil, nil, fmt.Errorf("%s: %s has %d experts, config says %d", p.ck.Dir, where, E, fp.NumExperts)
	}
	if I <= 0 || H <= 0 {
		return nil, nil, fmt.Errorf("%s: %s: intermediate size %d, hidden size %d", p.ck.Dir, where, I, H)
	}
	wd := fp.WeightDType
	if !wd.Valid() {
		return nil, nil, fmt.Errorf("%s: %s: expert weight dtype %q", p.ck.Dir, where, wd)
	}
	var consumed []string
	routed := make([]mlpParts, E)
	for e, m := range l.Experts {
		what := fmt.Sprintf("%s expert %d", where, e)
		var mp mlpParts
		var err error
		if mp, err = p.expert(m, what, I, H, 1, p.wf); err != nil {
			return nil, nil, err
		}
		if mp, err = p.dequantMLP(mp, p.wf, I, H, what); err != nil {
			return nil, nil, err
		}
		switch p.fold.into {
		case weightfmt.FoldWeights:
			mp.down.fold, mp.down.factor, mp.down.stats = true, p.fold.factor, p.st
		case weightfmt.FoldScales:
			mp.downScale.fold, mp.downScale.factor, mp.downScale.stats = true, p.fold.factor, p.st
		}
		routed[e] = mp
		consumed = append(consumed, m.Names()...)
	}
	if p.o.DType != "" {
		p.dq.experts += 3 * len(l.Experts)
	}
	bank := routed
	if p.o.FuseShared {
		S := int64(fp.NumSharedExperts)
		slices := make([]mlpParts, S)
		shared := *l.Shared
		if p.requant {
			var err error
			if shared, err = p.requantMLP(shared); err != nil {
				return nil, nil, err
			}
		}
		sf := p.sharedFormat()
		if _, scaled := sf.Scale(); scaled && p.o.DType != "" && sf != p.wf {
			p.dq.sharedApart += 3 // dequantised by its own format: a group of its own
			p.dq.sharedF = sf
		} else if scaled && p.o.DType != "" {
			p.dq.experts += 3 // the shared expert's weights, however many slices they make
		}
		for s := int64(0); s < S; s++ {
			sp, err := p.sharedSlice(shared, where+" shared expert", I, H, S, s, sf)
			if err != nil {
				return nil, nil, err
			}
			if sp, err = p.dequantMLP(sp, sf, I, H, where+" shared expert"); err != nil {
				return nil, nil, err
			}
			slices[s] = sp
		}
		for r := 0; r < p.o.Replicas; r++ {
			bank = append(bank, slices...) // ids E + r*S + s
		}
		consumed = append(consumed, l.Shared.Names()...)
	}
	outs, err := p.stacks(l.Prefix, bank, I, H, p.out.DType(), fp.RoutedAct(*l).Ungated())
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %s: %w", p.ck.Dir, where, err)
	}
	return outs, consumed, nil
}

// expert checks one expert of intermediate I*S stored in format f (a
// routed expert, S = 1, or the whole shared expert) and returns
// whole-tensor parts.
func (p *planner) expert(m family.MLP, what string, I, H, S int64, f weightfmt.Format) (mlpParts, error) {
	var mp mlpParts
	wd := f.DType()
	// The stored shapes: [rows, cols] for one element a dtype unit,
	// [rows, ceil(cols/8)] for INT4 packed eight to an I32.
	gshape := weightfmt.Matrix{Format: f, Rows: S * I, Cols: H}.Shape()
	dshape := weightfmt.Matrix{Format: f, Rows: H, Cols: S * I}.Shape()
	var g *checkpoint.Tensor
	var err error
	if m.Weight(layout.ProjGate) != "" { // "": an ungated expert (up and down only)
		if g, err = p.get(m.Weight(layout.ProjGate), what+" gate", wd, gshape...); err != nil {
			return mp, err
		}
	}
	u, err := p.get(m.Weight(layout.ProjUp), what+" up", wd, gshape...)
	if err != nil {
		return mp, err
	}
	d, err := p.get(m.Weight(layout.ProjDown), what+" down", wd, dshape...)
	if err != nil {
		return mp, err
	}
	mp.up, mp.down = p.whole(u), p.whole(d)
	if g != nil {
		mp.gate = p.whole(g)
	}
	if m.Get(layout.ProjGate, layout.RoleBias) != "" {
		for _, b := range []struct {
			name, role string
			n          int64
			dst        *part
		}{{m.Get(layout.ProjGate, layout.RoleBias), " gate bias", S * I, &mp.gateBias}, {m.Get(layout.ProjUp, layout.RoleBias), " up bias", S * I, &mp.upBias}, {m.Get(layout.ProjDown, layout.RoleBias), " down bias", H, &mp.downBias}} {
			t, ok := p.ck.Tensor(b.name)
			if !ok {
				return mp, fmt.Errorf("%s: %s%s: tensor %s is missing", p.ck.Dir, what, b.role, b.name)
			}
			if t.NumElements() != b.n {
				return mp, fmt.Errorf("%s: %s%s: tensor %s has shape %v, want %d values", t.File, what, b.role, b.name, t.Shape, b.n)
			}
			*b.dst = whole(t)
		}
	}
	sc, scaled := f.Scale()
	if !scaled {
		return mp, nil
	}
	gr, gc := weightfmt.Matrix{Format: f, Rows: S * I, Cols: H}.ScaleShape()
	dr, dc := weightfmt.Matrix{Format: f, Rows: H, Cols: S * I}.ScaleShape()
	if m.Weight(layout.ProjGate) == "" {
		return mp, fmt.Errorf("%s: %s: ungated experts stored in %s are not supported: moeprep carries them unquantised", p.ck.Dir, what, f)
	}
	gs, err := p.get(m.Get(layout.ProjGate, layout.RoleScale), what+" gate scale", sc.DType, gr, gc)
	if err != nil {
		return mp, err
	}
	us, err := p.get(m.Get(layout.ProjUp, layout.RoleScale), what+" up scale", sc.DType, gr, gc)
	if err != nil {
		return mp, err
	}
	ds, err := p.get(m.Get(layout.ProjDown, layout.RoleScale), what+" down scale", sc.DType, dr, dc)
	if err != nil {
		return mp, err
	}
	mp.gateScale, mp.upScale, mp.downScale = whole(gs), whole(us), whole(ds)
	if g, ok := weightfmt.GlobalOf(f); ok {
		for _, s := range []struct {
			name, role string
			dst        *part
		}{{m.Get(layout.ProjGate, layout.RoleGlobal), " gate global scale", &mp.gateGlobal}, {m.Get(layout.ProjUp, layout.RoleGlobal), " up global scale", &mp.upGlobal}, {m.Get(layout.ProjDown, layout.RoleGlobal), " down global scale", &mp.downGlobal},
			{m.Get(layout.ProjGate, layout.RoleInput), " gate input scale", &mp.gateInput}, {m.Get(layout.ProjUp, layout.RoleInput), " up input scale", &mp.upInput}, {m.Get(layout.ProjDown, layout.RoleInput), " down input scale", &mp.downInput}} {
			if s.name == "" {
				continue // no input scales
			}
			t, ok := p.ck.Tensor(s.name)
			if !ok {
				return mp, fmt.Errorf("%s: %s%s: tensor %s is missing", p.ck.Dir, what, s.role, s.name)
			}
			if t.DType != g.DType || t.NumElements() != 1 {
				return mp, fmt.Errorf("%s: %s%s: tensor %s is %s %v, want one %s", t.File, what, s.role, s.name, t.DType, t.Shape, g.DType)
			}
			*s.dst = whole(t)
		}
	}
	return mp, nil
}

// sharedSlice is slice s of the shared expert of intermediate S*I, stored
// in format f: gate and up rows s*I..(s+1)*I-1, down columns
// s*I..(s+1)*I-1, and the scale entries that cover them (checkFusable made
// sure the splits are exact when S > 1).
func (p *planner) sharedSlice(m family.MLP, what string, I, H, S, s int64, f weightfmt.Format) (mlpParts, error) {
	full, err := p.expert(m, what, I, H, S, f)
	if err != nil || S == 1 {
		return full, err
	}
	if full.gate.inOut || full.down.inOut {
		return mlpParts{}, fmt.Errorf("%s: %s is stored transposed, and slicing it for --orientation in-out is not supported", p.ck.Dir, what)
	}
	u, _ := p.tensor(m.Weight(layout.ProjUp))
	d, _ := p.tensor(m.Weight(layout.ProjDown))
	rows := weightfmt.Matrix{Format: f, Rows: S * I, Cols: H}.RowBlock(s*I, I)
	cols := weightfmt.Matrix{Format: f, Rows: H, Cols: S * I}.ColBlock(s*I, I)
	sp := mlpParts{up: piece(u, rows.Weight), down: piece(d, cols.Weight)}
	if m.Weight(layout.ProjGate) != "" {
		g, _ := p.tensor(m.Weight(layout.ProjGate))
		sp.gate = piece(g, rows.Weight)
	}
	if _, scaled := f.Scale(); scaled {
		gs, _ := p.tensor(m.Get(layout.ProjGate, layout.RoleScale))
		us, _ := p.tensor(m.Get(layout.ProjUp, layout.RoleScale))
		ds, _ := p.tensor(m.Get(layout.ProjDown, layout.RoleScale))
		sp.gateScale, sp.upScale, sp.downScale = piece(gs, rows.Scale), piece(us, rows.Scale), piece(ds, cols.Scale)
	}
	// A slice keeps the whole weight's per-tensor scales.
	sp.gateGlobal, sp.upGlobal, sp.downGlobal = full.gateGlobal, full.upGlobal, full.downGlobal
	sp.gateInput, sp.upInput, sp.downInput = full.gateInput, full.upInput, full.downInput
	return sp, nil
}

// stacks builds the layer's output tensors over the bank of experts.
func (p *planner) stacks(prefix string, bank []mlpParts, I, H int64, wd safetensors.DType, ungated bool) ([]*outTensor, error) {
	n := int64(len(bank))
	lay := p.o.Layout
	names := layout.NamesFor(lay, prefix, p.out)
	if ungated {
		names = names.Ungated() // no all_gate (checkUngated refused the gate-up layouts)
	}
	shapes := layout.StackShapesFor(lay, n, I, H, p.out).Oriented(p.o.Orientation)
	sd, _ := p.out.Scale() // names has no scale tensors when the format has none
	gr, gc := weightfmt.Matrix{Format: p.out, Rows: I, Cols: H}.ScaleShape()
	dr, dc := weightfmt.Matrix{Format: p.out, Rows: H, Cols: I}.ScaleShape()
	// mk stacks pick's parts of every expert; mat is the [out, in] of each
	// weight or scale grid they hold (zero for vectors), which in-out
	// writes transposed.
	mk := func(name string, dtype safetensors.DType, shape layout.Shape, mat [2]int64, pick func(mlpParts) []part) (*outTensor, error) {
		t := &outTensor{name: name, dtype: dtype, shape: shape}
		for _, m := range bank {
			parts := pick(m)
			if p.o.Orientation == layout.InOut && mat[0] > 0 {
				tp, err := transposed(parts, mat[0], mat[1])
				if err != nil {
					return nil, err
				}
				parts = []part{tp}
			}
			t.parts = append(t.parts, parts...)
		}
		want, ok := mul(append([]int64{int64(dtype.Size())}, shape...)...)
		if !ok {
			return nil, fmt.Errorf("tensor %s %v: size overflows", name, shape)
		}
		for _, pt := range t.parts {
			t.size += pt.size()
		}
		if t.size != want {
			return nil, fmt.Errorf("tensor %s %v: parts hold %d bytes, shape needs %d", name, shape, t.size, want)
		}
		return t, nil
	}
	type spec struct {
		name  string
		dtype safetensors.DType
		shape layout.Shape
		mat   [2]int64
		pick  func(mlpParts) []part
	}
	gate, down, gs, ds := [2]int64{I, H}, [2]int64{H, I}, [2]int64{gr, gc}, [2]int64{dr, dc}
	one := func(f func(mlpParts) part) func(mlpParts) []part {
		return func(m mlpParts) []part { return []part{f(m)} }
	}
	var specs []spec
	switch lay {
	case layout.GateUp, layout.UpGate:
		first, second := func(m mlpParts) (part, part) { return m.gate, m.up }, func(m mlpParts) (part, part) { return m.gateScale, m.upScale }
		if lay == layout.UpGate {
			first = func(m mlpParts) (part, part) { return m.up, m.gate }
			second = func(m mlpParts) (part, part) { return m.upScale, m.gateScale }
		}
		specs = append(specs, spec{names.Weight(layout.ProjGateUp), wd, shapes.GateUp, gate, func(m mlpParts) []part { a, b := first(m); return []part{a, b} }})
		specs = append(specs, spec{names.Get(layout.ProjGateUp, layout.RoleScale), sd.DType, shapes.GateUpScale, gs, func(m mlpParts) []part { a, b := second(m); return []part{a, b} }})
		specs = append(specs, spec{names.Weight(layout.ProjDown), wd, shapes.Down, down, one(func(m mlpParts) part { return m.down })})
		specs = append(specs, spec{names.Get(layout.ProjDown, layout.RoleScale), sd.DType, shapes.DownScale, ds, one(func(m mlpParts) part { return m.downScale })})
	default:
		specs = append(specs, spec{names.Weight(layout.ProjGate), wd, shapes.Gate, gate, one(func(m mlpParts) part { return m.gate })})
		specs = append(specs, spec{names.Get(layout.ProjGate, layout.RoleScale), sd.DType, shapes.GateScale, gs, one(func(m mlpParts) part { return m.gateScale })})
		specs = append(specs, spec{names.Weight(layout.ProjUp), wd, shapes.Up, gate, one(func(m mlpParts) part { return m.up })})
		specs = append(specs, spec{names.Get(layout.ProjUp, layout.RoleScale), sd.DType, shapes.UpScale, gs, one(func(m mlpParts) part { return m.upScale })})
		specs = append(specs, spec{names.Weight(layout.ProjDown), wd, shapes.Down, down, one(func(m mlpParts) part { return m.down })})
		specs = append(specs, spec{names.Get(layout.ProjDown, layout.RoleScale), sd.DType, shapes.DownScale, ds, one(func(m mlpParts) part { return m.downScale })})
	}
	if g, ok := weightfmt.GlobalOf(p.out); ok {
		pair := func(f func(mlpParts) (part, part)) func(mlpParts) []part {
			if lay == layout.UpGate {
				return func(m mlpParts) []part { a, b := f(m); return []part{b, a} }
			}
			return func(m mlpParts) []part { a, b := f(m); return []part{a, b} }
		}
		type scalars struct {
			gate, up, gateUp, down string
			pick                   func(mlpParts) (gate, up, down part)
		}
		sets := []scalars{{names.Get(layout.ProjGate, layout.RoleGlobal), names.Get(layout.ProjUp, layout.RoleGlobal), names.Get(layout.ProjGateUp, layout.RoleGlobal), names.Get(layout.ProjDown, layout.RoleGlobal),
			func(m mlpParts) (part, part, part) { return m.gateGlobal, m.upGlobal, m.downGlobal }}}
		if p.fp.NVFP4InputScale {
			sets = append(sets, scalars{names.Get(layout.ProjGate, layout.RoleInput), names.Get(layout.ProjUp, layout.RoleInput), names.Get(layout.ProjGateUp, layout.RoleInput), names.Get(layout.ProjDown, layout.RoleInput),
				func(m mlpParts) (part, part, part) { return m.gateInput, m.upInput, m.downInput }})
		}
		for _, st := range sets {
			pk := st.pick
			switch lay {
			case layout.GateUp, layout.UpGate:
				specs = append(specs, spec{st.gateUp, g.DType, shapes.GateUpGlobal, [2]int64{}, pair(func(m mlpParts) (part, part) { a, b, _ := pk(m); return a, b })})
			default:
				specs = append(specs, spec{st.gate, g.DType, shapes.GateGlobal, [2]int64{}, one(func(m mlpParts) part { a, _, _ := pk(m); return a })},
					spec{st.up, g.DType, shapes.UpGlobal, [2]int64{}, one(func(m mlpParts) part { _, b, _ := pk(m); return b })})
			}
			specs = append(specs, spec{st.down, g.DType, shapes.DownGlobal, [2]int64{}, one(func(m mlpParts) part { _, _, d := pk(m); return d })})
		}
	}
	if p.fp.ExpertBias {
		bn, bd := layout.BiasNames(lay, prefix), bank[0].gateBias.dtype
		switch lay {
		case layout.GateUp, layout.UpGate:
			pick := func(m mlpParts) []part { return []part{m.gateBias, m.upBias} }
			if lay == layout.UpGate {
				pick = func(m mlpParts) []part { return []part{m.upBias, m.gateBias} }
			}
			specs = append(specs, spec{bn.GateUp, bd, layout.Shape{n, 2 * I}, [2]int64{}, pick})
		default:
			specs = append(specs, spec{bn.Gate, bd, layout.Shape{n, I}, [2]int64{}, one(func(m mlpParts) part { return m.gateBias })},
				spec{bn.Up, bd, layout.Shape{n, I}, [2]int64{}, one(func(m mlpParts) part { return m.upBias })})
		}
		specs = append(specs, spec{bn.Down, bd, layout.Shape{n, H}, [2]int64{}, one(func(m mlpParts) part { return m.downBias })})
	}
	out := make([]*outTensor, 0, len(specs))
	for _, s := range specs {
		if s.name == "" { // a scale stack of a format without scales
			continue
		}
		t, err := mk(s.name, s.dtype, s.shape, s.mat, s.pick)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}
