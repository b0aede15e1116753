package blasdot

import (
	"math/rand/v2"
	"testing"
)

// withAVX512 runs f with the AVX-512 kernel on or off.
func withAVX512(on bool, f func()) {
	save := useAVX512
	useAVX512 = on
	defer func() { useAVX512 = save }()
	f()
}

// The AVX-512 kernel gives the AVX2 kernel's bits, for both products:
// each output lane takes the same fused multiply-adds in the same order
// and is added to its accumulator the same way. The shapes cover one pair
// of groups and many, an odd group left to the AVX2 kernel, a last group
// of fewer than six rows, blocks of eight beside blocks of sixteen, k
// shorter than an unrolled step and across pieces (kc32, kc64), and row
// blocks (rowBlock); the data random normals with zeros and subnormals,
// and ties (values of a few magnitudes, whose sums cancel exactly).
func TestAVX512SameBits(t *testing.T) {
	if !useAVX512 {
		t.Skip("no AVX-512 on this CPU, or no assembly in this build")
	}
	r := rand.New(rand.NewPCG(7, 7))
	ties := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.IntN(17)-8) / 16
		}
		return v
	}
	shapes := []struct{ m, n, k int }{
		{16, 12, 1}, {16, 12, 5}, {9, 18, 64}, {16, 24, 3}, {13, 30, 257}, {32, 31, 2048},
		{40, 36, 1024}, {17, 200, 300}, {24, 13, 129}, {48, 390, 17}, {64, 12, 7168},
	}
	for _, sh := range shapes {
		for _, tie := range []bool{false, true} {
			a, b := values(r, sh.m*sh.k, 1), values(r, sh.n*sh.k, 1.0/64)
			if tie {
				a, b = ties(sh.m*sh.k), ties(sh.n*sh.k)
			}
			x := make([][]float32, sh.m)
			for i := range x {
				x[i] = a[i*sh.k : (i+1)*sh.k]
			}
			var s2, d2, s5, d5 []float32
			withAVX512(false, func() { s2, d2 = sgemm(sh.m, sh.n, sh.k, a, sh.k, b, sh.k), dot64(x, b, sh.n, sh.k) })
			withAVX512(true, func() { s5, d5 = sgemm(sh.m, sh.n, sh.k, a, sh.k, b, sh.k), dot64(x, b, sh.n, sh.k) })
			if i := diffBits(s2, s5); i >= 0 {
				t.Errorf("%dx%dx%d ties %v: SgemmNT output %d: AVX2 %g, AVX-512 %g", sh.m, sh.n, sh.k, tie, i, s2[i], s5[i])
			}
			if i := diffBits(d2, d5); i >= 0 {
				t.Errorf("%dx%dx%d ties %v: Dot64Rows output %d: AVX2 %g, AVX-512 %g", sh.m, sh.n, sh.k, tie, i, d2[i], d5[i])
			}
		}
	}
}
