package blasdot

import (
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// One routed expert's gate projection at the benchmark's shape (H 2048,
// I 1024, 6 tokens): the kernels against gonum, in GFLOP/s.
func benchShapes(b *testing.B, fast bool, f func()) {
	save := useAVX512
	useAVX512 = fast
	defer func() { useAVX512 = save }()
	for b.Loop() {
		f()
	}
}

func BenchmarkSgemmNT(b *testing.B) {
	const m, n, k = 6, 1024, 2048
	r := rand.New(rand.NewPCG(1, 1))
	a, w, c := values(r, m*k, 1), values(r, n*k, 1), make([]float32, m*n)
	for _, fast := range []bool{false, true} {
		name := "gonum"
		if fast {
			name = "avx512"
		}
		b.Run(name, func(b *testing.B) {
			benchShapes(b, fast, func() { SgemmNT(m, n, k, a, k, w, k, c, n) })
			b.ReportMetric(2*m*n*k*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
	b.Run("gonum-direct", func(b *testing.B) {
		for b.Loop() {
			gonum.Implementation{}.Sgemm(blas.NoTrans, blas.Trans, m, n, k, 1, a, k, w, k, 0, c, n)
		}
	})
}

func BenchmarkDot64Rows(b *testing.B) {
	const tokens, n, k = 6, 1024, 2048
	r := rand.New(rand.NewPCG(1, 1))
	x, out := make([][]float32, tokens), make([][]float32, tokens)
	for i := range x {
		x[i], out[i] = values(r, k, 1), make([]float32, n)
	}
	w := values(r, n*k, 1)
	for _, fast := range []bool{false, true} {
		name := "gonum"
		if fast {
			name = "avx512"
		}
		b.Run(name, func(b *testing.B) {
			benchShapes(b, fast, func() { Dot64Rows(x, w, n, k, out) })
			b.ReportMetric(2*tokens*n*k*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
