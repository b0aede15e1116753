package moetest

import (
	"errors"
	"math"
	"testing"
)

// Finalizer is the unpermute-and-reduce step under test:
// y[t] = scale * sum_k weights[t,k] * out[t*K+k], y [T,H].
type Finalizer interface {
	Finalize(out []float32, t, k, h int, weights []float32, scale float32) ([]float32, error)
}

var finalizeTests = []struct {
	name    string
	t, k, h int
	scale   float32
	zeros   bool // some weights exactly 0 (padding a token's unused slots)
}{
	{name: "T=1, top-8 + shared, rsf 2.5", t: 1, k: 9, h: 160, scale: 2.5},
	{name: "T=37, folded rsf", t: 37, k: 9, h: 160, scale: 1},
	{name: "one slot a token, H 7168", t: 5, k: 1, h: 7168, scale: 2.827},
	{name: "H 33 (not a multiple of 4)", t: 70, k: 3, h: 33, scale: 1},
	{name: "deepseek-v3 width", t: 16, k: 9, h: 7168, scale: 2.5},
	{name: "20 slots a token", t: 3, k: 20, h: 1000, scale: 1},
	{name: "H 1", t: 9, k: 4, h: 1, scale: 0.5},
	{name: "zero weights", t: 12, k: 6, h: 64, scale: 1, zeros: true},
}

// TestFinalize holds every element of f's output to the float64 sum within
// (K+2) 2^-24 |scale| sum_k |w_k out_k|: a float32 evaluation rounds each
// product, each of the K-1 partial sums and the scale multiply once, each
// by at most 2^-24 of a value no larger than that sum (a fused multiply-add
// rounds less). A dropped, doubled or misplaced slot is far outside it.
func TestFinalize(t *testing.T, f Finalizer) {
	runCases(t, len(finalizeTests), func(i int) string { return finalizeTests[i].name }, func(t *testing.T, i int) {
		c := finalizeTests[i]
		r := caseRand(31, i)
		out := bf16Normal(r, c.t*c.k*c.h, 1)
		w := make([]float32, c.t*c.k)
		for j := range w {
			w[j] = float32(r.NormFloat64() * 0.3)
			if c.zeros && r.IntN(3) == 0 {
				w[j] = 0
			}
		}
		got, err := f.Finalize(out, c.t, c.k, c.h, w, c.scale)
		if skipped(t, err) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != c.t*c.h {
			t.Fatalf("%d outputs, want %d x %d", len(got), c.t, c.h)
		}
		var errs errorList
		for tok := range c.t {
			for j := range c.h {
				var sum, mag float64
				for k := range c.k {
					p := float64(w[tok*c.k+k]) * float64(out[(tok*c.k+k)*c.h+j])
					sum += p
					mag += math.Abs(p)
				}
				s := math.Abs(float64(c.scale))
				want, bound := sum*float64(c.scale), float64(c.k+2)*0x1p-24*s*mag
				if g := float64(got[tok*c.h+j]); !(math.Abs(g-want) <= bound) {
					errs.add("token %d element %d: %v, want %v within %.3g", tok, j, g, want, bound)
				}
			}
		}
		errs.report(t)
	})
	t.Run("refuses short inputs", func(t *testing.T) {
		for _, bad := range []struct {
			name    string
			out, w  int
			t, k, h int
		}{
			{"too few outputs", 2*3*8 - 1, 6, 2, 3, 8},
			{"too few weights", 2 * 3 * 8, 5, 2, 3, 8},
		} {
			_, err := f.Finalize(make([]float32, bad.out), bad.t, bad.k, bad.h, make([]float32, bad.w), 1)
			if err == nil || errors.Is(err, ErrUnsupported) {
				t.Errorf("%s: not refused (error %v)", bad.name, err)
			}
		}
	})
}
