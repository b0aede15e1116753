package moe

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
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
	// named: the products name their tokens and outputs (BandProduct's
	// X, Y); multiplied counts the rows F multiplied, by stage.
	named      bool
	multiplied [NumStages]atomic.Int64
}

func (s *gemmStages) Product(i int) (BandProduct, bool) {
	if s.w[i] == nil {
		return BandProduct{}, false
	}
	out, n := s.out[i], s.rows[i]
	var x, y func(t int) []float32
	if s.named {
		x = func(t int) []float32 { return s.x[t*s.k : (t+1)*s.k] }
		y = func(t int) []float32 { return out[t*n : (t+1)*n] }
	}
	return BandProduct{W: s.w[i], Rows: n, Cols: s.k, Tokens: s.m, X: x, Y: y, F: func(r0, r1 int, band []float32) {
		s.multiplied[i].Add(int64(r1 - r0))
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

// sameRowsWeight is a rowsWeight that tells when its rows hold another's
// values bit for bit (SameRows), as DST's copy of SRC's expert does.
type sameRowsWeight struct{ rowsWeight }

func (w sameRowsWeight) SameRows(o Weight, r0, r1 int) bool {
	ow, ok := o.(sameRowsWeight)
	return ok && slices.Equal(floatBytes(w.w[r0*w.cols:r1*w.cols]), floatBytes(ow.w[r0*w.cols:r1*w.cols]))
}

// Of two products run paired, the second takes the first's outputs
// instead of multiplying where both name their tokens, the tokens are the
// same bit for bit, and the weight rows hold the same bytes: only there.
// Every output is still the one the side gives alone.
func TestRunPairedSharesTheSameProduct(t *testing.T) {
	// Rows of 32768 values: bands of 8 rows (bandRows), three to a
	// product.
	const m, k, band = 5, 32768, 8
	rows := [NumStages]int{24, 24, 16}
	cases := []struct {
		name  string
		named bool
		edit  func(b *gemmStages) // b made a's copy, then edited
		want  [NumStages]int64    // rows b multiplies itself, by stage
	}{
		{"same tokens, same bytes", true, func(*gemmStages) {}, [NumStages]int64{0, 0, 0}},
		{"tokens not named", false, func(*gemmStages) {}, rows64(rows)},
		{"one token's -0 for 0", true, func(b *gemmStages) { b.x[3*k+7] = float32(math.Copysign(0, -1)) }, rows64(rows)},
		{"one weight row's band differs", true, func(b *gemmStages) {
			w := b.w[StageUp].(sameRowsWeight)
			w.w[17*k+5] += 1 // row 17: the band of rows 16..23
		}, [NumStages]int64{0, band, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := sameRowsStages(rand.New(rand.NewPCG(9, 9)), m, k, rows, band, c.named)
			b := sameRowsStages(rand.New(rand.NewPCG(9, 9)), m, k, rows, band, c.named)
			alone := sameRowsStages(rand.New(rand.NewPCG(9, 9)), m, k, rows, band, c.named)
			c.edit(b)
			c.edit(alone)
			if errA, errB := RunPaired(a, b, 2); errA != nil || errB != nil {
				t.Fatal(errA, errB)
			}
			if err := RunStages(alone, 2); err != nil {
				t.Fatal(err)
			}
			for i := range NumStages {
				if got := b.multiplied[i].Load(); got != c.want[i] {
					t.Errorf("stage %d: b multiplied %d rows, want %d", i, got, c.want[i])
				}
				if a.multiplied[i].Load() != int64(rows[i]) {
					t.Errorf("stage %d: a multiplied %d rows, want all %d", i, a.multiplied[i].Load(), rows[i])
				}
				if !slices.Equal(floatBytes(b.out[i]), floatBytes(alone.out[i])) {
					t.Errorf("stage %d: b's outputs paired differ from b's alone", i)
				}
			}
		})
	}
}

func rows64(r [NumStages]int) (n [NumStages]int64) {
	for i, v := range r {
		n[i] = int64(v)
	}
	return n
}

// sameRowsStages is newGemmStages with weights that tell SameRows.
func sameRowsStages(r *rand.Rand, m, k int, rows [NumStages]int, band int, named bool) *gemmStages {
	s := newGemmStages(r, m, k, rows, band, -1)
	for i, w := range s.w {
		if w != nil {
			rw := w.(rowsWeight)
			rw.w = slices.Clone(rw.w)
			s.w[i] = sameRowsWeight{rw}
		}
	}
	s.named = named
	s.x[3*k+7] = 0 // a case makes b's -0
	return s
}

// scaledWeight is a rowsWeight that tells when its rows are another's
// times factor (ScaledRows), as DST's routed expert with
// routed_scaling_factor folded into its scales is SRC's; it does not tell
// SameRows.
type scaledWeight struct {
	rowsWeight
	factor float64
}

func (w scaledWeight) ScaledRows(o Weight, r0, r1 int) (float64, bool) {
	ow, ok := o.(sameRowsWeight)
	if !ok {
		return 0, false
	}
	mine, theirs := w.w[r0*w.cols:r1*w.cols], ow.w[r0*ow.cols:r1*ow.cols]
	for i, v := range theirs {
		if math.Float32bits(float32(w.factor*float64(v))) != math.Float32bits(mine[i]) {
			return 0, false
		}
	}
	return w.factor, true
}

// Of two products run paired, the second takes the first's outputs times
// the factor where its weight rows are the first's so scaled (ScaledRows)
// and the tokens are the same; it multiplies itself wherever they are not,
// and wherever the first side's band did not give its outputs (a band that
// failed, and the bands after it, which are skipped). With a factor of 2
// (exact in every rounding) every output is the one the side gives alone.
func TestRunPairedScalesAFoldedProduct(t *testing.T) {
	const m, k, band = 5, 32768, 8
	rows := [NumStages]int{24, 24, 16}
	cases := []struct {
		name  string
		named bool
		editA func(a *gemmStages)
		editB func(b *gemmStages) // after b's down weight is made a's times 2
		want  int64               // down rows b multiplies itself
	}{
		{"scaled rows, same tokens", true, nil, nil, 0},
		{"tokens not named", false, nil, nil, 16},
		{"one token differs", true, nil, func(b *gemmStages) { b.x[2*k+1] += 1 }, 16},
		{"one row of b not scaled so", true, nil, func(b *gemmStages) {
			w := b.w[StageDown].(scaledWeight)
			w.w[9*k+3] += 1 // row 9: the band of rows 8..15
		}, band},
		{"a's second band fails", true, func(a *gemmStages) {
			w := a.w[StageDown].(sameRowsWeight)
			w.failAt = 9
			a.w[StageDown] = w
		}, nil, 16 - band},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mk := func() *gemmStages { return sameRowsStages(rand.New(rand.NewPCG(4, 4)), m, k, rows, band, c.named) }
			a, b, alone := mk(), mk(), mk()
			for _, s := range []*gemmStages{b, alone} {
				w := s.w[StageDown].(sameRowsWeight).rowsWeight
				w.w = slices.Clone(w.w)
				for i := range w.w {
					w.w[i] *= 2
				}
				s.w[StageDown] = scaledWeight{w, 2}
			}
			if c.editA != nil {
				c.editA(a)
			}
			if c.editB != nil {
				c.editB(b)
				c.editB(alone)
			}
			errA, errB := RunPaired(a, b, 2)
			if errB != nil || (errA != nil) != (c.editA != nil) {
				t.Fatal(errA, errB)
			}
			if err := RunStages(alone, 2); err != nil {
				t.Fatal(err)
			}
			if got := b.multiplied[StageDown].Load(); got != c.want {
				t.Errorf("b multiplied %d down rows, want %d", got, c.want)
			}
			for i := range NumStages {
				if !slices.Equal(floatBytes(b.out[i]), floatBytes(alone.out[i])) {
					t.Errorf("stage %d: b's outputs paired differ from b's alone", i)
				}
			}
		})
	}
}
