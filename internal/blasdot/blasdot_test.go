package blasdot

import (
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// values fills n floats the way validate's operands look (bf16-rounded
// normals, weights 1/64 of that), with signed zeros and tiny subnormal
// products mixed in, so that the order of every addition shows.
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

func sameBits(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// SgemmNT returns gonum's Sgemm bits for every shape validate meets: k a
// multiple of 16 (the kernel) or not (gonum), few rows or many (gonum
// serial or parallel: one dot product, or 64-wide pieces summed), n odd,
// padded strides, and rows offset so that their alignment varies.
func TestSgemmNTBitIdentical(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	impl := gonum.Implementation{}
	for _, sh := range []struct{ m, n, k, pad int }{
		{1, 1, 16, 0}, {6, 1024, 2048, 0}, {6, 2048, 1024, 0}, {64, 96, 160, 0}, {17, 33, 48, 4},
		{3, 5, 64, 0}, {70, 200, 80, 0}, {24, 64, 32, 0}, {5, 7, 21, 0}, {2, 300, 4112, 8}, {40, 40, 16, 0},
	} {
		for _, off := range []int{0, 1, 4} {
			lda, ldb := sh.k+sh.pad, sh.k+sh.pad
			a := values(r, sh.m*lda, 1)
			b := values(r, off+sh.n*ldb, 1.0/64)[off:]
			want := make([]float32, sh.m*sh.n)
			got := make([]float32, sh.m*sh.n)
			for i := range got {
				got[i] = float32(math.NaN()) // every output must be written
			}
			impl.Sgemm(blas.NoTrans, blas.Trans, sh.m, sh.n, sh.k, 1, a, lda, b, ldb, 0, want, sh.n)
			fast := sgemmFast(sh.m, sh.n, sh.k, a, lda, b, ldb, got, sh.n)
			if !fast {
				SgemmNT(sh.m, sh.n, sh.k, a, lda, b, ldb, got, sh.n)
			}
			if kernel := useAVX512 && off%4 == 0 && sh.k%16 == 0 && ldb%4 == 0; fast != kernel {
				t.Errorf("%+v offset %d: the kernel ran: %v", sh, off, fast)
			}
			if i := sameBits(got, want); i >= 0 {
				t.Fatalf("%+v offset %d: c[%d] = %g (%#x), gonum %g (%#x)", sh, off, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
		}
	}
}

// Dot64Rows returns moe.Dot64's bits (gonum's Dsdot) for one token or
// many (groups of eight and a partial one), k a multiple of 8 or not, and
// weights aligned or not.
func TestDot64RowsBitIdentical(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	impl := gonum.Implementation{}
	for _, sh := range []struct{ tokens, n, k int }{
		{1, 1, 8}, {6, 1024, 2048}, {6, 2048, 1024}, {17, 33, 160}, {96, 64, 64}, {3, 5, 21}, {9, 7, 4}, {8, 2, 4096},
	} {
		for _, off := range []int{0, 1, 2} {
			x := make([][]float32, sh.tokens)
			out := make([][]float32, sh.tokens)
			for i := range x {
				x[i] = values(r, sh.k, 1)
				out[i] = make([]float32, sh.n)
			}
			w := values(r, off+sh.n*sh.k, 1.0/64)[off:]
			fast := dot64Fast(x, w, sh.n, sh.k, out)
			if !fast {
				Dot64Rows(x, w, sh.n, sh.k, out)
			}
			if kernel := useAVX512 && off == 0 && sh.k%8 == 0; fast != kernel {
				t.Errorf("%+v offset %d: the kernel ran: %v", sh, off, fast)
			}
			for ti := range x {
				for i := range sh.n {
					want := float32(impl.Dsdot(sh.k, x[ti], 1, w[i*sh.k:(i+1)*sh.k], 1))
					if math.Float32bits(out[ti][i]) != math.Float32bits(want) {
						t.Fatalf("%+v offset %d: token %d row %d: %g, gonum %g", sh, off, ti, i, out[ti][i], want)
					}
				}
			}
		}
	}
}
