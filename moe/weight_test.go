package moe

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moeprep/moeprep/internal/blasdot"
)

// rowsWeight is a dense matrix served a band at a time, bands starting at
// multiples of band; it fails on a row it is told to.
type rowsWeight struct {
	w          []float32
	cols, band int
	failAt     int // a band holding this row fails (-1: none)
}

func (r rowsWeight) Band() int { return r.band }

func (r rowsWeight) Rows(r0, r1 int, dst []float32) error {
	if r0%r.band != 0 {
		return fmt.Errorf("band starts at row %d, not a multiple of %d", r0, r.band)
	}
	if r.failAt >= r0 && r.failAt < r1 {
		return fmt.Errorf("row %d is corrupt", r.failAt)
	}
	copy(dst, r.w[r0*r.cols:r1*r.cols])
	return nil
}

// A product read by bands, one or several at once, gives the bits of the
// whole matrix's, and a band's decode error is the product's.
func TestProductBandsEqualWhole(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for _, sh := range []struct{ m, n, k, band int }{{5, 700, 400, 1}, {3, 300, 1000, 128}, {7, 13, 50, 4}} {
		a, w := make([]float32, sh.m*sh.k), make([]float32, sh.n*sh.k)
		for i := range a {
			a[i] = float32(r.NormFloat64())
		}
		for i := range w {
			w[i] = float32(r.NormFloat64())
		}
		want := make([]float32, sh.m*sh.n)
		blasdot.SgemmNT(sh.m, sh.n, sh.k, a, sh.k, w, sh.k, want, sh.n)
		rw := rowsWeight{w: w, cols: sh.k, band: sh.band, failAt: -1}
		for _, par := range []int{1, 4} {
			got := make([]float32, sh.m*sh.n)
			err := eachBand(rw, nil, sh.n, sh.k, par, func(r0, r1 int, band []float32) {
				blasdot.SgemmNT(sh.m, r1-r0, sh.k, a, sh.k, band, sh.k, got[r0:], sh.n)
			})
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%+v, %d bands at once: c[%d] = %g, whole %g", sh, par, i, got[i], want[i])
				}
			}
		}
		rw.failAt = sh.n - 1
		if err := eachBand(rw, nil, sh.n, sh.k, 4, func(int, int, []float32) {}); err == nil {
			t.Errorf("%+v: a band's decode error was lost", sh)
		}
	}
}
