package moe

import (
	"math"
	"strings"
	"testing"
)

// TestGeluTanh: torch's gelu(approximate="tanh") at a few points (values
// from the formula in float64), odd-symmetric up to g: gelu(g) - gelu(-g) = g.
func TestGeluTanh(t *testing.T) {
	for _, c := range []struct{ g, want float64 }{
		{0, 0}, {1, 0.8411919906082768}, {-1, -0.15880800939172324}, {3, 2.996362607918227},
	} {
		if got := GeluTanh(c.g); math.Abs(got-c.want) > 1e-15 {
			t.Errorf("GeluTanh(%v) = %v, want %v", c.g, got, c.want)
		}
		if d := GeluTanh(c.g) - GeluTanh(-c.g); math.Abs(d-c.g) > 1e-15 {
			t.Errorf("GeluTanh(%v) - GeluTanh(%v) = %v, want %v", c.g, -c.g, d, c.g)
		}
	}
}

// TestScaleByExpert: each weight times its expert's entry, rounded to
// float32; an id outside the scale vector is an error naming the slot.
func TestScaleByExpert(t *testing.T) {
	r := &Routing{T: 2, K: 2, IDs: []int32{2, 0, 1, 2}, Weights: []float32{0.5, 0.25, 1, 0.1}}
	s := []float32{3, 0.5, 1.5}
	if err := ScaleByExpert(r, s); err != nil {
		t.Fatal(err)
	}
	for i, want := range []float32{0.75, 0.75, 0.5, float32(0.1) * 1.5} {
		if r.Weights[i] != want {
			t.Errorf("slot %d: %v, want %v", i, r.Weights[i], want)
		}
	}
	bad := &Routing{T: 1, K: 1, IDs: []int32{3}, Weights: []float32{1}}
	if err := ScaleByExpert(bad, s); err == nil || !strings.Contains(err.Error(), "slot 0 names expert 3 of 3") {
		t.Errorf("out-of-range id: %v", err)
	}
}
