package moelayer

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

// TestNewCoverage: every routed expert (or the sample) takes exactly Rounds
// forced slots before top-up, no token names an expert twice, every shared
// replica gets at least Rounds tokens, and weights are 1/K.
func TestNewCoverage(t *testing.T) {
	for _, tc := range []struct {
		e, k, reps, rounds, sample int
	}{
		{8, 2, 0, 0, 0}, {16, 4, 8, 2, 0}, {257, 8, 8, 2, 0}, {384, 8, 1, 3, 0}, {6, 6, 0, 1, 0},
		{5, 3, 2, 2, 0}, {64, 8, 4, 2, 10}, {10, 1, 16, 2, 0},
	} {
		t.Run(fmt.Sprintf("E%d_K%d_R%d_rounds%d_sample%d", tc.e, tc.k, tc.reps, tc.rounds, tc.sample), func(t *testing.T) {
			c, err := NewCoverage(CoverageOptions{Seed: 7, Layer: 3, H: 4, E: tc.e, K: tc.k, Replicas: tc.reps, Rounds: tc.rounds, Sample: tc.sample})
			if err != nil {
				t.Fatal(err)
			}
			rounds := max(tc.rounds, 1)
			if tc.rounds == 0 {
				rounds = DefaultCoverageRounds
			}
			want := tc.e
			if tc.sample > 0 {
				want = tc.sample
			}
			if len(c.Experts) != want || c.Sampled != (tc.sample > 0) {
				t.Fatalf("%d experts covered (sampled %v), want %d", len(c.Experts), c.Sampled, want)
			}
			count := map[int32]int{}
			for i := range c.T {
				row := c.Routing.IDs[i*c.K : (i+1)*c.K]
				for j, id := range row {
					if id < 0 || int(id) >= tc.e || slices.Contains(row[:j], id) {
						t.Fatalf("token %d slots %v", i, row)
					}
					count[id]++
					if w := c.Routing.Weights[i*c.K+j]; w != 1/float32(tc.k) {
						t.Fatalf("weight %v", w)
					}
				}
			}
			for _, e := range c.Experts {
				if count[int32(e)] < rounds {
					t.Errorf("expert %d in %d forced slots, want >= %d", e, count[int32(e)], rounds)
				}
			}
			if c.T < tc.reps*rounds {
				t.Errorf("%d tokens for %d replicas x %d rounds", c.T, tc.reps, rounds)
			}
			if len(c.X) != c.T*4 || slices.ContainsFunc(c.X, func(v float32) bool { return v == 0 || math.IsNaN(float64(v)) }) {
				t.Errorf("x: %d values, want %d non-zero", len(c.X), c.T*4)
			}
			again, _ := NewCoverage(CoverageOptions{Seed: 7, Layer: 3, H: 4, E: tc.e, K: tc.k, Replicas: tc.reps, Rounds: tc.rounds, Sample: tc.sample})
			if !slices.Equal(again.Routing.IDs, c.Routing.IDs) || !slices.Equal(again.X, c.X) {
				t.Error("not reproducible from the seed")
			}
		})
	}
	for _, bad := range []CoverageOptions{{H: 4, E: 4, K: 5}, {H: 0, E: 4, K: 1}, {H: 4, E: 4, K: 1, Rounds: 100}, {H: 4, E: 4, K: 1, Sample: -1}} {
		if _, err := NewCoverage(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
