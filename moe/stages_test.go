package moe

import (
	"math"
	"math/rand/v2"
	"testing"
)

// gemmStages is a test MLP: three products over one weight each, every
// output a float32 dot product, and a stage's After recording the order.
type gemmStages struct {
	x      []float32
	m, k   int
	w      [NumStages]Weight
	rows   [NumStages]int
	out    [NumStages][]float32
	afters []int
}

func (s *gemmStages) Product(i int) (BandProduct, bool) {
	if s.w[i] == nil {
		return BandProduct{}, false
	}
	out, n := s.out[i], s.rows[i]
	return BandProduct{W: s.w[i], Rows: n, Cols: s.k, F: func(r0, r1 int, band []float32) {
		for t := range s.m {
			for r := r0; r < r1; r++ {
				var sum float32
				for c := range s.k {
					sum += s.x[t*s.k+c] * band[(r-r0)*s.k+c]
				}
				out[t*n+r] = sum
			}
		}
	}}, true
}

func (s *gemmStages) After(i int) error { s.afters = append(s.afters, i); return nil }

func newGemmStages(r *rand.Rand, m, k int, rows [NumStages]int, band, failAt int) *gemmStages {
	s := &gemmStages{m: m, k: k, rows: rows, x: make([]float32, m*k)}
	for i := range s.x {
		s.x[i] = float32(r.NormFloat64())
	}
	for i, n := range rows {
		if n == 0 {
			continue // no product at this stage (an ungated gate)
		}
		w := make([]float32, n*k)
		for j := range w {
			w[j] = float32(r.NormFloat64())
		}
		fa := -1
		if i == StageUp {
			fa = failAt
		}
		s.w[i] = rowsWeight{w: w, cols: k, band: band, failAt: fa}
		s.out[i] = make([]float32, m*n)
	}
	return s
}

// Two MLPs run paired give what each gives alone, bit for bit, in any
// banding and bands at once, with one's stage skipped (ungated); a side's
// band error is its own, and the other side still finishes.
func TestRunPairedEqualsAlone(t *testing.T) {
	for _, tc := range []struct {
		rows    [NumStages]int
		k, band int
		par     int
		failA   int // a band of a's up product fails at this row (-1: none)
	}{
		{[NumStages]int{700, 700, 300}, 400, 1, 1, -1},
		{[NumStages]int{0, 300, 1000}, 128, 128, 4, -1},
		{[NumStages]int{5000, 5000, 64}, 64, 4, 2, 4321},
	} {
		r := rand.New(rand.NewPCG(3, 3))
		a := newGemmStages(r, 5, tc.k, tc.rows, tc.band, tc.failA)
		b := newGemmStages(r, 3, tc.k, tc.rows, tc.band, -1)
		a1 := newGemmStages(rand.New(rand.NewPCG(3, 3)), 5, tc.k, tc.rows, tc.band, tc.failA)
		errA, errB := RunPaired(a, b, tc.par)
		if (errA != nil) != (tc.failA >= 0) || errB != nil {
			t.Fatalf("%+v: errors %v, %v", tc, errA, errB)
		}
		if errA != nil {
			if len(a.afters) != 1 || len(b.afters) != NumStages {
				t.Errorf("%+v: stages ended %v and %v", tc, a.afters, b.afters)
			}
			continue
		}
		if err := RunStages(a1, tc.par); err != nil {
			t.Fatal(err)
		}
		for i := range NumStages {
			for j := range a.out[i] {
				if math.Float32bits(a.out[i][j]) != math.Float32bits(a1.out[i][j]) {
					t.Fatalf("%+v: stage %d output %d paired %g, alone %g", tc, i, j, a.out[i][j], a1.out[i][j])
				}
			}
		}
		if len(b.afters) != NumStages {
			t.Errorf("%+v: b's stages ended %v", tc, b.afters)
		}
	}
}
