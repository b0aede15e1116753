package moetest

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moeprep/moeprep/moe"
)

// GEMMCase is one grouped GEMM problem: T tokens' rows x, their T*K slots
// aligned by expert, and the experts' weights. Every x and weight value is
// a bfloat16 value (so an implementation may hold them in bf16 exactly).
type GEMMCase struct {
	T, H, I, K int       // tokens, hidden size, expert intermediate size, slots per token
	X          []float32 // [T,H]
	Align      *moe.Alignment
	// Experts [E]: weights, biases (nil, or every expert's), and one
	// activation for all (nil: SwiGLU; otherwise a ClampedSwiGLU).
	Experts []moe.ExpertMats
}

// ClampedSwiGLU is the gated activation of gpt-oss and DeepSeek-V4 experts
// (layout.Activation records it in a contract):
//
//	act(g, u) = g' sigmoid(Alpha g') (u' + UpOffset),
//	g' = min(g, Limit), u' = clamp(u, -Limit, Limit)
//
// with Alpha 0 meaning 1 and Limit 0 no clamp; the zero value is SwiGLU.
// ClampAfter caps the activated gate instead, min(g sigmoid(Alpha g),
// Limit) (Step-3.7).
type ClampedSwiGLU struct {
	Alpha, Limit, UpOffset float64
	ClampAfter             bool
}

// SwiGLU reports whether a is plain silu(g) * u.
func (a ClampedSwiGLU) SwiGLU() bool {
	return (a.Alpha == 0 || a.Alpha == 1) && a.Limit == 0 && a.UpOffset == 0
}

// Apply is act(g, u) in float64.
func (a ClampedSwiGLU) Apply(g, u float64) float64 {
	if a.ClampAfter {
		return moe.SwiGLUClampedAfter(g, u, a.Alpha, a.Limit, a.UpOffset)
	}
	return moe.ClampedSwiGLU(g, u, a.Alpha, a.Limit, a.UpOffset)
}

// GroupedGEMMer is the fused MoE GEMM under test: for every slot s, its
// expert's E(x[s/K]) into row s of the [T*K, H] result, unweighted.
type GroupedGEMMer interface {
	GroupedGEMM(c *GEMMCase) ([]float32, error)
}

type gemmTest struct {
	name                 string
	t, e, k, h, i, block int
	allOn                int // >= 0: every slot on this expert
	act                  moe.Activation
	biases               bool
}

var gemmTests = []gemmTest{
	{name: "T=1, 8 experts, top-2", t: 1, e: 8, k: 2, h: 160, i: 96, block: 16, allOn: -1},
	{name: "T=37, 264 experts, top-9: mostly one-row blocks", t: 37, e: 264, k: 9, h: 160, i: 96, block: 16, allOn: -1},
	{name: "sparse: 5 tokens over 64 experts, block 32", t: 5, e: 64, k: 2, h: 96, i: 160, block: 32, allOn: -1},
	{name: "every slot on expert 3, block 64", t: 70, e: 8, k: 1, h: 160, i: 96, block: 64, allOn: 3},
	{name: "partial blocks and tiles: H 288, I 200", t: 33, e: 16, k: 4, h: 288, i: 200, block: 16, allOn: -1},
	{name: "long runs of blocks per expert", t: 150, e: 5, k: 2, h: 160, i: 96, block: 16, allOn: -1},
	{name: "long runs, block 32", t: 300, e: 7, k: 2, h: 96, i: 160, block: 32, allOn: -1},
	{name: "600 rows on one expert, H 224, I 200", t: 600, e: 4, k: 1, h: 224, i: 200, block: 16, allOn: 2},
	{name: "odd sizes: H 33, I 17, block 1", t: 9, e: 3, k: 2, h: 33, i: 17, block: 1, allOn: -1},
	{name: "gpt-oss clamped SwiGLU + biases", t: 23, e: 8, k: 3, h: 96, i: 64, block: 16, allOn: -1,
		act: ClampedSwiGLU{Alpha: 1.702, Limit: 0.6, UpOffset: 1}, biases: true},
	{name: "deepseek-v4 clamp", t: 19, e: 16, k: 4, h: 160, i: 96, block: 16, allOn: -1, act: ClampedSwiGLU{Limit: 0.5}},
	{name: "step-3.7 clamp after silu", t: 17, e: 8, k: 3, h: 96, i: 64, block: 16, allOn: -1, act: ClampedSwiGLU{Limit: 0.3, ClampAfter: true}},
	{name: "SwiGLU + biases", t: 11, e: 4, k: 2, h: 64, i: 48, block: 32, allOn: -1, act: ClampedSwiGLU{}, biases: true},
}

// TestGroupedGEMM runs every case through g and holds each output row to
// the float64 reference within relL2 = ||row - ref|| / ||ref||, which the
// caller states for its numerics (float32 accumulation: sums of H and I
// products rounded in a different order, ~sqrt(n) 2^-24 relative, 1e-5
// with room; a bf16 intermediate: 2^-9 an element, 1e-2). Row by row, so
// one wrong slot among thousands cannot hide in the norm.
func TestGroupedGEMM(t *testing.T, g GroupedGEMMer, relL2 float64) {
	runCases(t, len(gemmTests), func(i int) string { return gemmTests[i].name }, func(t *testing.T, i int) {
		c, ids := gemmTests[i].input(i)
		got, err := g.GroupedGEMM(c)
		if skipped(t, err) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != c.T*c.K*c.H {
			t.Fatalf("%d outputs, want %d slots x %d", len(got), c.T*c.K, c.H)
		}
		var errs errorList
		worst := 0.0
		for s, id := range ids {
			want := expertRef(&c.Experts[id], c.X[s/c.K*c.H:(s/c.K+1)*c.H], c.H, c.I)
			d := rowRelL2(got[s*c.H:(s+1)*c.H], want)
			worst = max(worst, d)
			if !(d <= relL2) {
				errs.add("slot %d (token %d, expert %d): relative L2 %.3g over %g", s, s/c.K, id, d, relL2)
			}
		}
		errs.report(t)
		t.Logf("worst row relative L2 %.3g (tolerance %g)", worst, relL2)
	})
}

// input draws case i: bf16 x ~ N(0,1), weights ~ N(0, 1/cols) so every
// projection is O(1), biases ~ N(0, 0.25), and K distinct experts a token.
func (c gemmTest) input(i int) (*GEMMCase, []int32) {
	r := caseRand(30, i)
	gc := &GEMMCase{T: c.t, H: c.h, I: c.i, K: c.k, X: bf16Normal(r, c.t*c.h, 1), Experts: make([]moe.ExpertMats, c.e)}
	for x := range gc.Experts {
		m := &gc.Experts[x]
		m.Gate = bf16Normal(r, c.i*c.h, 1/math.Sqrt(float64(c.h)))
		m.Up = bf16Normal(r, c.i*c.h, 1/math.Sqrt(float64(c.h)))
		m.Down = bf16Normal(r, c.h*c.i, 1/math.Sqrt(float64(c.i)))
		m.Act = c.act
		if c.biases {
			m.GateBias, m.UpBias, m.DownBias = bf16Normal(r, c.i, 0.5), bf16Normal(r, c.i, 0.5), bf16Normal(r, c.h, 0.5)
		}
	}
	ids := RouteIDs(r, c.t, c.k, c.e, c.allOn)
	gc.Align = alignment(ids, c.e, c.block)
	return gc, ids
}

// expertRef is E(x) in float64: Down act(Gate x + gb, Up x + ub) + db.
func expertRef(m *moe.ExpertMats, x []float32, h, inter int) []float64 {
	a := make([]float64, inter)
	for n := range inter {
		var g, u float64
		for j, v := range x {
			g += float64(v) * float64(m.Gate[n*h+j])
			u += float64(v) * float64(m.Up[n*h+j])
		}
		if m.GateBias != nil {
			g += float64(m.GateBias[n])
			u += float64(m.UpBias[n])
		}
		if m.Act == nil || m.Act.SwiGLU() {
			a[n] = g / (1 + math.Exp(-g)) * u
		} else {
			a[n] = m.Act.Apply(g, u)
		}
	}
	out := make([]float64, h)
	for j := range h {
		var acc float64
		for n, v := range a {
			acc += v * float64(m.Down[j*inter+n])
		}
		if m.DownBias != nil {
			acc += float64(m.DownBias[j])
		}
		out[j] = acc
	}
	return out
}

// rowRelL2 is ||got - want|| / ||want|| in float64; a NaN or Inf in got
// gives +Inf.
func rowRelL2(got []float32, want []float64) float64 {
	var num, den float64
	for j, w := range want {
		g := float64(got[j])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			return math.Inf(1)
		}
		num += (g - w) * (g - w)
		den += w * w
	}
	return math.Sqrt(num / den)
}

// RouteIDs draws k distinct experts of e for each of t tokens, as a
// router's top-k would (a permutation of the experts per token, so the
// random stream is the kernels' tests' and the suite's alike); with
// allOn >= 0 every slot goes to expert allOn instead (one expert takes
// all the rows).
func RouteIDs(r *rand.Rand, t, k, e, allOn int) []int32 {
	ids := make([]int32, t*k)
	for tok := range t {
		perm := r.Perm(e)
		for j := range k {
			ids[tok*k+j] = int32(perm[j])
			if allOn >= 0 {
				ids[tok*k+j] = int32(allOn)
			}
		}
	}
	return ids
}
