package moe

import (
	"fmt"
	"math"
	"slices"
)

// TieTolerance is how close two biased scores must be for either expert to be
// an acceptable choice. Two paths that sum in different orders can swap
// experts whose float32 scores differ in the last few ulps (a score near 1
// has ulps of 6e-8), so a swap inside 1e-5 is a tie, not a routing bug; it is
// the atol serving engines' MoE kernel tests accept, and validate/README.md
// states it where top-k agreement is defined.
const TieTolerance = 1e-5

// TopKAgreement compares routings got and want ([T,K] ids each) tie-robustly:
// per token, an id of got that want lacks is still correct when its score in
// choice ([T,E], the reference's biased scores) is within tol of the unmatched
// id of want it displaced (pairing both leftovers best first). It returns the
// number of correct ids and the total, T*K. Out-of-range or repeated ids are wrong.
func TopKAgreement(got, want []int32, t, k int, choice []float32, e int, tol float32) (int, int, error) {
	if len(got) != t*k || len(want) != t*k || len(choice) != t*e {
		return 0, 0, fmt.Errorf("top-k agreement: %d and %d ids, %d scores for %d tokens x %d (of %d experts)", len(got), len(want), len(choice), t, k, e)
	}
	okCount := 0
	for i := range t {
		c := choice[i*e : (i+1)*e]
		inWant := map[int32]bool{}
		for _, id := range want[i*k : (i+1)*k] {
			inWant[id] = true
		}
		seen := map[int32]bool{}
		var gotOnly []int32
		for _, id := range got[i*k : (i+1)*k] {
			switch {
			case id < 0 || int(id) >= e || seen[id]:
				// wrong outright; counts as neither matched nor pairable
			case inWant[id]:
				okCount++
			default:
				gotOnly = append(gotOnly, id)
			}
			if id >= 0 && int(id) < e {
				seen[id] = true
			}
		}
		var wantOnly []int32
		for id := range inWant {
			if !seen[id] && id >= 0 && int(id) < e {
				wantOnly = append(wantOnly, id)
			}
		}
		sortByScore(gotOnly, c)
		sortByScore(wantOnly, c)
		for j := 0; j < len(gotOnly) && j < len(wantOnly); j++ {
			if d := float64(c[gotOnly[j]]) - float64(c[wantOnly[j]]); math.Abs(d) <= float64(tol) {
				okCount++
			}
		}
	}
	return okCount, t * k, nil
}

// HashAgreement compares the routings got and want ([T,K] ids each) of a
// hash-routed layer, whose ids are a token-to-experts table's rows: per
// token, an id of got is correct when want names it too, as a multiset
// (an expert the row names twice must be named twice; HF initialises the
// table to zeros, so every slot may name expert 0). No tie makes a
// different id right: both paths read the same table. It returns the
// number of correct ids and the total, T*K.
func HashAgreement(got, want []int32, t, k int) (int, int, error) {
	if len(got) != t*k || len(want) != t*k {
		return 0, 0, fmt.Errorf("hash agreement: %d and %d ids for %d tokens x %d", len(got), len(want), t, k)
	}
	okCount := 0
	left := make([]int32, k)
	for i := range t {
		left = append(left[:0], want[i*k:(i+1)*k]...)
		for _, id := range got[i*k : (i+1)*k] {
			if j := slices.Index(left, id); j >= 0 {
				okCount++
				left = slices.Delete(left, j, j+1)
			}
		}
	}
	return okCount, t * k, nil
}

func sortByScore(ids []int32, c []float32) {
	for i := 1; i < len(ids); i++ {
		for j := i; j > 0 && better(c[ids[j]], int(ids[j]), c[ids[j-1]], int(ids[j-1])); j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
}
