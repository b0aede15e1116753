// Package placement decides where an MoE model's experts live when it is
// served with expert parallelism: S physical slots on N ranks (S/N each),
// S = E + R, so R experts get a second (or third) replica. A replica takes
// an equal share of its expert's recorded load, and the placement keeps
// the most loaded rank as close to the mean as it can. This is the problem
// DeepSeek's EPLB defines: hierarchical when the routing's expert groups
// divide among the nodes (each node is given whole groups, so
// group-limited routing keeps its traffic on few nodes), global otherwise.
package placement

import (
	"cmp"
	"fmt"
	"slices"
)

// Spec is the shape of the placement.
type Spec struct {
	Experts int `json:"experts"` // E, logical experts per layer
	Slots   int `json:"slots"`   // S = E + R physical slots per layer
	Ranks   int `json:"ep"`      // N, expert-parallel ranks (GPUs); S/N slots each
	Nodes   int `json:"nodes"`   // K, nodes the ranks are spread over (1: one node)
	Groups  int `json:"n_group"` // G, expert groups of group-limited routing (n_group; 1: none)
}

// Check refuses a shape no placement fits, naming the numbers.
func (s Spec) Check() error {
	switch {
	case s.Experts < 1 || s.Ranks < 1 || s.Slots < 1:
		return fmt.Errorf("experts %d, slots %d and ranks %d must be positive", s.Experts, s.Slots, s.Ranks)
	case s.Slots < s.Experts:
		return fmt.Errorf("%d slots cannot hold %d experts: --slots is E plus the redundant experts", s.Slots, s.Experts)
	case s.Slots%s.Ranks != 0:
		return fmt.Errorf("%d slots do not divide among %d ranks", s.Slots, s.Ranks)
	case s.Nodes < 1 || s.Ranks%s.Nodes != 0:
		return fmt.Errorf("%d ranks do not divide among %d nodes", s.Ranks, s.Nodes)
	case s.Groups < 1 || s.Experts%s.Groups != 0:
		return fmt.Errorf("%d experts do not divide into %d groups", s.Experts, s.Groups)
	}
	return nil
}

// Hierarchical reports whether the groups divide among the nodes (and the
// slots among them), so that each node is given whole groups.
func (s Spec) Hierarchical() bool {
	return s.Nodes > 1 && s.Groups%s.Nodes == 0 && s.Slots%s.Nodes == 0
}

// Layer is one layer's placement: Map[slot] is the logical expert the slot
// holds; slot p is on rank p / (S/N).
type Layer struct {
	Map []int
}

// Contiguous is the placement without recorded loads: slot p holds expert
// p mod E, so each rank holds a contiguous range and the redundant slots
// repeat the first experts (vLLM's initial map; with S = E, DeepSeek's
// and TensorRT-LLM's ranges).
func Contiguous(s Spec) Layer {
	m := make([]int, s.Slots)
	for p := range m {
		m[p] = p % s.Experts
	}
	return Layer{Map: m}
}

// Balance places one layer's load (load[e] for each logical expert).
func Balance(s Spec, load []float64) (Layer, error) {
	if err := s.Check(); err != nil {
		return Layer{}, err
	}
	if len(load) != s.Experts {
		return Layer{}, fmt.Errorf("%d loads for %d experts", len(load), s.Experts)
	}
	if !s.Hierarchical() {
		l := Layer{Map: balanceNode(load, allExperts(s.Experts), s.Slots, s.Ranks)}
		// The greedy steps can lose to the plain ranges on a load they
		// happen to suit (one hot expert whose wrapped replica lands
		// well); never place worse than them.
		if c := Contiguous(s); Imbalance(RankLoads(s, c, load)) < Imbalance(RankLoads(s, l, load)) {
			return c, nil
		}
		return l, nil
	}
	// Whole groups onto nodes, balanced by group load.
	per := s.Experts / s.Groups
	gload := make([]float64, s.Groups)
	for e, l := range load {
		gload[e/per] += l
	}
	nodeOf := pack(gload, s.Nodes, s.Groups/s.Nodes)
	slotsPerNode, ranksPerNode := s.Slots/s.Nodes, s.Ranks/s.Nodes
	if slotsPerNode < s.Experts/s.Nodes {
		return Layer{}, fmt.Errorf("%d slots per node cannot hold its %d experts", slotsPerNode, s.Experts/s.Nodes)
	}
	m := make([]int, 0, s.Slots)
	for n := range s.Nodes {
		var experts []int
		for g, at := range nodeOf {
			if at == n {
				for e := g * per; e < (g+1)*per; e++ {
					experts = append(experts, e)
				}
			}
		}
		m = append(m, balanceNode(load, experts, slotsPerNode, ranksPerNode)...)
	}
	return Layer{Map: m}, nil
}

func allExperts(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// balanceNode places experts (logical ids) on slots slots of ranks ranks:
// each replica given to the expert whose replicas carry the most load
// each, then the replicas packed onto the ranks, heaviest first, each to
// the least loaded rank with a free slot. The map lists rank 0's slots
// first; within a rank, by logical id.
func balanceNode(load []float64, experts []int, slots, ranks int) []int {
	count := make([]int, len(experts))
	for i := range count {
		count[i] = 1
	}
	for range slots - len(experts) {
		best := 0
		for i := range experts {
			// share_i > share_best, compared without division.
			if load[experts[i]]*float64(count[best]) > load[experts[best]]*float64(count[i]) {
				best = i
			}
		}
		count[best]++
	}
	type replica struct {
		expert int
		share  float64
	}
	var reps []replica
	for i, e := range experts {
		for range count[i] {
			reps = append(reps, replica{e, load[e] / float64(count[i])})
		}
	}
	shares := make([]float64, len(reps))
	for i, r := range reps {
		shares[i] = r.share
	}
	rankOf := pack(shares, ranks, slots/ranks)
	perRank := make([][]int, ranks)
	for i, r := range rankOf {
		perRank[r] = append(perRank[r], reps[i].expert)
	}
	out := make([]int, 0, slots)
	for _, ids := range perRank {
		slices.Sort(ids)
		out = append(out, ids...)
	}
	return out
}

// pack assigns items to bins of capacity items each, heaviest item first
// to the lightest bin with room (ties to the lower index): the greedy
// balanced packing. Returns each item's bin.
func pack(weight []float64, bins, capacity int) []int {
	order := allExperts(len(weight))
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(weight[b], weight[a]) })
	sum := make([]float64, bins)
	used := make([]int, bins)
	at := make([]int, len(weight))
	for _, i := range order {
		best := -1
		for b := range bins {
			if used[b] < capacity && (best < 0 || sum[b] < sum[best]) {
				best = b
			}
		}
		at[i] = best
		sum[best] += weight[i]
		used[best]++
	}
	return at
}

// RankLoads is the load each rank serves under the placement: each slot
// carries its expert's load divided by the expert's replica count.
func RankLoads(s Spec, l Layer, load []float64) []float64 {
	count := make([]int, s.Experts)
	for _, e := range l.Map {
		count[e]++
	}
	per := s.Slots / s.Ranks
	out := make([]float64, s.Ranks)
	for p, e := range l.Map {
		out[p/per] += load[e] / float64(count[e])
	}
	return out
}

// Imbalance is (max - mean) / mean of the ranks' loads; 0 when nothing
// was recorded.
func Imbalance(loads []float64) float64 {
	var sum, mx float64
	for _, l := range loads {
		sum += l
		mx = max(mx, l)
	}
	if sum == 0 {
		return 0
	}
	mean := sum / float64(len(loads))
	return (mx - mean) / mean
}
