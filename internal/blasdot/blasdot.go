// Package blasdot computes what validate's CPU paths ask of gonum's BLAS
// (Sgemm with B transposed, row-by-row float64 dot products), returning the
// same bits, several outputs at a time.
//
// gonum's amd64 kernels add each dot product up in a fixed pattern of
// partial sums: DotUnitary keeps eight float32 sums (two SSE registers, four
// lanes each) fed in turn and folds them at the end, DdotUnitary four
// float64 sums, and Sgemm, when it splits the work into 64-wide blocks,
// adds the dot products of the 64-element pieces of k one after another.
// The order depends only on the lengths and on the weight row's address
// modulo 16. The AVX-512 kernels here (kernels_amd64.s) run that same
// pattern with the tokens in the vector lanes: the same additions in the
// same order for each output, sixteen (float32) or eight (float64) outputs
// per instruction instead of one or two. Where they do not apply (no
// AVX-512, a weight row not 16-byte aligned, a length not a multiple of
// the pattern's width, gonum built without its assembly) the calls go to
// gonum itself. The tests hold both to gonum, bit for bit.
package blasdot

import (
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// gonum's Sgemm splits m and n into blocks of this size and goes parallel,
// summing the 64-wide pieces of each dot product, when there are at least
// minParBlock blocks (gonum/blas/gonum/gonum.go).
const (
	blockSize   = 64
	minParBlock = 4
)

func blocks(dim int) int { return (dim + blockSize - 1) / blockSize }

// SgemmNT sets c [m,n] (rows ldc apart) to a [m,k] times b [n,k]
// transposed: gonum's Sgemm(NoTrans, Trans, m, n, k, 1, a, lda, b, ldb,
// 0, c, ldc), bit for bit.
func SgemmNT(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	if !sgemmFast(m, n, k, a, lda, b, ldb, c, ldc) {
		gonum.Implementation{}.Sgemm(blas.NoTrans, blas.Trans, m, n, k, 1, a, lda, b, ldb, 0, c, ldc)
	}
}

// Dot64Rows sets out[r][i] = float32(Dsdot(x[r], w[i*k:(i+1)*k])) for
// every row r of x (each k long) and i < n: the float64-accumulated dot
// product of moe.Dot64, bit for bit.
func Dot64Rows(x [][]float32, w []float32, n, k int, out [][]float32) {
	if dot64Fast(x, w, n, k, out) {
		return
	}
	impl := gonum.Implementation{}
	for i := range n {
		wi := w[i*k : (i+1)*k]
		for r, xr := range x {
			out[r][i] = float32(impl.Dsdot(k, xr, 1, wi, 1))
		}
	}
}

// fits reports whether a [rows, k] matrix of row stride ld fits in a
// slice of length n.
func fits(n, rows, k, ld int) bool {
	return rows == 0 || (ld >= k && n >= (rows-1)*ld+k)
}
