package moe

import (
	"math"
	"testing"
)

// TestSiTU: Kimi K3's activation at values worked out apart (Python's
// math, the engines' formula): both tanh saturations, a negative gate, and
// linear beta 0 leaving the up projection as it is.
func TestSiTU(t *testing.T) {
	for _, c := range []struct {
		g, u, beta, lin, want float64
	}{
		{1, 2, 4, 25, 1.4293511315552199},
		{-3, 0.5, 4, 25, -0.060236955949608845},
		{10, 100, 4, 25, 98.59078155386423}, // the up projection capped near 25 tanh(4)
		{2, 3, 1, 0, 2.547338026862606},     // no linear beta: u as it is
	} {
		if got := SiTU(c.g, c.u, c.beta, c.lin); math.Abs(got-c.want) > 1e-12*math.Abs(c.want) {
			t.Errorf("SiTU(%g, %g, beta %g, linear beta %g) = %.17g, want %.17g", c.g, c.u, c.beta, c.lin, got, c.want)
		}
	}
}
