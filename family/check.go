package family

import (
	"fmt"
	"github.com/moeprep/moeprep/layout"
	"slices"
	"strings"

	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// checker checks tensors against a plan's sizes and remembers the expert
// weight dtype, which must be the same for every expert of every layer (and
// the shared expert, which fuse-shared appends to the same stack).
type checker struct {
	t         Tensors
	p         *Plan
	dtype     safetensors.DType
	dtypeFrom string               // the tensor that set dtype, for error messages
	scaleFrom string               // the scale tensor that set Plan.ScaleDType, for error messages
	hash      func(layer int) bool // hash-routed layers (nil: none)
	// sharedBias: shared MLPs carry gate, up and down biases (ERNIE 4.5 use_bias).
	sharedBias bool
	// noBias: config.json turns the router's correction bias off (biasIf).
	noBias bool
	// inShared: the MLP being checked is a shared expert (which may be
	// stored apart from the routed experts: Plan.SharedQuantization);
	// sharedFrom set Plan.SharedWeightDType, for error messages.
	inShared   bool
	sharedFrom string
	// nvInputSeen: an NVFP4 weight was checked, which set
	// Plan.NVFP4InputScale (from nvInputFrom).
	nvInputSeen bool
	nvInputFrom string
	// sharedSeen: sharedApart has decided how the shared expert is stored.
	sharedSeen bool
}

func isFloat(d safetensors.DType) bool {
	return d == safetensors.BF16 || d == safetensors.F16 || d == safetensors.F32
}

// anyOf reports whether any projection weight of an MLP exists, by its
// plain name or the name the plan's format stores it under.
func (k *checker) anyOf(prefix string, proj [3]string) bool {
	f, err := k.p.Format()
	for _, pr := range proj {
		w := prefix + "." + pr + ".weight"
		if _, ok := k.t.Lookup(w); ok {
			return true
		}
		if _, ok := k.t.Lookup(weightfmt.TensorsOf(f, w).Weight); ok && err == nil {
			return true
		}
	}
	return false
}

// mustFormat is p's format where it is known to build (messages).
func mustFormat(p *Plan) weightfmt.Format {
	f, err := p.Format()
	if err != nil {
		return weightfmt.Plain(safetensors.BF16)
	}
	return f
}

// wholeStack checks one tensor holding many experts' weights: its shape,
// and an unquantised float dtype (quantised stacks are not planned: their
// scales would need views too).
func (k *checker) wholeStack(where, name string, shape []int64, hint string) error {
	meta, ok := k.t.Lookup(name)
	if !ok {
		return fmt.Errorf("%s: missing tensor %s %s", where, name, hint)
	}
	if !slices.Equal(meta.Shape, shape) {
		return fmt.Errorf("%s: %s shape %s, expected %s %s", where, name, shapeString(meta.Shape), shapeString(shape), hint)
	}
	if f, err := k.scaledBy(meta.DType); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	} else if f != nil {
		return fmt.Errorf("%s: %s: %s experts stacked on disk are not supported", where, name, f)
	}
	return nil
}

// views plans one MLP stored as a gate-up tensor (gate rows, then up rows)
// and a down tensor: slice e of stacked ones, or (e < 0) whole 2-D ones.
// Transposed, the gate and up are column blocks and every piece is read
// transposed, so the MLP's matrices are [I,H], [I,H], [H,I] as always.
func (k *checker) views(where, gateUp, down string, e, inter int, transposed, interleaved bool, hint string) (MLP, error) {
	m := gateUpViews(gateUp, down, e, inter, interleaved)
	if transposed {
		m = MLPOf(TransposedViewName(gateUp, e, 0, inter, 1), TransposedViewName(gateUp, e, inter, inter, 1), TransposedViewName(down, e, 0, k.p.HiddenSize, 1))
		if interleaved {
			m.Set(layout.ProjGate, layout.RoleWeight, TransposedViewName(gateUp, e, 0, inter, 2))
			m.Set(layout.ProjUp, layout.RoleWeight, TransposedViewName(gateUp, e, 1, inter, 2))
		}
	}
	if err := k.viewWeights(where, m, inter, hint); err != nil {
		return MLP{}, err
	}
	return m, nil
}

// gateUpViews names MLP e of a stack gate-up [E, 2I, H] (gate rows then
// up rows, or interleaved: gate rows 0, 2, 4, ..., up rows 1, 3, 5, ...)
// and down [E, H, I]; e < 0: a 2-D gate-up [2I, H] and down [H, I].
func gateUpViews(gateUp, down string, e, inter int, interleaved bool) MLP {
	if interleaved {
		return MLPOf(StridedRowsViewName(gateUp, e, 0, inter, 2), StridedRowsViewName(gateUp, e, 1, inter, 2), ViewName(down, e, 0, 0))
	}
	return MLPOf(ViewName(gateUp, e, 0, inter), ViewName(gateUp, e, inter, 2*inter), ViewName(down, e, 0, 0))
}

// viewWeights checks the gate, up and down views of one MLP of
// intermediate size inter.
func (k *checker) viewWeights(where string, m MLP, inter int, hint string) error {
	names := [3]string{m.Weight(layout.ProjGate), m.Weight(layout.ProjUp), m.Weight(layout.ProjDown)}
	return k.eachProj([3]string{"gate", "up", "down"}, inter, func(n int, role string, rows, cols int64) error {
		_, err := k.weight(where, role, names[n], rows, cols, hint)
		return err
	})
}

// mlp checks one SwiGLU MLP of intermediate size inter: gate and up
// [inter,H], down [H,inter].
func (k *checker) mlp(where, prefix string, proj [3]string, inter int, hint string) (MLP, error) {
	if err := k.sharedApart(where, prefix, proj); err != nil {
		return MLP{}, err
	}
	switch {
	case k.inShared && k.p.SharedQuantization == QuantNone:
		return k.plainSharedMLP(where, prefix, proj, inter, hint)
	case k.inShared && k.p.SharedQuantization != "":
		return k.apartSharedMLP(where, prefix, proj, inter, hint)
	case k.p.Quantization == QuantInt4Pack:
		return k.int4MLP(where, prefix, proj, inter, hint)
	case k.p.Quantization == QuantMXFP4 && k.p.Naming == "":
		return MLP{}, fmt.Errorf("%s: MXFP4 (quant_method mxfp4) is carried for gpt-oss's experts stacked on disk only, not for %s's per-expert tensors", where, k.p.Family)
	case k.p.Quantization.nvfp4() || k.p.Quantization == QuantMXFP4:
		return k.packedMLP(where, prefix, proj, inter, hint)
	}
	var m MLP
	if err := k.eachProj(proj, inter, func(n int, pr string, rows, cols int64) error {
		name := prefix + "." + pr + ".weight"
		m.Set(layout.MLPProjs[n], layout.RoleWeight, name)
		scale, err := k.weight(where, pr, name, rows, cols, hint)
		if meta, ok := k.t.Lookup(name); ok && err == nil {
			m.Set(layout.MLPProjs[n], layout.RoleWeight, own(name, meta))
		}
		m.Set(layout.MLPProjs[n], layout.RoleScale, scale)
		return err
	}); err != nil {
		return MLP{}, err
	}
	return m, nil
}

// own is name, built to look its tensor up, as the view holds it
// (TensorMeta.Name) where the view says: the plan of a checkpoint of many
// experts then holds no second copy of their names.
func own(name string, meta TensorMeta) string {
	if meta.Name == name {
		return meta.Name
	}
	return name
}

// eachProj calls f on each projection of an MLP of intermediate size inter,
// in order (n 0, 1, 2: gate, up, down; pr its name in proj), with the
// [rows, cols] of its weight: gate and up [inter,H], down [H,inter]. It
// stops at the first error f returns.
func (k *checker) eachProj(proj [3]string, inter int, f func(n int, pr string, rows, cols int64) error) error {
	h, i := int64(k.p.HiddenSize), int64(inter)
	if k.inShared {
		h = int64(k.p.ModelHidden()) // a latent MoE's shared experts run on x
	}
	for n, pr := range proj {
		if pr == "" {
			continue // an ungated MLP's gate (Nemotron-H: up and down only)
		}
		rows, cols := i, h
		if n == 2 {
			rows, cols = h, i
		}
		if err := f(n, pr, rows, cols); err != nil {
			return err
		}
	}
	return nil
}

// scaledBy is the quantised format the expert weights are under when the
// plan names one, or else the one whose weights are stored as dtype d; nil
// when neither (plain weights).
func (k *checker) scaledBy(d safetensors.DType) (weightfmt.Format, error) {
	f, err := k.p.Format()
	if err != nil {
		return nil, err
	}
	if _, ok := f.Scale(); ok {
		return f, nil
	}
	if f, ok := weightfmt.ScaledDType(d); ok {
		return f, nil
	}
	return nil, nil
}

// weight checks one expert projection and, when the plan's format is
// quantised, the scale tensor the format names for it (its dtype and its
// grid), returning the scale's name ("" when not quantised).
func (k *checker) weight(where, role, name string, rows, cols int64, hint string) (string, error) {
	meta, ok := k.t.Lookup(name)
	if !ok {
		return "", fmt.Errorf("%s: missing tensor %s", where, name)
	}
	if want := []int64{rows, cols}; !slices.Equal(meta.Shape, want) {
		return "", fmt.Errorf("%s: %s shape %s, expected %s %s", where, role, shapeString(meta.Shape), shapeString(want), hint)
	}
	if err := k.weightDType(where, role, name, meta.DType); err != nil {
		return "", err
	}
	if k.p.Quantization.scaleDTypeRead() && k.p.ScaleDType == "" {
		// The format's scale dtype is the producer's: the first expert
		// scale's, which every other must then match.
		if sm, ok := k.t.Lookup(name + "_scale"); ok && isFloat(sm.DType) {
			k.p.ScaleDType, k.scaleFrom = sm.DType, name+"_scale"
		}
	}
	f, err := k.p.Format()
	if err != nil {
		return "", fmt.Errorf("%s: %w", where, err)
	}
	sc, scaled := f.Scale()
	if !scaled {
		// Plain weights: neither a quantised format's weight dtype nor its
		// scale tensor may be there.
		if q, ok := weightfmt.ScaledDType(meta.DType); ok {
			return "", fmt.Errorf("%s: %s is %s but config.json has no %s quantization_config", where, name, meta.DType, lower(q))
		}
		for _, q := range weightfmt.Scaled() {
			s, _ := q.Scale()
			if _, has := k.t.Lookup(s.Name(name)); has {
				return "", fmt.Errorf("%s: block scale %s present but %s is %s, not %s", where, s.Name(name), name, meta.DType, q.DType())
			}
		}
		return "", nil
	}
	if meta.DType != f.DType() {
		return "", fmt.Errorf("%s: %s is %s but config.json quantization_config says %s", where, name, meta.DType, lower(f))
	}
	sn := weightfmt.TensorsOf(f, name).Scale
	sm, hasScale := k.t.Lookup(sn)
	if !hasScale {
		what := "block scales"
		if sc.Block[1] == 0 {
			what = "scales"
		}
		return "", fmt.Errorf("%s: missing tensor %s (%s weights need their %s)", where, sn, f, what)
	}
	if sm.DType != sc.DType {
		if k.scaleFrom != "" {
			return "", fmt.Errorf("%s: %s dtype %s, expected %s like %s", where, sn, sm.DType, sc.DType, k.scaleFrom)
		}
		return "", fmt.Errorf("%s: %s dtype %s, expected %s", where, sn, sm.DType, sc.DType)
	}
	r, c := weightfmt.Matrix{Format: f, Rows: rows, Cols: cols}.ScaleShape()
	if want := []int64{r, c}; !slices.Equal(sm.Shape, want) {
		return "", fmt.Errorf("%s: %s shape %s, expected %s (%s of %s weight %s)",
			where, sn, shapeString(sm.Shape), shapeString(want), gridWords(sc.Block), role, shapeString(meta.Shape))
	}
	return own(sn, sm), nil
}

// gridWords says what one scale entry covers: "128x128 blocks", "one per
// output row", "one per weight".
func gridWords(b [2]int64) string {
	switch {
	case b == [2]int64{0, 0}:
		return "one scale per weight, stored [], [1] or [1,1]"
	case b[0] == 1 && b[1] == 0:
		return "one scale per output row"
	}
	return fmt.Sprintf("%dx%d blocks", b[0], b[1])
}

// lower is a format's name as config.json's quant_method writes it ("fp8").
func lower(f weightfmt.Format) string { return strings.ToLower(f.String()) }

// weightDType checks an expert weight's dtype: a plain float or the weight
// dtype of a quantised format, and the same for every expert weight.
func (k *checker) weightDType(where, role, name string, d safetensors.DType) error {
	if _, quant := weightfmt.ScaledDType(d); !isFloat(d) && !quant {
		allowed := "BF16, F16, F32"
		scaled := weightfmt.Scaled()
		for i, q := range scaled {
			sep := ", "
			if i == len(scaled)-1 {
				sep = " or "
			}
			allowed += sep + string(q.DType())
		}
		return fmt.Errorf("%s: %s dtype %s is not supported (expert weights must be %s)", where, name, d, allowed)
	}
	if k.dtype == "" {
		k.dtype, k.dtypeFrom = d, name
		return nil
	}
	if d != k.dtype {
		return fmt.Errorf("%s: %s dtype %s, expected %s like %s", where, role, d, k.dtype, k.dtypeFrom)
	}
	return nil
}

// router checks the router weight [E,H], or [E+S,H] where it also scores
// the shared experts (Inkling). It stays a float matrix even in FP8
// checkpoints (DeepSeek keeps gate.weight BF16).
func (k *checker) router(where, name string) error {
	if k.p.SharedRouted {
		return k.small(where, "router", name, []int64{int64(k.p.NumExperts + k.p.NumSharedExperts), int64(k.p.ModelHidden())},
			fmt.Sprintf("(E=%d routed + S=%d shared rows, H=%d)", k.p.NumExperts, k.p.NumSharedExperts, k.p.ModelHidden()))
	}
	if z := k.p.ZeroExperts; z > 0 {
		return k.small(where, "router", name, []int64{int64(k.p.NumExperts + z), int64(k.p.ModelHidden())},
			fmt.Sprintf("(E=%d routed + Z=%d zero-compute rows, H=%d)", k.p.NumExperts, z, k.p.ModelHidden()))
	}
	return k.small(where, "router", name, []int64{int64(k.p.NumExperts), int64(k.p.ModelHidden())},
		fmt.Sprintf("(E=%d, H=%d)", k.p.NumExperts, k.p.ModelHidden()))
}

// sharedStack plans S shared experts stored stacked under prefix: gate and
// up [S, I, H], down [S, H, I] (proj names without ".weight"), or gate-up
// [S, 2I, H] and down [S, H, I] where n names them (sharedStackedGateUp),
// one MLP of views per shared expert.
func (k *checker) sharedStack(where, prefix string, n naming) ([]MLP, error) {
	s, h, i := int64(k.p.NumSharedExperts), int64(k.p.HiddenSize), int64(k.p.MoEIntermediateSize)
	hint := fmt.Sprintf("(S=%d, H=%d, I=%d: shared experts stacked on disk)", s, h, i)
	type stack struct {
		name  string
		shape []int64
	}
	stacks := []stack{{prefix + "." + n.proj[0], []int64{s, i, h}}, {prefix + "." + n.proj[1], []int64{s, i, h}}, {prefix + "." + n.proj[2], []int64{s, h, i}}}
	if n.sharedStackedGateUp != "" {
		stacks = []stack{{prefix + "." + n.sharedStackedGateUp, []int64{s, 2 * i, h}}, {prefix + "." + n.sharedStackedDown, []int64{s, h, i}}}
	}
	for _, st := range stacks {
		meta, ok := k.t.Lookup(st.name)
		if !ok {
			return nil, fmt.Errorf("%s: missing tensor %s %s", where, st.name, hint)
		}
		if !slices.Equal(meta.Shape, st.shape) {
			return nil, fmt.Errorf("%s: %s shape %s, expected %s %s", where, st.name, shapeString(meta.Shape), shapeString(st.shape), hint)
		}
		if f, err := k.scaledBy(meta.DType); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		} else if f != nil {
			return nil, fmt.Errorf("%s: %s: %s experts stacked on disk are not supported", where, st.name, f)
		}
	}
	out := make([]MLP, s)
	for e := range out {
		var m MLP
		if n.sharedStackedGateUp != "" {
			m = gateUpViews(stacks[0].name, stacks[1].name, e, int(i), n.stackedInterleaved)
		} else {
			m = MLPOf(ViewName(stacks[0].name, e, 0, 0), ViewName(stacks[1].name, e, 0, 0), ViewName(stacks[2].name, e, 0, 0))
		}
		w := fmt.Sprintf("%s: shared expert %d", where, e)
		if err := k.viewWeights(w, m, int(i), hint); err != nil {
			return nil, err
		}
		out[e] = m
	}
	return out, nil
}

// bias checks e_score_correction_bias [E]. F32 is what DeepSeek ships; a
// BF16 or F16 bias is legal in a file and kept as it is (never re-cast:
// rounding collapses distinct biases and re-routes tokens).
// bias checks a correction bias [E], or [1,E] where the family stores it
// so (row: ERNIE 4.5).
func (k *checker) bias(where, name string, row bool) error {
	n := int64(k.p.NumExperts + k.p.ZeroExperts) // LongCat-Flash's bias covers its zero-compute rows too
	want := []int64{n}
	if row {
		want = []int64{1, n}
	}
	hint := fmt.Sprintf("(E=%d; sigmoid routing needs e_score_correction_bias)", k.p.NumExperts)
	if k.p.ZeroExperts > 0 {
		hint = fmt.Sprintf("(E=%d routed + Z=%d zero-compute)", k.p.NumExperts, k.p.ZeroExperts)
	}
	return k.small(where, "router bias", name, want, hint)
}

// mlpBiases plans the biases of a hub-layout MLP (prefix.<proj>.bias):
// [inter] for gate and up, [H] for down.
func (k *checker) mlpBiases(where, prefix string, proj [3]string, inter int, m *MLP) error {
	for n, pj := range layout.MLPProjs {
		size := int64(inter)
		if n == 2 {
			size = int64(k.p.HiddenSize)
		}
		name := prefix + "." + proj[n] + ".bias"
		if err := k.small(where, proj[n]+" bias", name, []int64{size}, "(config.json use_bias=true)"); err != nil {
			return err
		}
		m.Set(pj, layout.RoleBias, name)
	}
	return nil
}

// hashTable checks a token-to-experts table: [vocab, k] integers.
func (k *checker) hashTable(where, name string) error {
	meta, ok := k.t.Lookup(name)
	if !ok {
		return fmt.Errorf("%s: missing hash routing table %s (config.json mlp_layer_types says hash_moe)", where, name)
	}
	if len(meta.Shape) != 2 || meta.Shape[0] <= 0 || meta.Shape[1] != int64(k.p.TopK) {
		return fmt.Errorf("%s: hash routing table %s shape %s, expected [vocab, %d] (top-k %d)", where, name, shapeString(meta.Shape), k.p.TopK, k.p.TopK)
	}
	if meta.DType != safetensors.I64 && meta.DType != safetensors.I32 {
		return fmt.Errorf("%s: hash routing table %s dtype %s, expected I64 or I32", where, name, meta.DType)
	}
	if meta.Shape[0] > maxVocab { // the commands read the whole table
		return fmt.Errorf("%s: hash routing table %s has %d rows, over the limit of %d (vocabularies run to about 256,000)", where, name, meta.Shape[0], maxVocab)
	}
	return nil
}

// sharedGate checks Qwen2-MoE's per-token shared-expert gate [1,H].
func (k *checker) sharedGate(where, name string) error {
	return k.small(where, "shared expert gate", name, []int64{1, int64(k.p.HiddenSize)},
		fmt.Sprintf("(H=%d)", k.p.HiddenSize))
}

// small checks an unquantised float tensor's presence, shape and dtype.
func (k *checker) small(where, role, name string, want []int64, hint string) error {
	meta, ok := k.t.Lookup(name)
	if !ok {
		return fmt.Errorf("%s: %s: missing tensor %s %s", where, role, name, hint)
	}
	if !slices.Equal(meta.Shape, want) {
		return fmt.Errorf("%s: %s %s shape %s, expected %s %s", where, role, name, shapeString(meta.Shape), shapeString(want), hint)
	}
	if !isFloat(meta.DType) {
		return fmt.Errorf("%s: %s %s dtype %s, expected BF16, F16 or F32", where, role, name, meta.DType)
	}
	return nil
}

// expertBiases plans expert e's biases from stacked [E, 2I] gate-up biases
// (in the order of the gate-up columns: interleaved or gate then up) and
// [E, H] down biases, as views: row e, then the gate or up columns.
func (k *checker) expertBiases(where, gateUp, down string, e int, interleaved bool, m *MLP) error {
	E, h, i := int64(k.p.NumExperts), int64(k.p.HiddenSize), int64(k.p.MoEIntermediateSize)
	for _, w := range []struct {
		name  string
		shape []int64
	}{{gateUp, []int64{E, 2 * i}}, {down, []int64{E, h}}} {
		meta, ok := k.t.Lookup(w.name)
		if !ok {
			return fmt.Errorf("%s: missing tensor %s (E=%d, H=%d, I=%d: expert biases)", where, w.name, E, h, i)
		}
		if !slices.Equal(meta.Shape, w.shape) || !isFloat(meta.DType) {
			return fmt.Errorf("%s: %s is %s %s, expected a float %s", where, w.name, meta.DType, shapeString(meta.Shape), shapeString(w.shape))
		}
	}
	row, n := ViewName(gateUp, -1, e, e+1), int(i) // [1, 2I]: its columns, transposed, are a vector
	m.Set(layout.ProjGate, layout.RoleBias, TransposedViewName(row, -1, 0, n, 1))
	m.Set(layout.ProjUp, layout.RoleBias, TransposedViewName(row, -1, n, n, 1))
	if interleaved {
		m.Set(layout.ProjGate, layout.RoleBias, TransposedViewName(row, -1, 0, n, 2))
		m.Set(layout.ProjUp, layout.RoleBias, TransposedViewName(row, -1, 1, n, 2))
	}
	m.Set(layout.ProjDown, layout.RoleBias, ViewName(down, -1, e, e+1))
	return nil
}

// hasTensor reports whether t holds a tensor named name.
func hasTensor(t Tensors, name string) bool {
	_, ok := t.Lookup(name)
	return ok
}
