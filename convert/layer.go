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
// expert) by projection (gate, up, down) and role: zero parts where it has
// none.
type mlpParts [layout.NumProj][layout.NumRole]part

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
	where := fmt.Sprintf("layer %s (%s)", l.Label(), l.Prefix)
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
	// Room for the shared expert's slices too, which the bank appends:
	// an expert's parts are 4 kB, and the bank is grown once, not copied.
	room := E
	if p.o.FuseShared {
		room += int64(fp.NumSharedExperts) * int64(max(p.o.Replicas, 0))
	}
	routed := make([]mlpParts, E, room)
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
		p.foldDown(&mp)
		routed[e] = mp
		consumed = append(consumed, m.Names()...)
	}
	if p.o.DType != "" {
		p.dq.experts += 3 * len(l.Experts)
	}
	if p.ranks != nil {
		// per rank (ranks.go): no whole-model stacks
		shared, err := p.rankLayer(l, where, routed, I, H)
		return nil, append(consumed, shared...), err
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
	mp[layout.ProjUp][layout.RoleWeight], mp[layout.ProjDown][layout.RoleWeight] = p.whole(u), p.whole(d)
	if g != nil {
		mp[layout.ProjGate][layout.RoleWeight] = p.whole(g)
	}
	if m.Get(layout.ProjGate, layout.RoleBias) != "" {
		for _, pj := range layout.MLPProjs {
			name, role, n := m.Get(pj, layout.RoleBias), " "+pj.String()+" bias", S*I
			if pj == layout.ProjDown {
				n = H
			}
			t, ok := p.ck.Tensor(name)
			if !ok {
				return mp, fmt.Errorf("%s: %s%s: tensor %s is missing", p.ck.Dir, what, role, name)
			}
			if t.NumElements() != n {
				return mp, fmt.Errorf("%s: %s%s: tensor %s has shape %v, want %d values", t.File, what, role, name, t.Shape, n)
			}
			mp[pj][layout.RoleBias] = whole(t)
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
	mp[layout.ProjGate][layout.RoleScale], mp[layout.ProjUp][layout.RoleScale], mp[layout.ProjDown][layout.RoleScale] = whole(gs), whole(us), whole(ds)
	if g, ok := weightfmt.GlobalOf(f); ok {
		for _, sr := range []struct {
			r    layout.Role
			kind string
		}{{layout.RoleGlobal, " global scale"}, {layout.RoleInput, " input scale"}} {
			for _, pj := range layout.MLPProjs {
				name, role := m.Get(pj, sr.r), " "+pj.String()+sr.kind
				if name == "" {
					continue // no input scales
				}
				t, ok := p.ck.Tensor(name)
				if !ok {
					return mp, fmt.Errorf("%s: %s%s: tensor %s is missing", p.ck.Dir, what, role, name)
				}
				if t.DType != g.DType || t.NumElements() != 1 {
					return mp, fmt.Errorf("%s: %s%s: tensor %s is %s %v, want one %s", t.File, what, role, name, t.DType, t.Shape, g.DType)
				}
				mp[pj][sr.r] = whole(t)
			}
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
	if full[layout.ProjGate][layout.RoleWeight].inOut || full[layout.ProjDown][layout.RoleWeight].inOut {
		return mlpParts{}, fmt.Errorf("%s: %s is stored transposed, and slicing it for --orientation in-out is not supported", p.ck.Dir, what)
	}
	rows := weightfmt.Matrix{Format: f, Rows: S * I, Cols: H}.RowBlock(s*I, I)
	cols := weightfmt.Matrix{Format: f, Rows: H, Cols: S * I}.ColBlock(s*I, I)
	_, scaled := f.Scale()
	var sp mlpParts
	for _, pj := range layout.MLPProjs {
		cut := rows // gate and up: rows s*I..; down: columns s*I..
		if pj == layout.ProjDown {
			cut = cols
		}
		if w := m.Weight(pj); w != "" { // "": an ungated expert's gate
			t, _ := p.tensor(w)
			sp[pj][layout.RoleWeight] = piece(t, cut.Weight)
		}
		if scaled {
			t, _ := p.tensor(m.Get(pj, layout.RoleScale))
			sp[pj][layout.RoleScale] = piece(t, cut.Scale)
		}
		// A slice keeps the whole weight's per-tensor scales.
		sp[pj][layout.RoleGlobal], sp[pj][layout.RoleInput] = full[pj][layout.RoleGlobal], full[pj][layout.RoleInput]
	}
	return sp, nil
}

// stacks builds the layer's output tensors over the bank of experts.
func (p *planner) stacks(prefix string, bank []mlpParts, I, H int64, wd safetensors.DType, ungated bool) ([]*outTensor, error) {
	n := int64(len(bank))
	lay := p.o.Layout
	names := layout.NamesIn(lay, prefix, p.o.expertsModule, p.out)
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
		// Most picks are one part an expert: the parts are sized once for
		// that (a plan holds a part per expert per stack per layer).
		t := &outTensor{name: name, dtype: dtype, shape: shape, parts: make([]part, 0, len(bank))}
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
	one := func(f func(mlpParts) part) func(mlpParts) []part {
		return func(m mlpParts) []part { return []part{f(m)} }
	}
	// mat is the [out, in] of a stack's weights or scale grids, zero for
	// the per-expert scalars.
	mat := func(pj layout.Proj, r layout.Role) [2]int64 {
		switch {
		case r == layout.RoleWeight && pj == layout.ProjDown:
			return [2]int64{H, I}
		case r == layout.RoleWeight:
			return [2]int64{I, H}
		case r == layout.RoleScale && pj == layout.ProjDown:
			return [2]int64{dr, dc}
		case r == layout.RoleScale:
			return [2]int64{gr, gc}
		}
		return [2]int64{}
	}
	g, _ := weightfmt.GlobalOf(p.out) // names has no global or input scales when the format has none
	dtypes := map[layout.Role]safetensors.DType{layout.RoleWeight: wd, layout.RoleScale: sd.DType, layout.RoleGlobal: g.DType, layout.RoleInput: g.DType}
	var specs []spec
	for _, st := range layout.StackOrder {
		pj, r := st.Proj, st.Role
		if r == layout.RoleInput && !p.fp.NVFP4InputScale {
			continue
		}
		name := names.Get(pj, r)
		if name == "" {
			continue
		}
		pick := one(func(m mlpParts) part { return m[pj][r] })
		if pj == layout.ProjGateUp {
			// gate's and up's parts of each expert, in the layout's order
			pick = func(m mlpParts) []part { return []part{m[layout.ProjGate][r], m[layout.ProjUp][r]} }
			if lay == layout.UpGate {
				pick = func(m mlpParts) []part { return []part{m[layout.ProjUp][r], m[layout.ProjGate][r]} }
			}
		}
		specs = append(specs, spec{name, dtypes[r], shapes.Of(pj, r), mat(pj, r), pick})
	}
	if p.fp.ExpertBias {
		bn, bd := layout.BiasNamesIn(lay, prefix, p.o.expertsModule), bank[0][layout.ProjGate][layout.RoleBias].dtype
		switch lay {
		case layout.GateUp, layout.UpGate:
			pick := func(m mlpParts) []part {
				return []part{m[layout.ProjGate][layout.RoleBias], m[layout.ProjUp][layout.RoleBias]}
			}
			if lay == layout.UpGate {
				pick = func(m mlpParts) []part {
					return []part{m[layout.ProjUp][layout.RoleBias], m[layout.ProjGate][layout.RoleBias]}
				}
			}
			specs = append(specs, spec{bn.GateUp, bd, layout.Shape{n, 2 * I}, [2]int64{}, pick})
		default:
			specs = append(specs, spec{bn.Gate, bd, layout.Shape{n, I}, [2]int64{}, one(func(m mlpParts) part { return m[layout.ProjGate][layout.RoleBias] })},
				spec{bn.Up, bd, layout.Shape{n, I}, [2]int64{}, one(func(m mlpParts) part { return m[layout.ProjUp][layout.RoleBias] })})
		}
		specs = append(specs, spec{bn.Down, bd, layout.Shape{n, H}, [2]int64{}, one(func(m mlpParts) part { return m[layout.ProjDown][layout.RoleBias] })})
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
