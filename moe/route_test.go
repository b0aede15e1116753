package moe

import (
	"math"
	"slices"
	"testing"
)

// TestScorings: every scoring has its own kernel code, listed in code
// order; unknown names are refused by Check and have no code; the
// per-expert ones are the sigmoid family.
func TestScorings(t *testing.T) {
	all := Scorings()
	if !slices.Equal(all, []Scoring{Sigmoid, Softmax, SqrtSoftplus, SparseMixer}) {
		t.Errorf("Scorings() = %v", all)
	}
	last := int32(-1)
	for _, s := range all {
		c, err := s.Code()
		if err != nil || s.Check() != nil || c <= last {
			t.Errorf("%s: code %d (after %d), %v, check %v", s, c, last, err, s.Check())
		}
		last = c
		if want := s == Sigmoid || s == SqrtSoftplus; s.PerExpert() != want {
			t.Errorf("%s: per-expert %v", s, s.PerExpert())
		}
	}
	for _, s := range []Scoring{"", "relu", "Sigmoid", "sigmoid "} {
		if _, err := s.Code(); err == nil || s.Check() == nil || s.PerExpert() {
			t.Errorf("%q: a code, a passing check or per-expert", s)
		}
	}
	for _, m := range []struct {
		m              TopKMethod
		grouped, byMax bool
	}{{TopKGreedy, false, false}, {TopKGroupLimited, true, true}, {TopKNoAuxTC, true, false}} {
		if m.m.Grouped() != m.grouped || m.m.GroupByMax() != m.byMax {
			t.Errorf("%s: grouped %v, group by max %v", m.m, m.m.Grouped(), m.m.GroupByMax())
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

// TestHashAgreement: a hash layer's ids match as the table's multiset per
// token: an expert named twice must be named twice, and no score makes
// another id right.
func TestHashAgreement(t *testing.T) {
	for _, tt := range []struct {
		name      string
		got, want []int32
		ok        int
	}{
		{"the table's row", []int32{3, 1, 3}, []int32{3, 1, 3}, 3},
		{"all zeros, as HF initialises tid2eid", []int32{0, 0, 0}, []int32{0, 0, 0}, 3},
		{"another order", []int32{1, 3, 3}, []int32{3, 3, 1}, 3},
		{"a repeat too few", []int32{3, 1, 1}, []int32{3, 1, 3}, 2},
		{"another expert", []int32{0, 0, 2}, []int32{0, 0, 0}, 2},
	} {
		ok, total, err := HashAgreement(tt.got, tt.want, 1, 3)
		if err != nil || ok != tt.ok || total != 3 {
			t.Errorf("%s: %d/%d (%v), want %d/3", tt.name, ok, total, err, tt.ok)
		}
	}
	if _, _, err := HashAgreement([]int32{0}, []int32{0, 1}, 1, 2); err == nil {
		t.Error("ids of the wrong count: no error")
	}
}

// TestSqrtSoftplusScores: DeepSeek-V4's score against values worked by
// hand, torch's softplus threshold (l > 20 gives l) included.
func TestSqrtSoftplusScores(t *testing.T) {
	for _, c := range []struct {
		l    float32
		want float64
	}{{0, math.Sqrt(math.Ln2)}, {25, 5}, {20, math.Sqrt(math.Log1p(math.Exp(20)))}, {-30, math.Sqrt(math.Log1p(math.Exp(-30)))}, {1, math.Sqrt(math.Log(1 + math.E))}} {
		if got := scoreOf(SqrtSoftplus, c.l); got != float32(c.want) {
			t.Errorf("sqrtsoftplus(%v) = %v, want %v", c.l, got, float32(c.want))
		}
	}
}

// TestRouteRefusesInputs: inputs of the wrong size, and hash-table ids
// outside the experts, are errors (moetest.TestRoute covers the specs).
func TestRouteRefusesInputs(t *testing.T) {
	spec := RouteSpec{Scoring: SqrtSoftplus, NumExperts: 4, TopK: 2, NormTopKProb: true, RoutedScalingFactor: 1.5}
	logits := []float32{0, 25, -30, 1, 3, 3, 3, 3}
	if _, err := RouteHashed(spec, logits, []int32{1, 4, 0, 0}, 2); err == nil {
		t.Error("expert id 4 of 4 accepted")
	}
	if _, err := RouteHashed(spec, logits, []int32{1, -1, 0, 0}, 2); err == nil {
		t.Error("expert id -1 accepted")
	}
	if _, err := RouteHashed(spec, logits, []int32{1}, 2); err == nil {
		t.Error("too few ids accepted")
	}
	if _, err := Route(spec, logits[:7], nil, 2); err == nil {
		t.Error("7 logits for 2 tokens x 4 accepted")
	}
	if _, err := Route(spec, logits, []float32{0, 0, 0}, 2); err == nil {
		t.Error("a bias of 3 for 4 experts accepted")
	}
	inkling := RouteSpec{Scoring: Sigmoid, NumExperts: 4, TopK: 2, RoutedScalingFactor: 2.5, SharedLogits: 2}
	if _, err := Route(inkling, logits[:4], nil, 1); err == nil {
		t.Error("logits for the routed rows alone accepted")
	}
	if _, err := RouterLogits(make([]float32, 6), 2, 3, make([]float32, 5), 2); err == nil {
		t.Error("a router of 5 values for 2 x 3 accepted")
	}
}

// TestFusedSlotsRefuses: a routing without slots, or shared slots that
// cannot be laid out.
func TestFusedSlotsRefuses(t *testing.T) {
	r := &Routing{T: 2, K: 1, IDs: []int32{0, 1}, Weights: []float32{1, 1}}
	for _, c := range []struct {
		name   string
		r      *Routing
		shared SharedSlots
	}{
		{"no slots a token", &Routing{T: 2}, SharedSlots{}},
		{"ids for 1 token of 2", &Routing{T: 2, K: 1, IDs: []int32{0}, Weights: []float32{1}}, SharedSlots{}},
		{"negative shared slots", r, SharedSlots{PerToken: -1, Replicas: 1, Weight: 1}},
		{"shared slots without a replica", r, SharedSlots{PerToken: 1, Weight: 1}},
	} {
		if _, err := FusedSlots(c.r, 4, c.shared, 1); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	s, err := FusedSlots(r, 4, SharedSlots{PerToken: 2, Replicas: 3, Weight: 0.4}, 2.5)
	if err != nil {
		t.Fatal(err)
	}
	// token 0: E + 0*S + {0,1}; token 1: E + 1*S + {0,1}
	if !slices.Equal(s.IDs, []int32{0, 4, 5, 1, 6, 7}) || !slices.Equal(s.Weights, []float32{1, 0.4, 0.4, 1, 0.4, 0.4}) || s.K != 3 || s.FinalScale != 2.5 {
		t.Errorf("slots %+v", s)
	}
}

// TestSharedSlotsCheck: what the kernels refuse to lay out.
func TestSharedSlotsCheck(t *testing.T) {
	if err := (SharedSlots{}).Check(256); err != nil {
		t.Errorf("no shared slots: %v", err)
	}
	if err := (SharedSlots{PerToken: 1, Replicas: 8, Weight: 0.4}).Check(256); err != nil {
		t.Errorf("DeepSeek-V3 --tp 8: %v", err)
	}
	for _, s := range []SharedSlots{
		{PerToken: -1, Replicas: 1, Weight: 1},
		{PerToken: 1, Replicas: 0, Weight: 1},
		{PerToken: 1, Replicas: 1, Weight: 0},
		{PerToken: 1, Replicas: 1, Weight: -1},
		{PerToken: 1, Replicas: 1, Weight: float32(math.NaN())},
		{PerToken: 1, Replicas: 1, Weight: float32(math.Inf(1))},
		{PerToken: 2, Replicas: math.MaxInt32 / 2, Weight: 1},
	} {
		if err := s.Check(256); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
}
