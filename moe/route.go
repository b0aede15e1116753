package moe

import (
	"fmt"
	"math"
	"slices"

	"gonum.org/v1/gonum/blas/gonum"
)

// RouteSpec is everything the gate needs besides the weights
// (family.Plan.RouteSpec derives it from a checkpoint's config).
type RouteSpec struct {
	Scoring      Scoring
	NumExperts   int // routed experts E
	TopK         int
	NGroup       int // 1 (or 0): no grouping
	TopKGroup    int
	NormTopKProb bool
	// GroupByMax scores a group by its largest score (DeepSeek-V2's
	// group_limited_greedy) instead of the sum of its two largest biased
	// scores (DeepSeek-V3's noaux_tc).
	GroupByMax bool
	// RoutedScalingFactor multiplies the routing weights (1 when the family
	// has none). Route leaves it out: each path applies it where its engine
	// does (Routing.Weights).
	RoutedScalingFactor float64
	// JitterEps is sparsemixer's relative mask threshold (Phi-3.5-MoE).
	JitterEps float64
	// SharedLogits is S where the router has S more rows, after the E
	// routed ones, for shared experts weighted in the same normalisation
	// as the chosen ones (Inkling); 0 otherwise.
	SharedLogits int
	// ZeroExperts is Z where the router has Z more rows, after the E
	// routed ones, for zero-compute identity experts (LongCat-Flash): they
	// are ranked with the routed experts, and a slot that chooses id E+z
	// returns its token's input, weighted. 0 otherwise.
	ZeroExperts int
}

// Rows is how many rows the router has: E, plus the shared experts' or
// the zero-compute experts' rows.
func (s RouteSpec) Rows() int { return s.NumExperts + s.SharedLogits + s.ZeroExperts }

// Ranking is the spec the gate ranks with: the zero-compute experts are
// experts to it (ids E..E+Z-1, their correction bias and scores beside the
// routed ones'); what a slot's id means is the caller's business.
func (s RouteSpec) Ranking() RouteSpec {
	s.NumExperts += s.ZeroExperts
	s.ZeroExperts = 0
	return s
}

// Check refuses a spec Route cannot run: an unknown scoring, sizes that do
// not fit together, a routed scaling factor that is not a finite positive
// number.
func (s RouteSpec) Check() error {
	if err := s.Scoring.Check(); err != nil {
		return err
	}
	e := s.NumExperts
	switch {
	case s.Scoring == SparseMixer && (s.TopK != 2 || s.NGroup > 1 || !(s.JitterEps >= 0)):
		return fmt.Errorf("sparsemixer routing with top-%d, %d groups, eps %v (want top-2, no groups, eps >= 0)", s.TopK, s.NGroup, s.JitterEps)
	case e <= 0:
		return fmt.Errorf("router has %d experts", e)
	case s.TopK <= 0 || s.TopK > e:
		return fmt.Errorf("top-k %d with %d experts", s.TopK, e)
	case s.NGroup > 1 && e%s.NGroup != 0:
		return fmt.Errorf("%d experts do not split into %d groups", e, s.NGroup)
	case s.NGroup > 1 && (s.TopKGroup <= 0 || s.TopKGroup > s.NGroup):
		return fmt.Errorf("topk_group %d with %d groups", s.TopKGroup, s.NGroup)
	case s.NGroup > 1 && s.TopKGroup*(e/s.NGroup) < s.TopK:
		return fmt.Errorf("top-k %d cannot be drawn from %d groups of %d experts", s.TopK, s.TopKGroup, e/s.NGroup)
	case math.IsNaN(s.RoutedScalingFactor) || math.IsInf(s.RoutedScalingFactor, 0) || s.RoutedScalingFactor <= 0:
		return fmt.Errorf("routed_scaling_factor %v", s.RoutedScalingFactor)
	case s.SharedLogits < 0 || (s.SharedLogits > 0 && s.Scoring != Sigmoid):
		return fmt.Errorf("%d shared router rows with %s scores (they need sigmoid)", s.SharedLogits, s.Scoring)
	}
	return nil
}

// Routing is the gate's output for T tokens.
type Routing struct {
	T, K int
	// IDs [T,K]: the chosen experts of each token, best first (ties: lower id).
	IDs []int32
	// Weights [T,K]: routing weights after normalisation and BEFORE the routed
	// scaling factor (the fused path applies rsf by folding or by a final
	// multiply; the reference multiplies it in as HF does).
	Weights []float32
	// Choice [T,E]: the score top-k ranked experts by (sigmoid + correction
	// bias, or softmax probability), kept for tie-robust comparisons.
	Choice []float32
	// S and Shared [T,S]: the shared experts' per-token weights where the
	// router scores them (Inkling), on the scale of Weights; 0 and nil
	// otherwise.
	S      int
	Shared []float32
	// Hashed: IDs are rows of a token-to-experts table (RouteHashed), not
	// a ranking of Choice: another path must take the same ids (an expert
	// a row names twice counts twice), ties do not apply (HashAgreement).
	Hashed bool
}

// RouterLogits computes x [T,H] times router [E,H] transposed in float64 and
// rounds each logit to float32. The HF modules compute the router in float32;
// a float64 accumulation is the more accurate of the two and differs from a
// float32 one by far less than the 1e-5 tie tolerance.
func RouterLogits(x []float32, t, h int, router []float32, e int) ([]float32, error) {
	if len(x) != t*h || len(router) != e*h {
		return nil, fmt.Errorf("router logits: x has %d values for %dx%d, router %d for %dx%d", len(x), t, h, len(router), e, h)
	}
	out := make([]float32, t*e)
	for i := range t {
		xi := x[i*h : (i+1)*h]
		for j := range e {
			out[i*e+j] = float32(Dot64(xi, router[j*h:(j+1)*h]))
		}
	}
	return out, nil
}

// Dot64 is the float64-accumulated dot product of two float32 vectors
// (gonum's Dsdot, SIMD on amd64): each float32 product is exact in float64.
func Dot64(a, b []float32) float64 {
	if len(a) == 0 {
		return 0
	}
	return gonum.Implementation{}.Dsdot(len(a), a, 1, b[:len(a)], 1)
}

// better orders candidates: higher score first, ties to the lower index. NaN
// ranks below everything so a NaN never displaces a real score.
func better(a float32, ai int, b float32, bi int) bool {
	an, bn := a != a, b != b
	switch {
	case an && bn:
		return ai < bi
	case an:
		return false
	case bn:
		return true
	case a != b:
		return a > b
	}
	return ai < bi
}

// topK returns the indices of the k best of score among allowed (nil: all),
// best first, ties to the lower index.
func topK(score []float32, allowed []bool, k int) []int {
	out := make([]int, 0, k)
	taken := make([]bool, len(score))
	for len(out) < k {
		best := -1
		for i, v := range score {
			if taken[i] || (allowed != nil && !allowed[i]) {
				continue
			}
			if best < 0 || better(v, i, score[best], best) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		taken[best] = true
		out = append(out, best)
	}
	return out
}

// Route runs the gate on logits [T,E]. bias is the F32
// e_score_correction_bias [E] (nil when the router has none).
//
// Sigmoid (DeepSeek-V3, Kimi-K2): s = sigmoid(logit), c = s + bias; each
// group scores the sum of its two largest c; the topk_group best groups stay
// (ties: lower group index, so the higher-index group is excluded first) and
// the others are out of the running (serving kernels mask them to -inf; HF
// masks to 0, which only differs when every kept c is negative); ids = top-k
// of c among the kept experts; w = s[ids] (unbiased); normalised to sum 1
// (+1e-20) if norm_topk_prob.
//
// SqrtSoftplus (DeepSeek-V4), and any other per-expert scoring, ranks and
// weights as sigmoid does, with its own score.
//
// Softmax (Qwen, Mixtral, DeepSeek-V2): p = softmax(logits), ranked by
// p + bias where the router has one (ERNIE 4.5); with groups
// (DeepSeek-V2 group_limited_greedy) a group scores its largest p; ids = top-k
// of p; w = p[ids]; renormalised if norm_topk_prob.
//
// SparseMixer (Phi-3.5-MoE): see sparseMixer; the bias is not used.
//
// With shared router rows (spec.SharedLogits, Inkling) logits are [T,E+S]
// and the k chosen weights and the S shared ones share one normalisation
// (sharedSink), the shared ones in Routing.Shared.
func Route(spec RouteSpec, logits []float32, bias []float32, t int) (*Routing, error) {
	if err := spec.Check(); err != nil {
		return nil, err
	}
	if spec.ZeroExperts != 0 {
		return nil, fmt.Errorf("routing: %d zero-compute experts: route with the spec's Ranking", spec.ZeroExperts)
	}
	e, k, ns, rows := spec.NumExperts, spec.TopK, spec.SharedLogits, spec.Rows()
	if len(logits) != t*rows {
		return nil, fmt.Errorf("routing: %d logits for %d tokens x %d router rows", len(logits), t, rows)
	}
	if bias != nil && len(bias) != e {
		return nil, fmt.Errorf("routing: correction bias has %d values for %d experts", len(bias), e)
	}
	r := &Routing{T: t, K: k, IDs: make([]int32, t*k), Weights: make([]float32, t*k), Choice: make([]float32, t*e)}
	if ns > 0 {
		r.S, r.Shared = ns, make([]float32, t*ns)
	}
	score := make([]float32, e)
	for i := range t {
		row := logits[i*rows : i*rows+e]
		choice := r.Choice[i*e : (i+1)*e]
		switch {
		case spec.Scoring == SparseMixer:
			copy(choice, row)
			sparseMixer(row, float32(spec.JitterEps), r.IDs[i*k:(i+1)*k], r.Weights[i*k:(i+1)*k])
			continue
		case spec.Scoring.PerExpert():
			for j, l := range row {
				score[j] = scoreOf(spec.Scoring, l)
				choice[j] = score[j]
				if bias != nil {
					choice[j] = score[j] + bias[j]
				}
			}
		case spec.Scoring == Softmax:
			softmax(row, score)
			copy(choice, score)
			if bias != nil { // ERNIE 4.5: top-k of softmax + bias, weights unbiased
				for j := range choice {
					choice[j] += bias[j]
				}
			}
		default: // a scoring added to the table without its rule here
			return nil, fmt.Errorf("routing: no rule for %s scores", spec.Scoring)
		}
		allowed := groupMask(spec, choice)
		ids := topK(choice, allowed, k)
		if len(ids) != k {
			return nil, fmt.Errorf("routing token %d: only %d of %d experts selectable", i, len(ids), k)
		}
		w := r.Weights[i*k : (i+1)*k]
		for j, id := range ids {
			r.IDs[i*k+j] = int32(id)
			w[j] = score[id]
		}
		switch {
		case ns > 0:
			sharedSink(w, r.Shared[i*ns:(i+1)*ns], logits[i*rows+e:(i+1)*rows])
		case spec.NormTopKProb:
			renormalise(w)
		}
	}
	return r, nil
}

// sharedSink is Inkling's weighting: the k chosen sigmoid scores w and the
// sigmoids of the S shared logits, all divided by their one sum (HF writes
// it exp(logsigmoid - logsumexp(logsigmoid)), the same quotient), computed
// in float64 and rounded once. No epsilon: every term is positive.
func sharedSink(w, shared, sharedLogits []float32) {
	sig := func(l float32) float64 { return 1 / (1 + math.Exp(-float64(l))) }
	var sum float64
	for _, v := range w {
		sum += float64(v)
	}
	for _, l := range sharedLogits {
		sum += sig(l)
	}
	for j, v := range w {
		w[j] = float32(float64(v) / sum)
	}
	for j, l := range sharedLogits {
		shared[j] = float32(sig(l) / sum)
	}
}

// ScaleRouting multiplies a routing's weights, shared ones included, by a
// router's scale tensor (Inkling's global_scale), each product rounded to
// float32 as HF multiplies in the model dtype.
func ScaleRouting(r *Routing, s float32) {
	for i := range r.Weights {
		r.Weights[i] *= s
	}
	for i := range r.Shared {
		r.Shared[i] *= s
	}
}

// ScaleByExpert multiplies each routing weight by its expert's entry of
// s (Gemma 4's per_expert_scale, applied after the top-k and its
// renormalisation), each product rounded to float32 as HF multiplies.
// An id outside s is an error, never an index out of range.
func ScaleByExpert(r *Routing, s []float32) error {
	for i, id := range r.IDs {
		if id < 0 || int(id) >= len(s) {
			return fmt.Errorf("per-expert scale: slot %d names expert %d of %d", i, id, len(s))
		}
		r.Weights[i] *= s[id]
	}
	return nil
}

// renormalise divides w by its float32 sum + 1e-20, as the HF routers do.
func renormalise(w []float32) {
	var sum float32
	for _, v := range w {
		sum += v
	}
	den := sum + 1e-20
	for j := range w {
		w[j] /= den
	}
}

// RouteHashed is a hash-routed layer's gate (DeepSeek-V4's hash_moe):
// ids [T,K] come from the token-to-experts table, the weights are the
// chosen experts' scores (no correction bias), normalised as Route
// normalises. A table row may name an expert twice; each slot then counts.
func RouteHashed(spec RouteSpec, logits []float32, ids []int32, t int) (*Routing, error) {
	if err := spec.Check(); err != nil {
		return nil, err
	}
	if !spec.Scoring.PerExpert() {
		return nil, fmt.Errorf("hash routing with %s scores is not supported", spec.Scoring)
	}
	if spec.SharedLogits > 0 {
		return nil, fmt.Errorf("hash routing with %d shared router rows is not supported", spec.SharedLogits)
	}
	e, k := spec.NumExperts, spec.TopK
	if len(logits) != t*e || len(ids) != t*k {
		return nil, fmt.Errorf("hash routing: %d logits and %d ids for %d tokens x %d experts, top-%d", len(logits), len(ids), t, e, k)
	}
	r := &Routing{T: t, K: k, IDs: slices.Clone(ids), Weights: make([]float32, t*k), Choice: make([]float32, t*e), Hashed: true}
	for i := range t {
		choice := r.Choice[i*e : (i+1)*e]
		for j, l := range logits[i*e : (i+1)*e] {
			choice[j] = scoreOf(spec.Scoring, l)
		}
		w := r.Weights[i*k : (i+1)*k]
		for j, id := range ids[i*k : (i+1)*k] {
			if id < 0 || int(id) >= e {
				return nil, fmt.Errorf("hash routing: token %d slot %d names expert %d of %d", i, j, id, e)
			}
			w[j] = choice[id]
		}
		if spec.NormTopKProb {
			renormalise(w)
		}
	}
	return r, nil
}

// sparseMixer is Phi-3.5-MoE's inference router (HF's sparsemixer, not
// training): two rounds, each taking the largest remaining logit m (ties: the
// lower index) and weighting it by the softmax over the logits s with
// (m - s) / max(|s|, m) <= 2*eps, the first round's winner left out of the
// second. The mask arithmetic is float32, as HF's.
func sparseMixer(logits []float32, eps float32, ids []int32, w []float32) {
	out := -1
	for slot := range 2 {
		m, mi := float32(math.Inf(-1)), -1
		for j, v := range logits {
			if j != out && (mi < 0 || better(v, j, m, mi)) {
				m, mi = v, j
			}
		}
		var sum, top float64
		for j, v := range logits {
			if j == out {
				continue
			}
			factor := float32(math.Max(math.Abs(float64(v)), float64(m)))
			if (m-v)/factor > 2*eps {
				continue
			}
			ex := math.Exp(float64(v) - float64(m))
			sum += ex
			if j == mi {
				top = ex
			}
		}
		ids[slot], w[slot] = int32(mi), float32(top/sum)
		out = mi
	}
}

// softmax writes the float32 softmax of logits (computed in float64, max-subtracted).
func softmax(logits, out []float32) {
	m := math.Inf(-1)
	for _, l := range logits {
		m = math.Max(m, float64(l))
	}
	var sum float64
	tmp := make([]float64, len(logits))
	for j, l := range logits {
		tmp[j] = math.Exp(float64(l) - m)
		sum += tmp[j]
	}
	for j := range out {
		out[j] = float32(tmp[j] / sum)
	}
}

// groupMask returns which experts survive group selection (nil: no grouping).
func groupMask(spec RouteSpec, choice []float32) []bool {
	if spec.NGroup <= 1 || spec.TopKGroup >= spec.NGroup {
		return nil
	}
	size := len(choice) / spec.NGroup
	gscore := make([]float32, spec.NGroup)
	for g := range gscore {
		members := choice[g*size : (g+1)*size]
		if spec.GroupByMax {
			gscore[g] = members[topK(members, nil, 1)[0]]
			continue
		}
		var s float32
		for _, j := range topK(members, nil, min(2, size)) {
			s += members[j]
		}
		gscore[g] = s
	}
	allowed := make([]bool, len(choice))
	for _, g := range topK(gscore, nil, spec.TopKGroup) {
		for j := g * size; j < (g+1)*size; j++ {
			allowed[j] = true
		}
	}
	return allowed
}
