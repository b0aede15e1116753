package moetest

import (
	"errors"
	"math"
	"slices"
	"sort"
	"testing"

	"github.com/moeprep/moeprep/moe"
)

// RouteCase is one gate problem: the routing of T tokens followed by the
// fused bank's shared slots, as the serving gate kernels compute it (and
// moe.Route or moe.RouteHashed, moe.ScaleRouting and moe.FusedSlots do on
// the CPU).
type RouteCase struct {
	Spec moe.RouteSpec
	// Shared are the shared slots appended to every token's top-k.
	Shared moe.SharedSlots
	// Scale multiplies every routed weight and every router-weighted shared
	// expert's weight (Inkling's global_scale), not the shared slots'; 1
	// is none.
	Scale  float32
	T      int
	Logits []float32 // [T, Spec.Rows()]
	Bias   []float32 // [E] correction bias; nil: none
	// HashIDs are a hash-routed layer's experts [T, TopK] (DeepSeek-V4's
	// token-id table rows), weighted by their scores; nil: top-k routing.
	HashIDs []int32
}

// RouteResult is a Router's answer to a RouteCase.
type RouteResult struct {
	// IDs and Weights [T, TopK + Shared.PerToken]: each token's routed
	// experts best first (a hash layer's in the table's order), then its
	// shared slots.
	IDs     []int32
	Weights []float32
	// Choice [T, E]: the values the top-k ranked (score plus correction
	// bias; sparsemixer's raw logits; a hash layer's scores).
	Choice []float32
	// Shared [T, Spec.SharedLogits]: the router-weighted shared experts'
	// weights; nil when the router has no shared rows.
	Shared []float32
}

// Router is a gate under test.
type Router interface {
	Route(c *RouteCase) (*RouteResult, error)
}

// Tolerances of TestRoute, relative to the float64 reference:
//   - choiceTol: a ranked value is a score rounded to float32 (2^-24
//     relative) plus a correction bias, the sum rounded again: within
//     2^-24 (2|s| + |b|) of the exact s + b, which 1e-6 (|s| + |b|) bounds
//     with room for a device exp or log1p a few ulps off in double.
//   - weightTol: a weight is a float32 score, normalised by a float32 sum
//     of at most 16 positive terms, divided and scaled in float32: at most
//     (16 + 3) 2^-24 = 1.1e-6 relative. A wrong expert, a missed
//     normalisation or scale, or a shared row left out moves a weight by
//     1e-3 or more.
//   - handTol: hand-worked weights are written to 7 significant digits.
//
// Ids are compared exactly: the suite re-selects the top-k from the
// implementation's own ranked values by the rule (higher first, NaN last,
// ties to the lower index; groups by their best or best-two sum in float32,
// ties to the lower group), so exact ties and float32 near-ties are judged
// on the values the implementation really ranked.
const (
	choiceTol = 1e-6
	weightTol = 2e-6
	handTol   = 1e-6
)

// routeTest is one row of the table: a spec, how its inputs are drawn, and
// for hand-worked rows the inputs and the ids (and weights) they give.
type routeTest struct {
	name   string
	spec   moe.RouteSpec // RoutedScalingFactor 0 stands for 2.5
	shared moe.SharedSlots
	scale  float32 // 0 stands for 1
	t      int
	bias   bool // draw a correction bias
	levels int  // > 0: logits and biases take this many values, so exact ties abound
	nans   int  // NaN logits per token
	hash   bool // draw hash-table experts (some rows name one twice)
	// Hand-worked rows: given inputs, and the routed ids [T,TopK] and
	// weights (nil: the reference's) they must give.
	logits, biasV []float32
	hashIDs       []int32
	wantIDs       []int32
	wantWeights   []float64
}

func sig(e, k int) moe.RouteSpec { return moe.RouteSpec{Scoring: moe.Sigmoid, NumExperts: e, TopK: k} }
func soft(e, k int) moe.RouteSpec {
	return moe.RouteSpec{Scoring: moe.Softmax, NumExperts: e, TopK: k}
}
func sqsp(e, k int) moe.RouteSpec {
	return moe.RouteSpec{Scoring: moe.SqrtSoftplus, NumExperts: e, TopK: k, NormTopKProb: true}
}
func mixer(e int, eps float64) moe.RouteSpec {
	return moe.RouteSpec{Scoring: moe.SparseMixer, NumExperts: e, TopK: 2, JitterEps: eps}
}
func grouped(s moe.RouteSpec, n, k int) moe.RouteSpec {
	s.NGroup, s.TopKGroup = n, k
	return s
}
func norm(s moe.RouteSpec) moe.RouteSpec  { s.NormTopKProb = true; return s }
func byMax(s moe.RouteSpec) moe.RouteSpec { s.GroupByMax = true; return s }
func sharedRows(s moe.RouteSpec, n int) moe.RouteSpec {
	s.SharedLogits = n
	return s
}

// logitFor is the logit whose sigmoid is p.
func logitFor(p float64) float32 { return float32(math.Log(p / (1 - p))) }

var routeTests = []routeTest{
	// sigmoid + correction bias, grouped (DeepSeek-V3, Kimi-K2)
	{name: "deepseek-v3 T=37 groups 8/4 shared R=8", t: 37, bias: true, spec: norm(grouped(sig(256, 8), 8, 4)), shared: moe.SharedSlots{PerToken: 1, Replicas: 8, Weight: 1}},
	{name: "deepseek-v3 T=1 unfolded, shared weight 1/rsf", t: 1, bias: true, spec: norm(grouped(sig(256, 8), 8, 4)), shared: moe.SharedSlots{PerToken: 1, Replicas: 1, Weight: 1 / 2.5}},
	{name: "kimi-k2 384 experts n_group 1 T=300", t: 300, bias: true, spec: norm(sig(384, 8)), shared: moe.SharedSlots{PerToken: 1, Replicas: 1, Weight: 1}},
	{name: "kimi-k2 384 experts T=1", t: 1, bias: true, spec: norm(sig(384, 8))},
	{name: "264 experts groups 8/3 S=2 R=3", t: 129, bias: true, spec: norm(grouped(sig(264, 8), 8, 3)), shared: moe.SharedSlots{PerToken: 2, Replicas: 3, Weight: 0.4}},
	{name: "512 experts top-16 groups 16/5 no renorm", t: 65, bias: true, spec: grouped(sig(512, 16), 16, 5)},
	{name: "kimi-k3 896 experts top-16 n_group 1", t: 70, bias: true, spec: norm(sig(896, 16))},
	{name: "kimi-k3 896 experts top-16 groups 8/4", t: 21, bias: true, spec: norm(grouped(sig(896, 16), 8, 4))},
	{name: "1024 experts top-8 ties: 2 levels", t: 9, bias: true, levels: 2, spec: norm(sig(1024, 8))},
	{name: "no bias, topk_group = n_group (nothing masked)", t: 17, spec: norm(grouped(sig(96, 6), 4, 4))},
	{name: "group size 1", t: 9, bias: true, spec: norm(grouped(sig(16, 4), 16, 6))},
	{name: "ties: 3 logit levels, groups 8/4", t: 50, levels: 3, spec: norm(grouped(sig(256, 8), 8, 4)), shared: moe.SharedSlots{PerToken: 1, Replicas: 2, Weight: 1}},
	{name: "ties: every logit equal, groups 8/2", t: 5, levels: 1, spec: norm(grouped(sig(384, 8), 8, 2))},
	{name: "ties: logit and bias levels, 264 experts", t: 40, bias: true, levels: 2, spec: norm(sig(264, 8))},
	{name: "ties: levels, groups 8/3 of 33", t: 50, bias: true, levels: 6, spec: norm(grouped(sig(264, 8), 8, 3))},
	{name: "NaN logits rank last", t: 20, bias: true, nans: 5, spec: norm(grouped(sig(256, 8), 8, 4))},
	{name: "one expert", t: 3, bias: true, spec: norm(sig(1, 1)), shared: moe.SharedSlots{PerToken: 1, Replicas: 2, Weight: 1}},
	{name: "top-k takes every expert", t: 4, bias: true, spec: norm(sig(8, 8))},
	{name: "llama4: top-1, no renorm", t: 16, spec: sig(16, 1)},
	// softmax (Qwen, Mixtral, DeepSeek-V2, ERNIE 4.5)
	{name: "qwen2-moe 60 experts top-4 no renorm", t: 33, spec: soft(60, 4)},
	{name: "qwen3-moe 128 top-8 renorm T=1", t: 1, spec: norm(soft(128, 8))},
	{name: "mixtral 8 top-2", t: 300, spec: norm(soft(8, 2))},
	{name: "deepseek-v2 group max 160 groups 8/3 S=2 R=2", t: 70, spec: byMax(grouped(soft(160, 6), 8, 3)), shared: moe.SharedSlots{PerToken: 2, Replicas: 2, Weight: 1 / 16.0}},
	{name: "softmax ties: 4 levels, 384 experts", t: 31, levels: 4, spec: norm(soft(384, 8))},
	{name: "group max ties: 3 levels", t: 23, levels: 3, spec: byMax(grouped(soft(64, 4), 8, 2))},
	{name: "ernie-4.5 softmax + correction bias 64 top-6 S=2", t: 45, bias: true, spec: norm(soft(64, 6)), shared: moe.SharedSlots{PerToken: 2, Replicas: 1, Weight: 1}},
	{name: "softmax NaN poisons the row", t: 3, nans: 1, spec: norm(soft(64, 4))},
	{name: "softmax one expert", t: 2, spec: norm(soft(1, 1))},
	// sqrt(softplus) (DeepSeek-V4), routed and hash-routed
	{name: "deepseek-v4 256 top-6 S=1 R=8", t: 77, bias: true, spec: sqsp(256, 6), shared: moe.SharedSlots{PerToken: 1, Replicas: 8, Weight: 1 / 1.5}},
	{name: "sqrtsoftplus ties: 3 levels, 384 experts", t: 21, levels: 3, bias: true, spec: sqsp(384, 8)},
	{name: "sqrtsoftplus NaN ranks last", t: 9, bias: true, nans: 4, spec: sqsp(64, 6)},
	{name: "deepseek-v4 hash layer 256 top-6 S=1 R=4", t: 33, hash: true, spec: sqsp(256, 6), shared: moe.SharedSlots{PerToken: 1, Replicas: 4, Weight: 1 / 1.5}},
	{name: "hash layer: rows naming an expert twice, ties", t: 7, hash: true, levels: 2, spec: sqsp(16, 4)},
	{name: "hash layer with sigmoid scores, no renorm", t: 10, hash: true, spec: sig(64, 4)},
	// Inkling: shared router rows in one normalisation with the top-k, a weight scale
	{name: "inkling 256 + 2 shared rows, scale 0.75", t: 61, bias: true, spec: sharedRows(sig(256, 6), 2), scale: 0.75},
	{name: "inkling ties: 3 levels, 8 + 2 rows, scale 1.25", t: 19, levels: 3, bias: true, spec: sharedRows(sig(8, 2), 2), scale: 1.25},
	{name: "inkling NaN ranks last, 64 + 3 rows", t: 9, bias: true, nans: 3, spec: sharedRows(sig(64, 4), 3)},
	// sparsemixer (Phi-3.5-MoE)
	{name: "phimoe 16 experts eps 0.3", t: 50, spec: mixer(16, 0.3)},
	{name: "sparsemixer eps 0.01 64 experts S=1 R=2", t: 33, spec: mixer(64, 0.01), shared: moe.SharedSlots{PerToken: 1, Replicas: 2, Weight: 1}},
	{name: "sparsemixer eps 0: only exact ties join", t: 17, levels: 4, spec: mixer(32, 0)},
	{name: "sparsemixer ties: 3 levels, 384 experts", t: 11, levels: 3, spec: mixer(384, 0.1)},
	{name: "sparsemixer NaN poisons the weights", t: 5, nans: 1, spec: mixer(16, 0.3)},

	// Hand-worked. 8 experts in 4 groups of 2, keep 2, top-3, logits 0: every
	// score is 0.5, the bias alone ranks, and the weights are 1/3 each
	// (unbiased, normalised).
	{name: "hand: groups by their top-2 sum", spec: norm(grouped(sig(8, 3), 4, 2)), logits: make([]float32, 8),
		// group sums g0 .1+.2, g1 .9+0, g2 .3+.3, g3 0: keep g1 and g2
		biasV: []float32{0.1, 0.2, 0.9, 0, 0.3, 0.3, 0, 0}, wantIDs: []int32{2, 4, 5}, wantWeights: []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}},
	{name: "hand: a group tie keeps the lower group", spec: norm(grouped(sig(8, 3), 4, 2)), logits: make([]float32, 8),
		// g1 is best (1.6); g0 and g2 tie at 1.5: g0 stays, g2 (holding the best single expert) goes
		biasV: []float32{0.25, 0.25, 0.3, 0.3, 0.5, 0, 0.1, 0.1}, wantIDs: []int32{2, 3, 0}},
	{name: "hand: an expert tie goes to the lower id", spec: norm(grouped(sig(8, 3), 4, 2)), logits: make([]float32, 8),
		biasV: []float32{0.3, 0.3, 0.3, 0.3, 0, 0, 0, 0}, wantIDs: []int32{0, 1, 2}},
	{name: "hand: the best expert dropped with its group", spec: norm(grouped(sig(8, 3), 4, 2)), logits: make([]float32, 8),
		biasV: []float32{1, -1, 0.4, 0.4, 0.3, 0.3, 0, 0}, wantIDs: []int32{2, 3, 4}},
	{name: "hand: ids follow the bias, weights the unbiased scores", spec: sig(4, 2),
		logits: []float32{logitFor(0.9), logitFor(0.2), logitFor(0.6), logitFor(0.1)}, biasV: []float32{0, 1, 0, 0},
		wantIDs: []int32{1, 0}, wantWeights: []float64{0.2, 0.9}},
	{name: "hand: softmax", spec: soft(4, 2), logits: []float32{1, 2, 3, 0}, wantIDs: []int32{2, 1},
		wantWeights: []float64{math.Exp(3) / (1 + math.E + math.Exp(2) + math.Exp(3)), math.Exp(2) / (1 + math.E + math.Exp(2) + math.Exp(3))}},
	{name: "hand: softmax renormalised", spec: norm(soft(4, 2)), logits: []float32{1, 2, 3, 0}, wantIDs: []int32{2, 1},
		wantWeights: []float64{math.E / (1 + math.E), 1 / (1 + math.E)}},
	{name: "hand: group_limited_greedy scores groups by their max", spec: byMax(grouped(soft(6, 2), 3, 1)),
		// group maxima g0 3, g1 2.9, g2 2.95; sums would favour g1
		logits: []float32{3, -5, 2.9, 2.8, 2.95, -5}, wantIDs: []int32{0, 1}},
	{name: "hand: sqrtsoftplus, the bias pulls in expert 3", spec: sqsp(4, 2), logits: []float32{2, 1, 0, -1}, biasV: []float32{0, 0, 0, 5},
		wantIDs: []int32{3, 0}, wantWeights: []float64{
			math.Sqrt(math.Log1p(math.Exp(-1))) / (math.Sqrt(math.Log1p(math.Exp(-1))) + math.Sqrt(math.Log1p(math.Exp(2)))),
			math.Sqrt(math.Log1p(math.Exp(2))) / (math.Sqrt(math.Log1p(math.Exp(-1))) + math.Sqrt(math.Log1p(math.Exp(2))))}},
	{name: "hand: hash layer, softplus threshold at 20", spec: sqsp(4, 2), t: 2, logits: []float32{0, 25, -30, 1, 3, 3, 3, 3},
		hashIDs: []int32{1, 3, 2, 2}, wantIDs: []int32{1, 3, 2, 2}, wantWeights: []float64{
			5 / (5 + math.Sqrt(math.Log1p(math.E))), math.Sqrt(math.Log1p(math.E)) / (5 + math.Sqrt(math.Log1p(math.E))), 0.5, 0.5}},
	{name: "hand: inkling, the bias flips expert 1 for 2", spec: sharedRows(sig(4, 2), 2),
		logits: []float32{2, 1, 0.9, -1, 0.5, -0.25}, biasV: []float32{0, 0, 0.1, 0}, wantIDs: []int32{0, 2}},
	{name: "hand: inkling, ties go to the lower index", spec: sharedRows(sig(4, 2), 2),
		logits: []float32{0.5, 0.5, 0.5, 0.5, 3, -3}, wantIDs: []int32{0, 1}},
	// sparsemixer: slot 1 is the largest logit weighted by the softmax over
	// the logits within 2 eps (relative) of it, slot 2 the same over the rest.
	{name: "hand: sparsemixer, 1.9 shares slot 1's softmax", spec: mixer(4, 0.05), logits: []float32{2, 1.9, 0, -1},
		wantIDs: []int32{0, 1}, wantWeights: []float64{1 / (1 + math.Exp(-0.1)), 1}},
	{name: "hand: sparsemixer eps 0, a tie shares its slot", spec: mixer(4, 0), logits: []float32{0.5, 3, 3, -2},
		wantIDs: []int32{1, 2}, wantWeights: []float64{0.5, 1}},
	{name: "hand: sparsemixer negative logits", spec: mixer(4, 0.1), logits: []float32{-1, -1.05, -4, -1.2},
		wantIDs: []int32{0, 1}, wantWeights: []float64{1 / (1 + math.Exp(-0.05) + math.Exp(-0.2)), 1 / (1 + math.Exp(-0.15))}},
}

// routeRefusals are specs every Router must refuse with an error (not
// ErrUnsupported): an unknown scoring above all, which a device kernel
// would otherwise run as softmax.
var routeRefusals = []struct {
	name   string
	spec   moe.RouteSpec
	shared moe.SharedSlots
	hash   bool
}{
	{name: "unknown scoring", spec: moe.RouteSpec{Scoring: "relu", NumExperts: 4, TopK: 1}},
	{name: "empty scoring", spec: moe.RouteSpec{NumExperts: 4, TopK: 1}},
	{name: "top-k above the experts", spec: soft(4, 5)},
	{name: "no experts", spec: soft(0, 1)},
	{name: "experts do not split into the groups", spec: grouped(sig(6, 1), 4, 1)},
	{name: "top-k beyond the kept groups", spec: grouped(sig(8, 5), 4, 2)},
	{name: "topk_group above n_group", spec: grouped(sig(8, 2), 4, 5)},
	{name: "routed scaling factor NaN", spec: moe.RouteSpec{Scoring: moe.Sigmoid, NumExperts: 8, TopK: 1, RoutedScalingFactor: math.NaN()}},
	{name: "shared router rows with softmax", spec: sharedRows(soft(4, 2), 2)},
	{name: "sparsemixer top-3", spec: moe.RouteSpec{Scoring: moe.SparseMixer, NumExperts: 8, TopK: 3, JitterEps: 0.1}},
	{name: "sparsemixer with groups", spec: grouped(mixer(8, 0.1), 2, 1)},
	{name: "sparsemixer negative eps", spec: mixer(8, -1)},
	{name: "hash routing with softmax", spec: soft(4, 2), hash: true},
	{name: "hash routing with shared router rows", spec: sharedRows(sig(4, 2), 2), hash: true},
	{name: "negative shared slots", spec: sig(4, 2), shared: moe.SharedSlots{PerToken: -1, Replicas: 1, Weight: 1}},
	{name: "shared slots without a replica", spec: sig(4, 2), shared: moe.SharedSlots{PerToken: 1, Weight: 1}},
}

// TestRoute runs every case of the table through r and checks each answer
// against the float64 reference, then checks that r refuses every spec it
// must. Each scoring moe defines needs a row of the table and a reference
// here: a scoring added without them fails this test.
func TestRoute(t *testing.T, r Router) {
	for _, sc := range moe.Scorings() {
		if !slices.ContainsFunc(routeTests, func(c routeTest) bool { return c.spec.Scoring == sc }) {
			t.Errorf("no case routes with %s scores: add rows for it", sc)
		}
	}
	runCases(t, len(routeTests), func(i int) string { return routeTests[i].name }, func(t *testing.T, i int) {
		c := routeTests[i].input(i)
		got, err := r.Route(c)
		if skipped(t, err) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		checkRoute(t, c, got, routeTests[i])
	})
	for _, bad := range routeRefusals {
		t.Run("refuses "+bad.name, func(t *testing.T) {
			c := &RouteCase{Spec: bad.spec, Shared: bad.shared, Scale: 1, T: 1}
			if c.Spec.RoutedScalingFactor == 0 {
				c.Spec.RoutedScalingFactor = 2.5
			}
			c.Logits = make([]float32, max(c.Spec.Rows(), 1))
			if bad.hash {
				c.HashIDs = make([]int32, max(c.Spec.TopK, 1))
			}
			_, err := r.Route(c)
			if err == nil || errors.Is(err, ErrUnsupported) {
				t.Errorf("%+v with shared slots %+v not refused (error %v)", bad.spec, bad.shared, err)
			}
		})
	}
}

// input draws (or, for a hand-worked row, copies) the case's inputs.
func (c routeTest) input(i int) *RouteCase {
	rc := &RouteCase{Spec: c.spec, Shared: c.shared, Scale: c.scale, T: max(c.t, 1)}
	if rc.Spec.RoutedScalingFactor == 0 {
		rc.Spec.RoutedScalingFactor = 2.5
	}
	if rc.Scale == 0 {
		rc.Scale = 1
	}
	if c.logits != nil {
		rc.Logits, rc.Bias, rc.HashIDs = c.logits, c.biasV, c.hashIDs
		return rc
	}
	r := caseRand(28, i)
	e, rows := c.spec.NumExperts, c.spec.Rows()
	rc.Logits = make([]float32, rc.T*rows)
	for j := range rc.Logits {
		if c.levels > 0 {
			rc.Logits[j] = float32(r.IntN(c.levels)) - 1
		} else {
			rc.Logits[j] = float32(r.NormFloat64() * 2)
		}
	}
	for tok := range rc.T {
		for range c.nans {
			rc.Logits[tok*rows+r.IntN(e)] = float32(math.NaN())
		}
	}
	if c.bias {
		rc.Bias = make([]float32, e) // the routed experts only: shared router rows have none
		for j := range rc.Bias {
			if c.levels > 0 {
				rc.Bias[j] = float32(r.IntN(c.levels)) * 0.25
			} else {
				rc.Bias[j] = float32(r.NormFloat64() * 0.1)
			}
		}
	}
	if c.hash {
		rc.HashIDs = make([]int32, rc.T*c.spec.TopK)
		for j := range rc.HashIDs {
			rc.HashIDs[j] = int32(r.IntN(e))
		}
	}
	return rc
}

// checkRoute compares one answer with the reference, token by token.
func checkRoute(t *testing.T, c *RouteCase, got *RouteResult, row routeTest) {
	t.Helper()
	s := c.Spec
	e, k, sl, rows := s.NumExperts, s.TopK, s.SharedLogits, s.Rows()
	kk := k + c.Shared.PerToken
	switch {
	case len(got.IDs) != c.T*kk || len(got.Weights) != c.T*kk:
		t.Fatalf("%d ids and %d weights, want %d tokens x %d slots", len(got.IDs), len(got.Weights), c.T, kk)
	case len(got.Choice) != c.T*e:
		t.Fatalf("%d ranked values, want %d tokens x %d experts", len(got.Choice), c.T, e)
	case len(got.Shared) != c.T*sl:
		t.Fatalf("%d shared weights, want %d tokens x %d shared rows", len(got.Shared), c.T, sl)
	}
	var errs errorList
	for i := range c.T {
		logits := c.Logits[i*rows : (i+1)*rows]
		var bias []float32
		if c.HashIDs == nil {
			bias = c.Bias
		}
		score, choice := referenceScores(t, s, logits[:e], bias)
		gotChoice := got.Choice[i*e : (i+1)*e]
		for j := range e {
			b := 0.0
			if bias != nil {
				b = math.Abs(float64(bias[j]))
			}
			g, w := float64(gotChoice[j]), choice[j]
			ok := math.IsNaN(g) && math.IsNaN(w) || math.Abs(g-w) <= choiceTol*(math.Abs(score[j])+b)
			if !ok {
				errs.add("token %d expert %d: ranked value %v, reference %v", i, j, g, w)
			}
		}
		ids := got.IDs[i*kk : i*kk+k]
		want := selectTopK(s, gotChoice)
		if c.HashIDs != nil {
			want = c.HashIDs[i*k : (i+1)*k]
		}
		if row.wantIDs != nil && !slices.Equal(want, row.wantIDs[i*k:(i+1)*k]) {
			errs.add("token %d: the suite selects %v, worked by hand %v", i, want, row.wantIDs[i*k:(i+1)*k])
		}
		if !slices.Equal(ids, want) {
			errs.add("token %d: ids %v, want %v", i, ids, want)
			continue // the weights belong to other experts
		}
		w, shared := referenceWeights(s, logits, score, ids, c.Scale)
		for j, v := range w {
			if !closeRel(got.Weights[i*kk+j], v, weightTol) {
				errs.add("token %d slot %d (expert %d): weight %v, reference %v", i, j, ids[j], got.Weights[i*kk+j], v)
			}
			if row.wantWeights != nil && !(math.Abs(float64(got.Weights[i*kk+j])-row.wantWeights[i*k+j]) <= handTol) {
				errs.add("token %d slot %d: weight %v, worked by hand %v", i, j, got.Weights[i*kk+j], row.wantWeights[i*k+j])
			}
		}
		for j, v := range shared {
			if !closeRel(got.Shared[i*sl+j], v, weightTol) {
				errs.add("token %d shared row %d: weight %v, reference %v", i, j, got.Shared[i*sl+j], v)
			}
		}
		for j := range c.Shared.PerToken {
			id, wt := got.IDs[i*kk+k+j], got.Weights[i*kk+k+j]
			if wantID := e + (i%c.Shared.Replicas)*c.Shared.PerToken + j; int(id) != wantID || wt != c.Shared.Weight {
				errs.add("token %d shared slot %d: expert %d weight %v, want expert %d (E + (t mod R)*S + s) weight %v", i, j, id, wt, wantID, c.Shared.Weight)
			}
		}
	}
	errs.report(t)
}

// referenceScores are one token's scores and ranked values in float64, by
// the definition of each scoring.
func referenceScores(t *testing.T, s moe.RouteSpec, logits, bias []float32) (score, choice []float64) {
	t.Helper()
	score = make([]float64, len(logits))
	switch s.Scoring {
	case moe.Sigmoid:
		for j, l := range logits {
			score[j] = sigmoid(float64(l))
		}
	case moe.SqrtSoftplus:
		for j, l := range logits {
			v := float64(l)
			if v <= 20 { // torch's softplus returns l itself above its threshold 20
				v = math.Log1p(math.Exp(v))
			}
			score[j] = math.Sqrt(v)
		}
	case moe.Softmax:
		m := math.Inf(-1)
		for _, l := range logits {
			m = math.Max(m, float64(l)) // a NaN logit makes every probability NaN
		}
		var z float64
		for j, l := range logits {
			score[j] = math.Exp(float64(l) - m)
			z += score[j]
		}
		for j := range score {
			score[j] /= z
		}
	case moe.SparseMixer:
		for j, l := range logits {
			score[j] = float64(l) // ranks the raw logits; the bias is not used
		}
		return score, slices.Clone(score)
	default:
		t.Fatalf("moetest has no reference for %s scores: write it here", s.Scoring)
	}
	choice = slices.Clone(score)
	for j := range choice {
		if bias != nil {
			choice[j] += float64(bias[j])
		}
	}
	return score, choice
}

func sigmoid(v float64) float64 { return 1 / (1 + math.Exp(-v)) }

// ranksBefore is the ranking rule: higher first, NaN below every number,
// ties to the lower index.
func ranksBefore(a float32, ai int, b float32, bi int) bool {
	an, bn := math.IsNaN(float64(a)), math.IsNaN(float64(b))
	switch {
	case an != bn:
		return bn
	case an || a == b:
		return ai < bi
	}
	return a > b
}

// selectTopK picks a token's top-k from ranked values by sorting: the
// topk_group best groups first when grouped (a group's score its best
// member, or the float32 sum of its best two), then the best experts of
// the kept groups.
func selectTopK(s moe.RouteSpec, choice []float32) []int32 {
	e := len(choice)
	order := func(idx []int) {
		sort.SliceStable(idx, func(a, b int) bool { return ranksBefore(choice[idx[a]], idx[a], choice[idx[b]], idx[b]) })
	}
	var kept []int
	if s.NGroup > 1 && s.TopKGroup < s.NGroup {
		size := e / s.NGroup
		gscore := make([]float32, s.NGroup)
		groups := make([]int, s.NGroup)
		for g := range groups {
			groups[g] = g
			members := make([]int, size)
			for j := range members {
				members[j] = g*size + j
			}
			order(members)
			gscore[g] = choice[members[0]]
			if !s.GroupByMax && size > 1 {
				gscore[g] += choice[members[1]] // float32 arithmetic, as torch's topk(2).sum()
			}
		}
		sort.SliceStable(groups, func(a, b int) bool {
			return ranksBefore(gscore[groups[a]], groups[a], gscore[groups[b]], groups[b])
		})
		for _, g := range groups[:s.TopKGroup] {
			for j := range size {
				kept = append(kept, g*size+j)
			}
		}
	} else {
		for j := range e {
			kept = append(kept, j)
		}
	}
	order(kept)
	out := make([]int32, s.TopK)
	for j := range out {
		out[j] = int32(kept[j])
	}
	return out
}

// referenceWeights are the weights of a token's chosen experts ids in
// float64 (and its shared rows' weights, Inkling), each times scale.
func referenceWeights(s moe.RouteSpec, logits []float32, score []float64, ids []int32, scale float32) (w, shared []float64) {
	e := s.NumExperts
	w = make([]float64, len(ids))
	if s.Scoring == moe.SparseMixer {
		// Each round's winner m weighted by the softmax over the logits v,
		// earlier winners left out, with (m - v) / max(|v|, m) <= 2 eps,
		// the mask in float32 (HF's arithmetic).
		eps := float32(s.JitterEps)
		for r, id := range ids {
			m := logits[id]
			var z float64
			for j, v := range logits[:e] {
				if slices.Contains(ids[:r], int32(j)) {
					continue
				}
				f := float32(math.Max(math.Abs(float64(v)), float64(m)))
				if (m-v)/f > 2*eps {
					continue
				}
				z += math.Exp(float64(v) - float64(m))
			}
			w[r] = 1 / z
		}
	} else {
		for j, id := range ids {
			w[j] = score[id]
		}
		var sum float64
		for _, v := range w {
			sum += v
		}
		switch {
		case s.SharedLogits > 0:
			// Inkling: the k chosen and the S shared sigmoids share one
			// normalisation, whatever norm_topk_prob says.
			shared = make([]float64, s.SharedLogits)
			for j := range shared {
				shared[j] = sigmoid(float64(logits[e+j]))
				sum += shared[j]
			}
			for j := range shared {
				shared[j] /= sum
			}
			for j := range w {
				w[j] /= sum
			}
		case s.NormTopKProb:
			for j := range w {
				w[j] /= sum + 1e-20
			}
		}
	}
	for j := range w {
		w[j] *= float64(scale)
	}
	for j := range shared {
		shared[j] *= float64(scale)
	}
	return w, shared
}
