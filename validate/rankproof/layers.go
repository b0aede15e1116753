package rankproof

import (
	"context"
	"math"
	"math/rand/v2"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/weightfmt"
)

// LayerCheck is one MoE layer's routed experts recomposed from the ranks
// against SRC's (RecomposeRouted), each expert through its Replica-th
// replica (its last where it has fewer): the runs 0..most-1 serve every
// physical slot.
type LayerCheck struct {
	Layer     int     `json:"layer"`
	Replica   int     `json:"replica"`
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
// seeded tokens and the forced ones that reach every expert, once per
// replica choice (so every physical slot serves), and judges it.
func CheckRecomposed(ctx context.Context, src, dst string, T int, seed uint64) ([]LayerCheck, error) {
	c, err := readContract(dst)
	if err != nil {
		return nil, err
	}
	ck, plan, err := openPlanned(src)
	if err != nil {
		return nil, err
	}
	ck.Close()
	tol := tolSum
	if f, err := c.Format(); err == nil && c.RoutedScalingFactorFolded && f.Fold().Into != weightfmt.FoldScales {
		tol = tolFoldedBF16
	}
	if c.Dequantized != nil {
		// --dtype: every expert weight rounded once from SRC's exact
		// dequantisation, as the whole-model validate judges it (F32
		// holds it exactly)
		switch safetensors.DType(c.Dequantized.DType) {
		case safetensors.BF16:
			tol = max(tol, judge.TolDequantBF16.MaxRelL2)
		case safetensors.F16:
			tol = max(tol, judge.TolDequantF16.MaxRelL2)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0x6d6f65707265))
	x := make([]float32, T*plan.HiddenSize)
	for k := range x {
		x[k] = float32(rng.NormFloat64())
	}
	var out []LayerCheck
	for i, li := range c.Layers {
		if i < len(plan.Layers) && plan.Layers[i].HashTable != "" {
			continue // hash-routed (token ids, not x): proven by its bytes alone
		}
		for rep, most := 0, 1; rep < most; rep++ {
			res, err := RecomposeRouted(ctx, src, dst, i, x, T, rep, seed)
			if err != nil {
				return nil, err
			}
			most = res.Replicas
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
			out = append(out, LayerCheck{Layer: li.Index, Replica: rep, RelL2: rel, Tolerance: tol, Pass: rel <= tol})
		}
	}
	return out, nil
}

// openPlanned opens the checkpoint in src and plans it; the caller closes
// the checkpoint (on an error there is none to close).
func openPlanned(src string) (*checkpoint.Checkpoint, *family.Plan, error) {
	ck, err := checkpoint.Open(src)
	if err != nil {
		return nil, nil, err
	}
	plan, err := ck.Plan()
	if err != nil {
		ck.Close()
		return nil, nil, err
	}
	return ck, plan, nil
}
