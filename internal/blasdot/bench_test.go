package blasdot

import (
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// The products at validate's shapes (a DeepSeek-V3 routed expert's gate,
// H 7168, I 2048, with 64 tokens; Mixtral's down, I 14336, H 4096, with
// 32), whole and as validate calls them, a band of decoded rows at a time
// (moe.EachBand: 128 rows, an FP8 scale block's; 12 rows of 14336 for
// Mixtral's bf16 down), and a few tokens an expert, against gonum, in
// GFLOP/s.
var benchShapes = []struct {
	name    string
	m, n, k int
}{
	{"dsv3-gate-64tok", 64, 2048, 7168}, {"mixtral-down-32tok", 32, 4096, 14336},
	{"dsv3-gate-band-64tok", 64, 128, 7168}, {"mixtral-down-band-32tok", 32, 12, 14336},
	// A block of eight tokens (a Kimi-K2 INT4 expert's gate band, with the
	// six tokens an expert gets at 96 experts top-4; DeepSeek-V3's with 6):
	// rows 8 KiB and 28 KiB apart, in one L1 set (crowdsL1).
	{"kimi-gate-band-6tok", 6, 128, 2048}, {"dsv3-gate-band-6tok", 6, 48, 7168},
	// A block of sixteen holding thirteen (Kimi-K2's 96 experts top-8, with
	// the forced tokens: 12.7 on average).
	{"kimi-gate-band-13tok", 13, 128, 2048},
}

func BenchmarkSgemmNT(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, sh := range benchShapes {
		a, w, c := values(r, sh.m*sh.k, 1), values(r, sh.n*sh.k, 1), make([]float32, sh.m*sh.n)
		flop := 2 * float64(sh.m*sh.n*sh.k)
		b.Run(sh.name+"/kernels", func(b *testing.B) {
			for b.Loop() {
				SgemmNT(sh.m, sh.n, sh.k, a, sh.k, w, sh.k, c, sh.n)
			}
			b.ReportMetric(flop*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		b.Run(sh.name+"/gonum", func(b *testing.B) {
			for b.Loop() {
				gonum.Implementation{}.Sgemm(blas.NoTrans, blas.Trans, sh.m, sh.n, sh.k, 1, a, sh.k, w, sh.k, 0, c, sh.n)
			}
			b.ReportMetric(flop*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

func BenchmarkDot64Rows(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, sh := range benchShapes {
		x, out := make([][]float32, sh.m), make([][]float32, sh.m)
		for i := range x {
			x[i], out[i] = values(r, sh.k, 1), make([]float32, sh.n)
		}
		w := values(r, sh.n*sh.k, 1)
		flop := 2 * float64(sh.m*sh.n*sh.k)
		b.Run(sh.name+"/kernels", func(b *testing.B) {
			for b.Loop() {
				Dot64Rows(x, w, sh.n, sh.k, out)
			}
			b.ReportMetric(flop*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		b.Run(sh.name+"/gonum", func(b *testing.B) {
			impl := gonum.Implementation{}
			for b.Loop() {
				for i := range sh.n {
					wi := w[i*sh.k : (i+1)*sh.k]
					for t, xt := range x {
						out[t][i] = float32(impl.Dsdot(sh.k, xt, 1, wi, 1))
					}
				}
			}
			b.ReportMetric(flop*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
