package blasdot

import (
	"math"
	"math/rand/v2"
	"testing"
)

// values fills n floats the way validate's operands look (normals, weights
// 1/64 of that), with signed zeros and tiny subnormal products mixed in, so
// that the order of every addition shows.
func values(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		switch r.IntN(50) {
		case 0:
			v[i] = float32(math.Copysign(0, -1))
		case 1:
			v[i] = 0
		case 2:
			v[i] = float32(r.NormFloat64() * 1e-30)
		default:
			v[i] = float32(r.NormFloat64() * scale)
		}
	}
	return v
}

// shapes are the calls' shapes the tests run: k a multiple of the
// kernel's unrolled four steps or not, longer than a piece (kc32, kc64) or
// not, token and row counts that leave partial blocks (16) and groups (6),
// more rows than one block of rows (rowBlock), and padded strides.
var shapes = []struct{ m, n, k, pad int }{
	{1, 1, 8, 0}, {1, 1, 1, 0}, {6, 64, 2048, 0}, {6, 130, 1024, 0}, {64, 96, 160, 0}, {17, 33, 48, 4},
	{3, 5, 64, 0}, {70, 20, 80, 0}, {5, 7, 21, 0}, {2, 30, 4112, 8}, {4, 4, 1537, 3}, {9, 11, 515, 0},
	{19, 400, 70, 2}, // more rows than rowBlock: three blocks of rows, the last with a partial group
}

// sgemm runs SgemmNT on a fresh c, every output first NaN (each must be
// written).
func sgemm(m, n, k int, a []float32, lda int, b []float32, ldb int) []float32 {
	c := make([]float32, m*n)
	for i := range c {
		c[i] = float32(math.NaN())
	}
	SgemmNT(m, n, k, a, lda, b, ldb, c, n)
	return c
}

func dot64(x [][]float32, w []float32, n, k int) []float32 {
	out := make([][]float32, len(x))
	flat := make([]float32, len(x)*n)
	for t := range out {
		out[t] = flat[t*n : (t+1)*n]
		for i := range out[t] {
			out[t][i] = float32(math.NaN())
		}
	}
	Dot64Rows(x, w, n, k, out)
	return flat
}

// eachKernel runs f with the assembly kernels (where this machine and
// build have them) and with their Go twins.
func eachKernel(f func(asm bool)) {
	for _, asm := range []bool{true, false} {
		if !asm || useAsm {
			withAsm(asm, func() { f(asm) })
		}
	}
}

// withAsm runs f with the assembly kernels on or off.
func withAsm(on bool, f func()) {
	save := useAsm
	useAsm = on
	defer func() { useAsm = save }()
	f()
}

func tokens(r *rand.Rand, m, k int) [][]float32 {
	x := make([][]float32, m)
	for i := range x {
		x[i] = values(r, k, 1)
	}
	return x
}

func diffBits(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// An output depends on its two rows alone: the same token and weight row
// give the same bits alone as in any batch (the paths batch tokens by
// expert, block and worker, differently on SRC and DST).
func TestBatchIndependent(t *testing.T) {
	// Blocks of sixteen and of eight tokens (7, 19), one group of six rows
	// and the rest (10), two groups at once in a block of eight (14, 30):
	// a token alone is a block of eight with one row, the rest's path.
	// Rows 1100 apart spread over the L1 cache's sets; 1024 apart they
	// crowd one (crowdsL1), and a block of eight takes one group at a time.
	for _, sh := range []struct{ m, n, k int }{{7, 10, 1100}, {19, 14, 1100}, {8, 30, 1100}, {8, 30, 1024}, {21, 13, 1024}} {
		batchIndependent(t, sh.m, sh.n, sh.k)
	}
}

func batchIndependent(t *testing.T, m, n, k int) {
	r := rand.New(rand.NewPCG(2, 2))
	a, b := values(r, m*k, 1), values(r, n*k, 1.0/64)
	all := sgemm(m, n, k, a, k, b, k)
	x, w := tokens(r, m, k), values(r, n*k, 1.0/64)
	all64 := dot64(x, w, n, k)
	for i := range m {
		for j := range n {
			one := sgemm(1, 1, k, a[i*k:], k, b[j*k:], k)
			if math.Float32bits(one[0]) != math.Float32bits(all[i*n+j]) {
				t.Fatalf("SgemmNT token %d row %d: %g alone, %g in the batch", i, j, one[0], all[i*n+j])
			}
			one = dot64(x[i:i+1], w[j*k:(j+1)*k], 1, k)
			if math.Float32bits(one[0]) != math.Float32bits(all64[i*n+j]) {
				t.Fatalf("Dot64Rows token %d row %d: %g alone, %g in the batch", i, j, one[0], all64[i*n+j])
			}
		}
	}
}

func TestCrowdsL1(t *testing.T) {
	for _, c := range []struct {
		ldw  int
		want bool
	}{
		{2048, true}, {7168, true}, {1024, true}, {14336, true}, // 4 KiB multiples: all twelve in one set
		{512, false},                                               // 2 KiB apart: six in each of two sets
		{256, false},                                               // 1 KiB: three in each of four
		{2880, false},                                              // gpt-oss's width: twelve sets
		{1100, false}, {1408, false}, {4112, false}, {1536, false}, // 6 KiB: six in each of two
		{1025, true},  // 4 KiB and 4 bytes: the rows drift a word a row, still one set
		{1040, false}, // 4 KiB and a line: a set each
	} {
		if got := crowdsL1(c.ldw); got != c.want {
			t.Errorf("crowdsL1(%d) = %v, want %v", c.ldw, got, c.want)
		}
	}
}

// A block of eight tokens gives the same bits whether its rows go two
// groups at a time or one (the order of one output's sum is the same).
func TestNarrowGroupsSameBits(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	const m, n, k = 6, 31, 2048
	a, b := values(r, m*k, 1), values(r, n*k, 1.0/64)
	x := tokens(r, m, k)
	run := func(crowd int) ([]float32, []float32) {
		save := crowdRows
		crowdRows = crowd
		defer func() { crowdRows = save }()
		return sgemm(m, n, k, a, k, b, k), dot64(x, b, n, k)
	}
	eachKernel(func(asm bool) {
		pairS, pairD := run(2 * groupRows) // never one group at a time
		oneS, oneD := run(0)               // always
		for i := range pairS {
			if math.Float32bits(pairS[i]) != math.Float32bits(oneS[i]) || math.Float32bits(pairD[i]) != math.Float32bits(oneD[i]) {
				t.Fatalf("asm %v output %d: two groups at once %g, %g; one %g, %g", asm, i, pairS[i], pairD[i], oneS[i], oneD[i])
			}
		}
	})
}

// exact is the dot product of a and b to within 2^-100 of the products'
// magnitudes (each float32 product is exact in float64, and a
// double-double sum, Knuth's TwoSum, keeps what each addition rounds
// off), rounded to float64, and the sum of the products' magnitudes.
func exact(a, b []float32) (float64, float64) {
	var hi, lo, abs float64
	for i := range a {
		p := float64(a[i]) * float64(b[i])
		s := hi + p
		bv := s - hi
		lo += (hi - (s - bv)) + (p - bv)
		hi = s
		abs += math.Abs(p)
	}
	return hi + lo, abs
}

// Each output is within the rounding error its order allows of the exact
// dot product, for the assembly and for its Go twin (which rounds each
// product before adding it, one rounding more): SgemmNT's float32 sums by
// (piece + pieces + 2) 2^-24 of the products' magnitudes (a piece's
// additions, the pieces', and each product's rounding); Dot64Rows' by half
// an ulp of float32 plus (piece + 2) 2^-24 of them (a piece's float32
// additions and the product's rounding; the float64 additions after add
// under 2^-40).
func TestWithinRoundingOfExact(t *testing.T) {
	eachKernel(func(asm bool) { withinRoundingOfExact(t, asm) })
}

func withinRoundingOfExact(t *testing.T, asm bool) {
	r := rand.New(rand.NewPCG(3, 3))
	for _, sh := range shapes {
		// SgemmNT reads rows ld apart (pad elements between them, filled
		// with values it must not read); Dot64Rows' weight rows are k apart.
		k, ld := sh.k, sh.k+sh.pad
		a, b := values(r, sh.m*ld, 1), values(r, sh.n*ld, 1.0/64)
		c := sgemm(sh.m, sh.n, k, a, ld, b, ld)
		x := make([][]float32, sh.m)
		for i := range x {
			x[i] = a[i*ld : i*ld+k]
		}
		bk := make([]float32, 0, sh.n*k)
		for j := range sh.n {
			bk = append(bk, b[j*ld:j*ld+k]...)
		}
		c64 := dot64(x, bk, sh.n, k)
		for i := range sh.m {
			for j := range sh.n {
				want, abs := exact(x[i], bk[j*k:(j+1)*k])
				bound32 := float64(min(k, kc32)+(k+kc32-1)/kc32+2) * 0x1p-24 * abs
				if d := math.Abs(float64(c[i*sh.n+j]) - want); d > bound32 {
					t.Fatalf("SgemmNT (assembly %v) %+v (%d,%d): %g, exact %g: off by %g > %g", asm, sh, i, j, c[i*sh.n+j], want, d, bound32)
				}
				bound64 := 0x1p-24*math.Abs(want) + float64(min(k, kc64)+2)*0x1p-24*abs
				if d := math.Abs(float64(c64[i*sh.n+j]) - want); d > bound64 {
					t.Fatalf("Dot64Rows (assembly %v) %+v (%d,%d): %g, exact %g: off by %g > %g", asm, sh, i, j, c64[i*sh.n+j], want, d, bound64)
				}
			}
		}
	}
}

// Operands too short for their shapes panic before any kernel reads past
// them (the kernels read in place, without Go's bounds checks).
func TestShortOperandsPanic(t *testing.T) {
	const m, n, k = 5, 4, 16
	full := func(l int) []float32 { return make([]float32, l) }
	outs := func() [][]float32 { return tokens(rand.New(rand.NewPCG(1, 1)), m, n) }
	cases := []struct {
		name string
		f    func()
	}{
		{"SgemmNT a", func() { SgemmNT(m, n, k, full(m*k-1), k, full(n*k), k, full(m*n), n) }},
		{"SgemmNT b", func() { SgemmNT(m, n, k, full(m*k), k, full(n*k-1), k, full(m*n), n) }},
		{"Dot64Rows w", func() { Dot64Rows(tokens(rand.New(rand.NewPCG(1, 1)), m, k), full(n*k-1), n, k, outs()) }},
		{"Dot64Rows x", func() {
			x := tokens(rand.New(rand.NewPCG(1, 1)), m, k)
			x[m-1] = x[m-1][:k-1]
			Dot64Rows(x, full(n*k), n, k, outs())
		}},
	}
	for _, c := range cases {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: a short operand did not panic", c.name)
				}
			}()
			c.f()
		}()
	}
}

// Tokens packed once serve every band of a weight: band by band, the
// outputs are the bits of the whole weight's in one call (as validate
// multiplies a decoded band at a time).
func TestPackedTokensBandByBand(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 6))
	const m, n, k, band = 21, 40, 300, 13
	a, b := values(r, m*k, 1), values(r, n*k, 1.0/64)
	whole := sgemm(m, n, k, a, k, b, k)
	x := make([][]float32, m)
	for i := range x {
		x[i] = a[i*k : (i+1)*k]
	}
	whole64 := dot64(x, b, n, k)
	tk := PackMatrix(m, k, a, k)
	defer tk.Release()
	c, c64 := make([]float32, m*n), make([]float32, m*n)
	view := make([][]float32, m)
	for r0 := 0; r0 < n; r0 += band {
		r1 := min(r0+band, n)
		tk.SgemmNT(r1-r0, b[r0*k:], k, c[r0:], n)
		for i := range view {
			view[i] = c64[i*n+r0:]
		}
		tk.Dot64Rows(b[r0*k:r1*k], r1-r0, view)
	}
	if i := diffBits(c, whole); i >= 0 {
		t.Errorf("SgemmNT band by band: output %d %g, whole %g", i, c[i], whole[i])
	}
	if i := diffBits(c64, whole64); i >= 0 {
		t.Errorf("Dot64Rows band by band: output %d %g, whole %g", i, c64[i], whole64[i])
	}
}
