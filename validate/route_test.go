package validate

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/moeprep/moeprep/family"
)

// logitFor returns the logit whose float32 sigmoid is s (approximately).
func logitFor(s float64) float32 { return float32(math.Log(s / (1 - s))) }

func TestRouteSigmoidGroupedHand(t *testing.T) {
	// 8 experts in 4 groups of 2, keep 2 groups, top-3. All logits 0, so s =
	// 0.5 everywhere and the bias alone decides the ranking.
	spec := RouteSpec{Scoring: family.Sigmoid, NumExperts: 8, TopK: 3, NGroup: 4, TopKGroup: 2, NormTopKProb: true, RoutedScalingFactor: 2.5}
	tests := []struct {
		name string
		bias []float32
		want []int32
	}{
		// group sums (top-2 of c): g0 .1+.2 g1 .9+0 g2 .3+.3 g3 0+0 -> keep g1 (0.9+1), g2 (0.6+1)
		{"groups by top-2 sum", []float32{0.1, 0.2, 0.9, 0, 0.3, 0.3, 0, 0}, []int32{2, 4, 5}},
		// g1 best (1.6); g0 and g2 tie at 1.5 for the second place: the LOWER
		// group index g0 stays and g2, holding the best single expert 4, goes.
		{"group tie keeps lower group", []float32{0.25, 0.25, 0.3, 0.3, 0.5, 0, 0.1, 0.1}, []int32{2, 3, 0}},
		// expert tie inside kept groups: lower id first.
		{"expert tie lower id", []float32{0.3, 0.3, 0.3, 0.3, 0, 0, 0, 0}, []int32{0, 1, 2}},
		// the best single expert sits in a group that loses on the top-2 sum.
		{"best expert dropped with its group", []float32{1, -1, 0.4, 0.4, 0.3, 0.3, 0, 0}, []int32{2, 3, 4}},
	}
	for _, tt := range tests {
		logits := make([]float32, 8)
		r, err := Route(spec, logits, tt.bias, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(r.IDs, tt.want) {
			t.Errorf("%s: ids %v, want %v", tt.name, r.IDs, tt.want)
		}
		// Weights are the UNBIASED scores renormalised: all s = 0.5, so 1/3 each.
		for _, w := range r.Weights {
			if math.Abs(float64(w)-1.0/3) > 1e-7 {
				t.Errorf("%s: weight %v, want 1/3 (unbiased, normalised, rsf not applied)", tt.name, w)
			}
		}
	}
}

func TestRouteWeightsUnbiased(t *testing.T) {
	// s differs, bias reverses the order: ids follow c, weights follow s.
	spec := RouteSpec{Scoring: family.Sigmoid, NumExperts: 4, TopK: 2, NGroup: 1, TopKGroup: 1, NormTopKProb: false, RoutedScalingFactor: 1}
	logits := []float32{logitFor(0.9), logitFor(0.2), logitFor(0.6), logitFor(0.1)}
	bias := []float32{0, 1, 0, 0}
	r, err := Route(spec, logits, bias, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.IDs, []int32{1, 0}) {
		t.Fatalf("ids %v, want [1 0]", r.IDs)
	}
	if math.Abs(float64(r.Weights[0])-0.2) > 1e-6 || math.Abs(float64(r.Weights[1])-0.9) > 1e-6 {
		t.Errorf("weights %v, want [0.2 0.9] (no norm)", r.Weights)
	}
	if math.Abs(float64(r.Choice[1])-1.2) > 1e-6 {
		t.Errorf("choice[1] = %v, want s+bias = 1.2", r.Choice[1])
	}
}

func TestRouteSoftmax(t *testing.T) {
	logits := []float32{1, 2, 3, 0}
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l))
	}
	p := func(i int) float64 { return math.Exp(float64(logits[i])) / z }
	for _, norm := range []bool{false, true} {
		spec := RouteSpec{Scoring: family.Softmax, NumExperts: 4, TopK: 2, NormTopKProb: norm, RoutedScalingFactor: 1}
		r, err := Route(spec, logits, nil, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(r.IDs, []int32{2, 1}) {
			t.Fatalf("ids %v, want [2 1]", r.IDs)
		}
		w2, w1 := p(2), p(1)
		if norm {
			w2, w1 = w2/(w2+w1), w1/(w2+w1)
		}
		if math.Abs(float64(r.Weights[0])-w2) > 1e-6 || math.Abs(float64(r.Weights[1])-w1) > 1e-6 {
			t.Errorf("norm %v: weights %v, want [%v %v]", norm, r.Weights, w2, w1)
		}
	}
	// DeepSeek-V2 group_limited_greedy: groups scored by their max p.
	spec := RouteSpec{Scoring: family.Softmax, NumExperts: 6, TopK: 2, NGroup: 3, TopKGroup: 1, GroupByMax: true, RoutedScalingFactor: 1}
	// group maxima: g0 3, g1 2.9, g2 2.95; sums would favour g1 (2.9+2.8).
	r, err := Route(spec, []float32{3, -5, 2.9, 2.8, 2.95, -5}, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.IDs, []int32{0, 1}) {
		t.Errorf("group_limited_greedy ids %v, want [0 1]", r.IDs)
	}
}

// naiveRoute is an independent, sort-based routing for the random check.
func naiveRoute(spec RouteSpec, choice []float32) []int32 {
	e := len(choice)
	allowed := make([]bool, e)
	for i := range allowed {
		allowed[i] = true
	}
	if spec.NGroup > 1 {
		size := e / spec.NGroup
		type gs struct {
			g int
			s float32
		}
		var groups []gs
		for g := range spec.NGroup {
			m := slices.Clone(choice[g*size : (g+1)*size])
			sort.Slice(m, func(a, b int) bool { return m[a] > m[b] })
			groups = append(groups, gs{g, m[0] + m[1]})
		}
		sort.SliceStable(groups, func(a, b int) bool { return groups[a].s > groups[b].s })
		for i := range allowed {
			allowed[i] = false
		}
		for _, g := range groups[:spec.TopKGroup] {
			for j := g.g * size; j < (g.g+1)*size; j++ {
				allowed[j] = true
			}
		}
	}
	var idx []int
	for i := range e {
		if allowed[i] {
			idx = append(idx, i)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return choice[idx[a]] > choice[idx[b]] })
	out := make([]int32, spec.TopK)
	for i := range out {
		out[i] = int32(idx[i])
	}
	return out
}

func TestRouteRandomWithTies(t *testing.T) {
	// 264 experts in 8 groups (33 each), biases quantised to a coarse grid so
	// exact ties in c are frequent; logits 0 so s is the same for all.
	r := rand.New(rand.NewPCG(7, 8))
	spec := RouteSpec{Scoring: family.Sigmoid, NumExperts: 264, TopK: 8, NGroup: 8, TopKGroup: 3, NormTopKProb: true, RoutedScalingFactor: 2.5}
	const T = 50
	logits := make([]float32, T*264)
	for tok := range T {
		bias := make([]float32, 264)
		for i := range bias {
			bias[i] = float32(r.IntN(6)) / 8
		}
		rt, err := Route(spec, logits[tok*264:(tok+1)*264], bias, 1)
		if err != nil {
			t.Fatal(err)
		}
		want := naiveRoute(spec, rt.Choice)
		if !slices.Equal(rt.IDs, want) {
			t.Fatalf("token %d: ids %v, naive %v", tok, rt.IDs, want)
		}
	}
}

func TestTopKAgreement(t *testing.T) {
	choice := []float32{0.9, 0.8, 0.8 + 5e-6, 0.5, 0.1}
	tests := []struct {
		name      string
		got, want []int32
		ok        int
	}{
		{"same set, other order", []int32{1, 0}, []int32{0, 1}, 2},
		{"tie within 1e-5", []int32{0, 2}, []int32{0, 1}, 2},
		{"not a tie", []int32{0, 3}, []int32{0, 1}, 1},
		{"duplicate id", []int32{0, 0}, []int32{0, 1}, 1},
		{"out of range", []int32{0, 9}, []int32{0, 1}, 1},
	}
	for _, tt := range tests {
		ok, total, err := TopKAgreement(tt.got, tt.want, 1, 2, choice, 5, TieTolerance)
		if err != nil {
			t.Fatal(err)
		}
		if ok != tt.ok || total != 2 {
			t.Errorf("%s: %d/%d, want %d/2", tt.name, ok, total, tt.ok)
		}
	}
}

func TestRouteRefusesBadSpecs(t *testing.T) {
	bad := []RouteSpec{
		{Scoring: "relu", NumExperts: 4, TopK: 1, RoutedScalingFactor: 1},
		{Scoring: family.Softmax, NumExperts: 4, TopK: 5, RoutedScalingFactor: 1},
		{Scoring: family.Sigmoid, NumExperts: 6, TopK: 1, NGroup: 4, TopKGroup: 1, RoutedScalingFactor: 1},
		{Scoring: family.Sigmoid, NumExperts: 8, TopK: 5, NGroup: 4, TopKGroup: 2, RoutedScalingFactor: 1},
		{Scoring: family.Sigmoid, NumExperts: 8, TopK: 1, RoutedScalingFactor: math.NaN()},
	}
	for i, s := range bad {
		if _, err := Route(s, make([]float32, s.NumExperts), nil, 1); err == nil {
			t.Errorf("spec %d accepted: %+v", i, s)
		}
	}
}

// TestSparseMixer: Phi-3.5-MoE's inference router on hand-worked logits:
// slot 1 = the largest logit, weighted by the softmax over the logits within
// 2*eps (relative) of it; slot 2 = the largest of the rest, likewise.
func TestSparseMixer(t *testing.T) {
	for _, tc := range []struct {
		logits []float32
		eps    float32
		ids    []int32
		w      []float64
	}{
		// 1.9 is within 2*0.05 of 2 (relative to max(|s|, 2) = 2): it shares slot 1's softmax.
		{[]float32{2, 1.9, 0, -1}, 0.05, []int32{0, 1}, []float64{1 / (1 + math.Exp(-0.1)), 1}},
		// eps 0: each slot's softmax holds its winner alone (and exact ties).
		{[]float32{0.5, 3, 3, -2}, 0, []int32{1, 2}, []float64{0.5, 1}},
		// negative logits: factor = |s| where |s| > m
		{[]float32{-1, -1.05, -4, -1.2}, 0.1, []int32{0, 1}, []float64{1 / (1 + math.Exp(-0.05) + math.Exp(-0.2)), 1 / (1 + math.Exp(-0.15))}},
	} {
		ids, w := make([]int32, 2), make([]float32, 2)
		sparseMixer(tc.logits, tc.eps, ids, w)
		if !slices.Equal(ids, tc.ids) || math.Abs(float64(w[0])-tc.w[0]) > 1e-6 || math.Abs(float64(w[1])-tc.w[1]) > 1e-6 {
			t.Errorf("%v eps %v: ids %v weights %v, want %v %v", tc.logits, tc.eps, ids, w, tc.ids, tc.w)
		}
	}
}

// TestSqrtSoftplusScores: DeepSeek-V4's score against values worked by
// hand, torch's softplus threshold (l > 20 gives l) included.
func TestSqrtSoftplusScores(t *testing.T) {
	for _, c := range []struct {
		l    float32
		want float64
	}{{0, math.Sqrt(math.Ln2)}, {25, 5}, {20, math.Sqrt(math.Log1p(math.Exp(20)))}, {-30, math.Sqrt(math.Log1p(math.Exp(-30)))}, {1, math.Sqrt(math.Log(1 + math.E))}} {
		if got := scoreOf(family.SqrtSoftplus, c.l); got != float32(c.want) {
			t.Errorf("sqrtsoftplus(%v) = %v, want %v", c.l, got, float32(c.want))
		}
	}
}

// TestRouteHashed: the table's ids, weighted by their normalised scores
// (no correction bias); ids outside the experts are refused.
func TestRouteHashed(t *testing.T) {
	spec := RouteSpec{Scoring: family.SqrtSoftplus, NumExperts: 4, TopK: 2, NGroup: 1, TopKGroup: 1, NormTopKProb: true, RoutedScalingFactor: 1.5}
	logits := []float32{0, 25, -30, 1, 3, 3, 3, 3}
	r, err := RouteHashed(spec, logits, []int32{1, 3, 2, 2}, 2)
	if err != nil {
		t.Fatal(err)
	}
	s1, s3 := float32(5), scoreOf(family.SqrtSoftplus, 1)
	want := []float32{s1 / (s1 + s3 + 1e-20), s3 / (s1 + s3 + 1e-20), 0.5, 0.5}
	for i, w := range want {
		if math.Abs(float64(r.Weights[i]-w)) > 1e-7 {
			t.Errorf("weight %d = %v, want %v", i, r.Weights[i], w)
		}
	}
	if !slices.Equal(r.IDs, []int32{1, 3, 2, 2}) || r.Choice[1] != 5 {
		t.Errorf("ids %v, choice %v", r.IDs, r.Choice)
	}
	if _, err := RouteHashed(spec, logits, []int32{1, 4, 0, 0}, 2); err == nil {
		t.Error("expert id 4 of 4 accepted")
	}
	if _, err := RouteHashed(spec, logits, []int32{1}, 2); err == nil {
		t.Error("too few ids accepted")
	}
	sm := spec
	sm.Scoring = family.Softmax
	if _, err := RouteHashed(sm, logits, []int32{1, 3, 2, 2}, 2); err == nil {
		t.Error("hash routing with softmax scores accepted")
	}
}

// TestRouteSqrtSoftplus: top-k of score + correction bias, weights from
// the unbiased scores: the bias can pull a lower-scored expert in.
func TestRouteSqrtSoftplus(t *testing.T) {
	spec := RouteSpec{Scoring: family.SqrtSoftplus, NumExperts: 4, TopK: 2, NGroup: 1, TopKGroup: 1, NormTopKProb: true, RoutedScalingFactor: 1.5}
	r, err := Route(spec, []float32{2, 1, 0, -1}, []float32{0, 0, 0, 5}, 1)
	if err != nil {
		t.Fatal(err)
	}
	s0, s3 := scoreOf(family.SqrtSoftplus, 2), scoreOf(family.SqrtSoftplus, -1)
	if !slices.Equal(r.IDs, []int32{3, 0}) || math.Abs(float64(r.Weights[0]-s3/(s0+s3))) > 1e-7 {
		t.Errorf("ids %v weights %v", r.IDs, r.Weights)
	}
}

// TestRouteSharedLogits: Inkling's router. The E routed rows choose by
// sigmoid + bias; the k chosen and the S shared rows share one
// normalisation of their sigmoids. Hand-checked on one token (the bias
// flips the choice from expert 1 to 2), with ties (lower index wins), and
// on random logits the k+S weights of every token sum to 1.
func TestRouteSharedLogits(t *testing.T) {
	sig := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
	spec := RouteSpec{Scoring: family.Sigmoid, NumExperts: 4, TopK: 2, NGroup: 1, TopKGroup: 1, RoutedScalingFactor: 2.5, SharedLogits: 2}
	if spec.Rows() != 6 {
		t.Fatalf("rows %d", spec.Rows())
	}
	for _, c := range []struct {
		name   string
		logits []float32 // E routed then S shared
		bias   []float32
		ids    []int32
	}{
		{"bias flips the choice", []float32{2, 1, 0.9, -1, 0.5, -0.25}, []float32{0, 0, 0.1, 0}, []int32{0, 2}},
		{"no bias", []float32{2, 1, 0.9, -1, 0.5, -0.25}, nil, []int32{0, 1}},
		{"ties go to the lower index", []float32{0.5, 0.5, 0.5, 0.5, 3, -3}, nil, []int32{0, 1}},
	} {
		r, err := Route(spec, c.logits, c.bias, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(r.IDs, c.ids) || r.S != 2 || len(r.Shared) != 2 {
			t.Fatalf("%s: ids %v S %d shared %v, want ids %v", c.name, r.IDs, r.S, r.Shared, c.ids)
		}
		var sum float64
		for _, id := range c.ids {
			sum += sig(float64(c.logits[id]))
		}
		sum += sig(float64(c.logits[4])) + sig(float64(c.logits[5]))
		want := []float64{sig(float64(c.logits[c.ids[0]])) / sum, sig(float64(c.logits[c.ids[1]])) / sum, sig(float64(c.logits[4])) / sum, sig(float64(c.logits[5])) / sum}
		got := []float32{r.Weights[0], r.Weights[1], r.Shared[0], r.Shared[1]}
		for j := range want {
			if math.Abs(float64(got[j])-want[j]) > 1e-7 {
				t.Errorf("%s: weight %d = %v, want %v", c.name, j, got[j], want[j])
			}
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	const n = 64
	logits := make([]float32, n*spec.Rows())
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 2)
	}
	r, err := Route(spec, logits, nil, n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		s := float64(r.Weights[2*i]) + float64(r.Weights[2*i+1]) + float64(r.Shared[2*i]) + float64(r.Shared[2*i+1])
		if math.Abs(s-1) > 1e-6 {
			t.Fatalf("token %d: weights sum to %v", i, s)
		}
	}
	scaleRouting(r, 0.75)
	if s := r.Weights[0] + r.Weights[1] + r.Shared[0] + r.Shared[1]; math.Abs(float64(s)-0.75) > 1e-6 {
		t.Errorf("scaled weights sum to %v, want 0.75", s)
	}
	bad := spec
	bad.Scoring = family.Softmax
	if _, err := Route(bad, logits[:spec.Rows()], nil, 1); err == nil {
		t.Error("shared router rows with softmax scores accepted")
	}
	if _, err := RouteHashed(spec, logits[:spec.Rows()], []int32{0, 1}, 1); err == nil {
		t.Error("hash routing with shared router rows accepted")
	}
	if _, err := Route(spec, logits[:4], nil, 1); err == nil {
		t.Error("logits for the routed rows alone accepted")
	}
}
