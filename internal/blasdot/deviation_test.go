package blasdot

import (
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// relL2 is ||got - want|| / ||want||.
func relL2(got []float32, want []float64) float64 {
	var d, n float64
	for i, w := range want {
		d += (float64(got[i]) - w) * (float64(got[i]) - w)
		n += w * w
	}
	return math.Sqrt(d / n)
}

// The deviation that replacing gonum's order costs, measured: relative L2
// of each product against the exact dot products (blasdot_test.go's
// exact), at the
// lengths validate's experts have (H 4096 and 7168, I 2048 and 14336), on
// random normals and on "ties" (bf16 values of a few magnitudes, whose
// products repeat and cancel exactly, where the order of the additions
// shows most), beside gonum's own. judge.TolFP32 (1e-5) is the check's
// tolerance for float32 against float64 sums: the kernels' float32 stays
// 10x under it, and their float64 sums round to within half an ulp of
// float32 (2^-25 ~ 3e-8). Run with -v for the figures.
func TestDeviationFromExact(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	ties := func(n int, scale float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(float64(r.IntN(7)-3) * scale * math.Ldexp(1, -r.IntN(3)))
		}
		return v
	}
	for _, k := range []int{2048, 4096, 7168, 14336} {
		for _, data := range []string{"random", "ties"} {
			const m, n = 8, 16
			var a, b []float32
			if data == "random" {
				a, b = values(r, m*k, 1), values(r, n*k, 1.0/64)
			} else {
				a, b = ties(m*k, 1), ties(n*k, 1.0/64)
			}
			want := make([]float64, m*n)
			for i := range m {
				for j := range n {
					want[i*n+j], _ = exact(a[i*k:(i+1)*k], b[j*k:(j+1)*k])
				}
			}
			c := sgemm(m, n, k, a, k, b, k)
			g := make([]float32, m*n)
			gonum.Implementation{}.Sgemm(blas.NoTrans, blas.Trans, m, n, k, 1, a, k, b, k, 0, g, n)
			x := make([][]float32, m)
			for i := range x {
				x[i] = a[i*k : (i+1)*k]
			}
			d := dot64(x, b, n, k)
			gd := make([]float32, m*n)
			for i := range m {
				for j := range n {
					gd[i*n+j] = float32(gonum.Implementation{}.Dsdot(k, x[i], 1, b[j*k:(j+1)*k], 1))
				}
			}
			s32, g32, s64, g64 := relL2(c, want), relL2(g, want), relL2(d, want), relL2(gd, want)
			t.Logf("k %5d %-6s: SgemmNT %.2e (gonum Sgemm %.2e); Dot64Rows %.2e (gonum Dsdot %.2e)", k, data, s32, g32, s64, g64)
			if s32 > 1e-6 || s64 > 0x1p-25 {
				t.Errorf("k %d %s: relative L2 %.3g (float32), %.3g (float64 sums): want <= 1e-6 and 2^-25", k, data, s32, s64)
			}
		}
	}
}
