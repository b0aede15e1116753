package moe

import (
	"fmt"
	"math"
)

// Scoring is how a router's logits become expert scores. Its value is the
// name config.json's scoring_func and the inspect report use.
type Scoring string

const (
	// Sigmoid: s = sigmoid(logit), ranked by s + correction bias
	// (DeepSeek-V3, Kimi-K2).
	Sigmoid Scoring = "sigmoid"
	// Softmax: p = softmax(logits), ranked by p, plus the correction bias
	// where the router has one (Qwen, Mixtral, DeepSeek-V2, ERNIE 4.5).
	Softmax Scoring = "softmax"
	// SparseMixer is Phi-3.5-MoE's top-2 router (Route's sparsemixer): each
	// pick weighted by the softmax over the logits within 2*JitterEps
	// (relative) of it.
	SparseMixer Scoring = "sparsemixer"
	// SqrtSoftplus is DeepSeek-V4's: s = sqrt(softplus(logit)), ranked by
	// s + correction bias, weights s[ids] normalised (+1e-20).
	SqrtSoftplus Scoring = "sqrtsoftplus"
)

// scorings is every scoring, with the integer the gate kernels take for it
// (the scoring argument of kernels/cuda/gate.cu and gate_reg.cu, which
// kernels' TestGateScoringCodes holds to these) and, for the scorings that
// score each logit on its own, that function in float64 (rounded once to
// float32 by Route). Adding a scoring is one entry here, its branch in the
// gate kernels, and its reference in moetest.
var scorings = [...]struct {
	name  Scoring
	code  int32
	score func(l float64) float64 // nil: the scores depend on the whole row
}{
	{Sigmoid, 0, func(l float64) float64 { return 1 / (1 + math.Exp(-l)) }},
	{Softmax, 1, nil},
	{SqrtSoftplus, 2, sqrtSoftplus},
	{SparseMixer, 3, nil},
}

// sqrtSoftplus is DeepSeek-V4's score with torch's softplus threshold
// (l > 20 gives l itself).
func sqrtSoftplus(l float64) float64 {
	if l <= 20 {
		l = math.Log1p(math.Exp(l))
	}
	return math.Sqrt(l)
}

// Scorings lists every scoring, in the order of their kernel codes.
func Scorings() []Scoring {
	out := make([]Scoring, len(scorings))
	for i, s := range scorings {
		out[i] = s.name
	}
	return out
}

func (s Scoring) index() int {
	for i, d := range scorings {
		if d.name == s {
			return i
		}
	}
	return -1
}

// Check refuses a scoring this package does not define.
func (s Scoring) Check() error {
	if s.index() < 0 {
		return fmt.Errorf("unknown router scoring %q", s)
	}
	return nil
}

// Code is the integer the gate kernels take for s (kernels/cuda/
// gate_common.cuh's SCORING_* constants). An unknown scoring has none: it
// is refused here rather than sent to the device, whose kernels trap on an
// unlisted code.
func (s Scoring) Code() (int32, error) {
	i := s.index()
	if i < 0 {
		return 0, fmt.Errorf("unknown router scoring %q has no kernel code", s)
	}
	return scorings[i].code, nil
}

// PerExpert reports whether s scores each logit on its own (the sigmoid
// family): the correction bias is added to such a score to rank it, and
// only such scores can weight a hash-routed layer's given experts.
func (s Scoring) PerExpert() bool {
	i := s.index()
	return i >= 0 && scorings[i].score != nil
}

// scoreOf is a per-expert score in float64, rounded once to float32 (the
// serving kernels compute it so too). s must be PerExpert.
func scoreOf(s Scoring, l float32) float32 {
	return float32(scorings[s.index()].score(float64(l)))
}

// TopKMethod is how experts are picked from the scores.
type TopKMethod string

const (
	// TopKGreedy is plain top-k over all experts (Qwen, Mixtral, DeepSeek-V2 "greedy").
	TopKGreedy TopKMethod = "greedy"
	// TopKGroupLimited is DeepSeek-V2's group_limited_greedy: a group's score is
	// the MAX softmax score in it; the topk_group best groups are kept, then top-k.
	TopKGroupLimited TopKMethod = "group_limited_greedy"
	// TopKNoAuxTC is DeepSeek-V3/Kimi-K2's noaux_tc: a group's score is the sum of
	// its top-2 biased sigmoid scores; the topk_group best groups are kept, then top-k.
	TopKNoAuxTC TopKMethod = "noaux_tc"
)

// Grouped reports whether m limits the top-k to the topk_group best groups
// (every method but greedy).
func (m TopKMethod) Grouped() bool { return m != TopKGreedy }

// GroupByMax reports whether m scores a group by its best member rather
// than by the sum of its best two (RouteSpec.GroupByMax).
func (m TopKMethod) GroupByMax() bool { return m == TopKGroupLimited }
