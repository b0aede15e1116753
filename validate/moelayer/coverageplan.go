package moelayer

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/moe"
)

// DefaultCoverageRounds is how many forced tokens exercise each routed
// expert. Two, each in a differently shuffled company of other experts, so
// that a failing token set names its culprit: the expert whose every token
// failed.
const DefaultCoverageRounds = 2

// Coverage is forced routing for extra tokens, appended after a layer's
// routed tokens and run through the same align, grouped GEMM and finalize
// code (and the same reference experts) as real routing. Every routed expert
// in Experts takes Rounds token slots; the shared slots come with every token
// as they always do, and there are at least Rounds tokens per shared replica.
type Coverage struct {
	T, K    int
	X       []float32    // [T,H]
	Routing *moe.Routing // forced ids (routed experts) and weights, before rsf
	Experts []int        // routed experts exercised on purpose, sorted
	Sampled bool         // Experts is a sample (--sample-experts), not all E
	Rounds  int
}

// CoverageOptions shape a layer's coverage.
type CoverageOptions struct {
	Seed     uint64
	Layer    int
	H, E, K  int
	Replicas int // shared replicas R of the bank (0: none fused)
	Rounds   int // 0: DefaultCoverageRounds
	Sample   int // 0: every routed expert; else that many, drawn from the seed
}

// coverageStream separates the forced tokens' random stream from the
// routed tokens' (DrawX uses the layer index alone as its stream).
const coverageStream = 1 << 40

// NewCoverage draws a layer's forced tokens. Tokens come in rounds; in each,
// the experts are dealt K to a token (a short token is topped up with other
// experts), so each exercised expert appears once per round, in a different
// company each round. Slot weights are 1/K: each
// expert's share of a token's output is the same, so no expert hides behind
// a larger one.
func NewCoverage(o CoverageOptions) (*Coverage, error) {
	if o.Rounds == 0 {
		o.Rounds = DefaultCoverageRounds
	}
	switch {
	case o.H <= 0 || o.E <= 0 || o.K <= 0 || o.K > o.E:
		return nil, fmt.Errorf("coverage: H %d, %d experts, top-%d", o.H, o.E, o.K)
	case o.Rounds < 1 || o.Rounds > 64:
		return nil, fmt.Errorf("coverage: %d rounds per expert (want 1..64)", o.Rounds)
	case o.Sample < 0 || o.Replicas < 0:
		return nil, fmt.Errorf("coverage: sample %d, replicas %d", o.Sample, o.Replicas)
	}
	r := rand.New(rand.NewPCG(o.Seed, coverageStream|uint64(o.Layer)))
	experts := make([]int, o.E)
	for i := range experts {
		experts[i] = i
	}
	c := &Coverage{K: o.K, Rounds: o.Rounds}
	if o.Sample > 0 && o.Sample < o.E {
		r.Shuffle(len(experts), func(i, j int) { experts[i], experts[j] = experts[j], experts[i] })
		experts = experts[:o.Sample]
		c.Sampled = true
	}
	slices.Sort(experts)
	c.Experts = slices.Clone(experts)
	// The experts, shuffled once, fill a grid of m rows of K: round c deals
	// token j the expert in column k of row (j + c*k) mod m. Round 0 takes
	// the rows; in round 1 two experts of one row meet again only if their
	// columns agree mod m, which m >= K (E >= K*K) rules out. So an expert
	// never shares both its tokens with another one, and the expert whose
	// every token fails is the corrupted one.
	r.Shuffle(len(experts), func(i, j int) { experts[i], experts[j] = experts[j], experts[i] })
	m := (len(experts) + o.K - 1) / o.K
	var tokens [][]int
	for round := range o.Rounds {
		for j := range m {
			var ids []int
			for k := range o.K {
				if i := ((j+round*k)%m)*o.K + k; i < len(experts) {
					ids = append(ids, experts[i])
				}
			}
			tokens = append(tokens, topUp(r, ids, o.K, o.E))
		}
	}
	// Each shared replica serves tokens t with t mod R = r: consecutive
	// tokens reach every replica, Rounds times over.
	for len(tokens) < o.Replicas*o.Rounds {
		tokens = append(tokens, topUp(r, nil, o.K, o.E))
	}
	c.T = len(tokens)
	c.Routing = &moe.Routing{T: c.T, K: o.K, IDs: make([]int32, c.T*o.K), Weights: make([]float32, c.T*o.K)}
	w := 1 / float32(o.K)
	for i, tok := range tokens {
		for j, id := range tok {
			c.Routing.IDs[i*o.K+j] = int32(id)
			c.Routing.Weights[i*o.K+j] = w
		}
	}
	c.X = make([]float32, c.T*o.H)
	for i := range c.X {
		c.X[i] = numfmt.RoundBF16(float32(r.NormFloat64()))
	}
	return c, nil
}

// topUp returns ids followed by distinct other experts up to k in all.
func topUp(r *rand.Rand, ids []int, k, e int) []int {
	out := slices.Clone(ids)
	for len(out) < k {
		if id := r.IntN(e); !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// withCoverage returns x followed by the forced tokens' x, and the routing
// of the routed tokens followed by the forced routing: what both paths run.
func WithCoverage(x []float32, r *moe.Routing, c *Coverage) ([]float32, *moe.Routing, error) {
	if c == nil {
		return x, r, nil
	}
	if c.K != r.K {
		return nil, nil, fmt.Errorf("coverage: top-%d forced, top-%d routed", c.K, r.K)
	}
	all := &moe.Routing{T: r.T + c.T, K: r.K, IDs: slices.Concat(r.IDs, c.Routing.IDs), Weights: slices.Concat(r.Weights, c.Routing.Weights)}
	if r.S > 0 {
		all.S, all.Shared = r.S, SharedWeights(r, c)
	}
	return slices.Concat(x, c.X), all, nil
}

// sharedWeights are the router-weighted shared experts' weights (Inkling)
// of r's tokens followed by c's forced ones (nil c: none), which take the
// forced slots' weight 1/K, the same on every path.
func SharedWeights(r *moe.Routing, c *Coverage) []float32 {
	if c == nil {
		return r.Shared
	}
	forced := make([]float32, c.T*r.S)
	for i := range forced {
		forced[i] = 1 / float32(c.K)
	}
	return slices.Concat(r.Shared, forced)
}
