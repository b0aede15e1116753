package validate

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/tensorload"
)

func bf16Bytes(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], numfmt.F32ToBF16(x))
	}
	return b
}

// encodeE4M3 rounds v to the nearest float8_e4m3fn (saturating at 448).
func encodeE4M3(v float32) byte {
	var sign byte
	if v < 0 {
		sign, v = 0x80, -v
	}
	i := sort.Search(0x7F, func(i int) bool { return numfmt.E4M3ToF32(byte(i)) >= v })
	switch {
	case i >= 0x7F:
		i = 0x7E
	case i > 0 && v-numfmt.E4M3ToF32(byte(i-1)) <= numfmt.E4M3ToF32(byte(i))-v:
		i--
	}
	return sign | byte(i)
}

// quantFP8 quantises a rows x cols matrix in 128x128 blocks (scale = amax/448).
func quantFP8(w []float32, rows, cols int) ([]byte, []float32) {
	sr, sc := tensorload.ScaleDims(rows, cols, tensorload.FP8Block, tensorload.FP8Block)
	scale := make([]float32, sr*sc)
	q := make([]byte, len(w))
	for br := range sr {
		for bc := range sc {
			var amax float32
			for r := br * tensorload.FP8Block; r < min(rows, (br+1)*tensorload.FP8Block); r++ {
				for c := bc * tensorload.FP8Block; c < min(cols, (bc+1)*tensorload.FP8Block); c++ {
					amax = max(amax, float32(math.Abs(float64(w[r*cols+c]))))
				}
			}
			s := amax / 448
			if s == 0 {
				s = 1
			}
			scale[br*sc+bc] = s
			for r := br * tensorload.FP8Block; r < min(rows, (br+1)*tensorload.FP8Block); r++ {
				for c := bc * tensorload.FP8Block; c < min(cols, (bc+1)*tensorload.FP8Block); c++ {
					q[r*cols+c] = encodeE4M3(w[r*cols+c] / s)
				}
			}
		}
	}
	return q, scale
}

// encMat is one encoded weight: its bytes and (FP8) its scale grid.
type encMat struct {
	raw   []byte
	scale []float32
	rows  int
	cols  int
}

// memModel is a small hub-layout MoE layer held in memory, with everything
// needed to build its converted twin.
type memModel struct {
	H, I, E, S, K      int
	NGroup, TopKGroup  int
	RSF                float64
	FP8                bool
	Softmax            bool // Qwen/Mixtral-style router (no bias)
	SharedGated        bool // Qwen2-MoE
	prefix             string
	experts            [][3]encMat // gate, up, down
	shared             [3]encMat   // S*I shared MLP (nil raw when S == 0)
	router, bias, sgw  []float32
	dtype              safetensors.DType
	src                cktest.Mem
	plan               *family.Plan
	layerIndex         int
	deepseekLikeBiases bool
}

func (m *memModel) encode(w []float32, rows, cols int) encMat {
	if m.FP8 {
		q, s := quantFP8(w, rows, cols)
		return encMat{raw: q, scale: s, rows: rows, cols: cols}
	}
	return encMat{raw: bf16Bytes(w), rows: rows, cols: cols}
}

func randMat(r *rand.Rand, rows, cols int, std float64) []float32 {
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(r.NormFloat64() * std)
	}
	return w
}

// newMemModel builds the source layer (hub layout) and its plan.
func newMemModel(seed uint64, m memModel) *memModel {
	r := rand.New(rand.NewPCG(seed, 99))
	mm := &m
	mm.layerIndex = 3
	mm.prefix = "model.layers.3.mlp"
	mm.dtype = safetensors.BF16
	if mm.FP8 {
		mm.dtype = safetensors.F8E4M3
	}
	hs, is := 1/math.Sqrt(float64(m.H)), 1/math.Sqrt(float64(m.I))
	for range m.E {
		mm.experts = append(mm.experts, [3]encMat{
			mm.encode(randMat(r, m.I, m.H, hs), m.I, m.H),
			mm.encode(randMat(r, m.I, m.H, hs), m.I, m.H),
			mm.encode(randMat(r, m.H, m.I, is), m.H, m.I),
		})
	}
	if m.S > 0 {
		si := m.S * m.I
		mm.shared = [3]encMat{
			mm.encode(randMat(r, si, m.H, hs), si, m.H),
			mm.encode(randMat(r, si, m.H, hs), si, m.H),
			mm.encode(randMat(r, m.H, si, 1/math.Sqrt(float64(si))), m.H, si),
		}
	}
	mm.router = make([]float32, m.E*m.H)
	for i := range mm.router {
		mm.router[i] = numfmt.RoundBF16(float32(r.NormFloat64() * hs))
	}
	if !m.Softmax {
		mm.bias = make([]float32, m.E)
		for i := range mm.bias {
			if mm.deepseekLikeBiases {
				// DeepSeek-V3-like: a shared offset near 1 with a spread of a few
				// 1e-3, which bf16 (8 mantissa bits, 2^-7 steps at 1) collapses.
				mm.bias[i] = float32(1.0 + 0.004*r.NormFloat64())
			} else {
				mm.bias[i] = float32(0.1 * r.NormFloat64())
			}
		}
	}
	if m.SharedGated {
		mm.sgw = randMat(r, 1, m.H, hs)
		for i := range mm.sgw {
			mm.sgw[i] = numfmt.RoundBF16(mm.sgw[i])
		}
	}
	mm.buildSource()
	return mm
}

func (m *memModel) putMat(s cktest.Mem, name string, e encMat) {
	s.Put(name, m.dtype, []int64{int64(e.rows), int64(e.cols)}, e.raw)
	if m.FP8 {
		sr, sc := tensorload.ScaleDims(e.rows, e.cols, tensorload.FP8Block, tensorload.FP8Block)
		s.PutF32(name+"_scale_inv", []int64{int64(sr), int64(sc)}, e.scale...)
	}
}

func (m *memModel) mlpNames(p string) family.MLP {
	n := family.MLPOf(p+".gate_proj.weight", p+".up_proj.weight", p+".down_proj.weight")
	if m.FP8 {
		for _, pj := range layout.MLPProjs {
			n.Set(pj, layout.RoleScale, n.Weight(pj)+"_scale_inv")
		}
	}
	return n
}

func (m *memModel) buildSource() {
	s := cktest.Mem{}
	l := family.Layer{Index: m.layerIndex, Prefix: m.prefix, Router: m.prefix + ".gate.weight"}
	s.Put(l.Router, safetensors.BF16, []int64{int64(m.E), int64(m.H)}, bf16Bytes(m.router))
	if m.bias != nil {
		l.RouterBias = m.prefix + ".gate.e_score_correction_bias"
		s.PutF32(l.RouterBias, []int64{int64(m.E)}, m.bias...)
	}
	for e, ex := range m.experts {
		n := m.mlpNames(fmt.Sprintf("%s.experts.%d", m.prefix, e))
		m.putMat(s, n.Weight(layout.ProjGate), ex[0])
		m.putMat(s, n.Weight(layout.ProjUp), ex[1])
		m.putMat(s, n.Weight(layout.ProjDown), ex[2])
		l.Experts = append(l.Experts, n)
	}
	if m.S > 0 {
		sp := m.prefix + ".shared_experts"
		if m.SharedGated {
			sp = m.prefix + ".shared_expert"
		}
		n := m.mlpNames(sp)
		m.putMat(s, n.Weight(layout.ProjGate), m.shared[0])
		m.putMat(s, n.Weight(layout.ProjUp), m.shared[1])
		m.putMat(s, n.Weight(layout.ProjDown), m.shared[2])
		l.Shared = &n
		if m.SharedGated {
			l.SharedGate = m.prefix + ".shared_expert_gate.weight"
			s.Put(l.SharedGate, safetensors.BF16, []int64{1, int64(m.H)}, bf16Bytes(m.sgw))
		}
	}
	p := &family.Plan{Family: "deepseek", ModelType: "deepseek_v3", HiddenSize: m.H, MoEIntermediateSize: m.I,
		NumExperts: m.E, NumSharedExperts: m.S, SharedIntermediateSize: m.S * m.I, SharedGated: m.SharedGated,
		TopK: m.K, TopKMethod: moe.TopKNoAuxTC, NGroup: m.NGroup, TopKGroup: m.TopKGroup, Scoring: moe.Sigmoid,
		NormTopKProb: true, RoutedScalingFactor: m.RSF, WeightDType: m.dtype, Quantization: family.QuantNone,
		Layers: []family.Layer{l}}
	if m.Softmax {
		p.Family, p.ModelType, p.Scoring, p.TopKMethod, p.NGroup, p.TopKGroup = "qwen2_moe", "qwen2_moe", moe.Softmax, moe.TopKGreedy, 1, 1
		p.NormTopKProb = false
	}
	if m.FP8 {
		p.Quantization = family.QuantFP8Block
	}
	m.src, m.plan = s, p
}

// rowsOf returns rows [r0,r1) of an encoded matrix (bytes and, for FP8, the
// scale rows that cover them; r0 and r1 must sit on block edges then).
func (m *memModel) rowsOf(e encMat, r0, r1 int) encMat {
	es := m.dtype.Size()
	out := encMat{raw: e.raw[r0*e.cols*es : r1*e.cols*es], rows: r1 - r0, cols: e.cols}
	if m.FP8 {
		_, sc := tensorload.ScaleDims(e.rows, e.cols, tensorload.FP8Block, tensorload.FP8Block)
		out.scale = e.scale[r0/tensorload.FP8Block*sc : ((r1-r0+tensorload.FP8Block-1)/tensorload.FP8Block+r0/tensorload.FP8Block)*sc]
	}
	return out
}

// colsOf returns columns [c0,c1) of an encoded matrix.
func (m *memModel) colsOf(e encMat, c0, c1 int) encMat {
	es := m.dtype.Size()
	out := encMat{rows: e.rows, cols: c1 - c0}
	for r := range e.rows {
		out.raw = append(out.raw, e.raw[(r*e.cols+c0)*es:(r*e.cols+c1)*es]...)
	}
	if m.FP8 {
		sr, sc := tensorload.ScaleDims(e.rows, e.cols, tensorload.FP8Block, tensorload.FP8Block)
		for br := range sr {
			out.scale = append(out.scale, e.scale[br*sc+c0/tensorload.FP8Block:br*sc+(c1+tensorload.FP8Block-1)/tensorload.FP8Block]...)
		}
	}
	return out
}

// convertOpts is how the in-memory converter builds the DST twin.
type convertOpts struct {
	layout   layout.Layout
	fuse     bool
	replicas int
	fold     bool
}

// convert builds the converted layer the way convert / fuse-shared write it,
// returning the DST tensors and contract.
func (m *memModel) convert(o convertOpts) (cktest.Mem, *layout.Contract, *moelayer.FusedLayer) {
	c := &layout.Contract{Version: layout.ContractVersion, Layout: o.layout, SourceFormat: "safetensors", Family: m.plan.Family,
		NumExperts: m.E, SharedFirstID: m.E, RoutedScalingFactor: m.RSF, WeightDType: string(m.dtype), Quantization: string(m.plan.Quantization),
		Layers: []layout.LayerInfo{{Index: m.layerIndex, Prefix: m.prefix}}}
	if o.fuse {
		c.SharedReplicas, c.SharedSlices, c.NumFusedSharedExperts = o.replicas, m.S, o.replicas*m.S
	}
	c.RoutedScalingFactorFolded = o.fold
	c.SharedSlotWeight = 1
	if !o.fold {
		c.SharedSlotWeight = 1 / m.RSF
	}
	if m.FP8 {
		c.WeightBlockSize = []int64{tensorload.FP8Block, tensorload.FP8Block}
	}
	bank := make([][3]encMat, 0, m.E+c.NumFusedSharedExperts)
	for _, ex := range m.experts {
		down := ex[2]
		if o.fold {
			down = m.foldDown(down)
		}
		bank = append(bank, [3]encMat{ex[0], ex[1], down})
	}
	for range c.SharedReplicas {
		for s := range m.S {
			bank = append(bank, [3]encMat{
				m.rowsOf(m.shared[0], s*m.I, (s+1)*m.I),
				m.rowsOf(m.shared[1], s*m.I, (s+1)*m.I),
				m.colsOf(m.shared[2], s*m.I, (s+1)*m.I),
			})
		}
	}
	dst := cktest.Mem{}
	l := m.plan.Layers[0]
	for _, n := range []string{l.Router, l.RouterBias, l.SharedGate} {
		if n != "" {
			dst.Put(n, m.src[n].DType, m.src[n].Shape, m.src.Bytes(n))
		}
	}
	fl := &moelayer.FusedLayer{Index: m.layerIndex, Router: l.Router, RouterBias: l.RouterBias, Spec: m.plan.RouteSpec(), Contract: c,
		Names: layout.Names(o.layout, m.prefix, m.FP8), SharedGate: l.SharedGate}
	if !o.fuse && l.Shared != nil {
		for _, n := range []string{l.Shared.Weight(layout.ProjGate), l.Shared.Weight(layout.ProjUp), l.Shared.Weight(layout.ProjDown), l.Shared.Get(layout.ProjGate, layout.RoleScale), l.Shared.Get(layout.ProjUp, layout.RoleScale), l.Shared.Get(layout.ProjDown, layout.RoleScale)} {
			if n != "" {
				dst.Put(n, m.src[n].DType, m.src[n].Shape, m.src.Bytes(n))
			}
		}
		fl.Shared = l.Shared
	}
	m.putStacks(dst, fl.Names, o.layout, bank)
	return dst, c, fl
}

// foldDown multiplies a routed down projection by rsf: FP8 in the scales
// (exact to f32 rounding), bf16 in the weights (rounded to nearest even).
func (m *memModel) foldDown(e encMat) encMat {
	out := encMat{rows: e.rows, cols: e.cols}
	if m.FP8 {
		out.raw = e.raw
		for _, s := range e.scale {
			out.scale = append(out.scale, float32(float64(s)*m.RSF))
		}
		return out
	}
	v := make([]float32, e.rows*e.cols)
	if err := tensorload.Decode(safetensors.BF16, e.raw, v); err != nil {
		panic(err)
	}
	for i := range v {
		v[i] = float32(float64(v[i]) * m.RSF)
	}
	out.raw = bf16Bytes(v)
	return out
}

func (m *memModel) putStacks(dst cktest.Mem, n layout.ExpertTensors, l layout.Layout, bank [][3]encMat) {
	cat := func(which int, scales bool) ([]byte, []float32) {
		var raw []byte
		var sc []float32
		for _, ex := range bank {
			raw = append(raw, ex[which].raw...)
			sc = append(sc, ex[which].scale...)
		}
		return raw, sc
	}
	nb := int64(len(bank))
	h, in := int64(m.H), int64(m.I)
	put := func(name, scale string, which int, rows, cols int64) {
		raw, sc := cat(which, m.FP8)
		dst.Put(name, m.dtype, []int64{nb, rows, cols}, raw)
		if m.FP8 {
			sr, scc := tensorload.ScaleDims(int(rows), int(cols), tensorload.FP8Block, tensorload.FP8Block)
			dst.PutF32(scale, []int64{nb, int64(sr), int64(scc)}, sc...)
		}
	}
	if !l.Fused() {
		put(n.Weight(layout.ProjGate), n.Get(layout.ProjGate, layout.RoleScale), 0, in, h)
		put(n.Weight(layout.ProjUp), n.Get(layout.ProjUp, layout.RoleScale), 1, in, h)
		put(n.Weight(layout.ProjDown), n.Get(layout.ProjDown, layout.RoleScale), 2, h, in)
		return
	}
	first, second := 0, 1
	if l == layout.UpGate {
		first, second = 1, 0
	}
	var raw []byte
	var sc []float32
	for _, ex := range bank {
		raw = append(append(raw, ex[first].raw...), ex[second].raw...)
		sc = append(append(sc, ex[first].scale...), ex[second].scale...)
	}
	dst.Put(n.Weight(layout.ProjGateUp), m.dtype, []int64{nb, 2 * in, h}, raw)
	if m.FP8 {
		sr, scc := tensorload.ScaleDims(m.I, m.H, tensorload.FP8Block, tensorload.FP8Block)
		dst.PutF32(n.Get(layout.ProjGateUp, layout.RoleScale), []int64{nb, int64(2 * sr), int64(scc)}, sc...)
	}
	put(n.Weight(layout.ProjDown), n.Get(layout.ProjDown, layout.RoleScale), 2, h, in)
}
