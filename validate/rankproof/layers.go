package rankproof

import (
	"context"
	"math"
	"math/rand/v2"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/weightfmt"
)

// LayerCheck is one MoE layer's routed experts recomposed from the ranks
// against SRC's (RecomposeRouted), through the first or the last replica
// of each expert.
type LayerCheck struct {
	Layer     int     `json:"layer"`
	Replica   string  `json:"replica"` // first, last
	RelL2     float64 `json:"rel_l2"`
	Tolerance float64 `json:"tolerance"`
	Pass      bool    `json:"pass"`
}

// Tolerances of the recomposition. The parts sum in another order than
// the whole expert's dot products: float32 rounding, a few ulps
// (measured: below 1e-7 on the fixtures). A routed_scaling_factor folded
// into BF16 or F16 weights rounds each weight once more, by up to half a
// unit in the last place (2^-9 relative for bf16; measured 1.8e-3 of
// relative L2 on the DeepSeek-V3 fixture's layers): 2^-8 bounds it.
const (
	tolSum        = 1e-5
	tolFoldedBF16 = 1.0 / 256
)

// CheckRecomposed recomposes every MoE layer of a per-rank output on T
// seeded tokens, through the first and the last replicas, and judges it.
func CheckRecomposed(ctx context.Context, src, dst string, T int, seed uint64) ([]LayerCheck, error) {
	c, err := readContract(dst)
	if err != nil {
		return nil, err
	}
	ck, err := checkpoint.Open(src)
	if err != nil {
		return nil, err
	}
	plan, err := ck.Plan()
	ck.Close()
	if err != nil {
		return nil, err
	}
	tol := tolSum
	if f, err := c.Format(); err == nil && c.RoutedScalingFactorFolded && f.Fold().Into != weightfmt.FoldScales {
		tol = tolFoldedBF16
	}
	rng := rand.New(rand.NewPCG(seed, 0x6d6f65707265))
	x := make([]float32, T*plan.HiddenSize)
	for k := range x {
		x[k] = float32(rng.NormFloat64())
	}
	var out []LayerCheck
	for i, li := range c.Layers {
		for _, last := range []bool{false, true} {
			res, err := RecomposeRouted(ctx, src, dst, i, x, T, last)
			if err != nil {
				return nil, err
			}
			var d, n float64
			for k := range res.Want {
				d += math.Pow(float64(res.Got[k])-float64(res.Want[k]), 2)
				n += math.Pow(float64(res.Want[k]), 2)
			}
			rel := 0.0
			if n > 0 {
				rel = math.Sqrt(d / n)
			} else if d > 0 {
				rel = math.Inf(1)
			}
			lc := LayerCheck{Layer: li.Index, Replica: "first", RelL2: rel, Tolerance: tol, Pass: rel <= tol}
			if last {
				lc.Replica = "last"
			}
			out = append(out, lc)
		}
	}
	return out, nil
}
