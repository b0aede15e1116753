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

// The products' deviation from the exact dot products (blasdot_test.go's
// exact), measured as relative L2 at the lengths validate's experts have
// (H 4096 and 7168, I 2048 and 14336), on random normals and on "ties"
// (bf16 values of a few magnitudes, whose products repeat and cancel
// exactly, where the order of the additions shows most), beside gonum's
// own, for the assembly and its Go twins. The bounds held here are the
// ones the doc comment (blasdot.go) and judge.TolFP32 state: SgemmNT (the
// fused path's float32 sums) at most maxFused, Dot64Rows (the reference's
// float32 pieces summed in float64) at most maxRef, and the two apart (what
// a check between the paths sees) at most their sum, 8e-7: 12x under
// TolFP32 (1e-5), the checks' tolerance between the two paths, where they
// measure 2.3e-7..3.7e-7. maxRef is 3e-7 since the reference's pieces are
// 128 elements (1.8e-7..2.3e-7 measured; 1.2e-7..1.6e-7 at 64, held under
// 2.5e-7): random errors grow as the root of a piece's length, 1.4x.
// Run with -v for the figures.
const (
	maxFused = 5e-7
	maxRef   = 3e-7
)

func TestDeviationFromExact(t *testing.T) {
	eachKernel(func(asm bool) { deviationFromExact(t, asm) })
}

func deviationFromExact(t *testing.T, asm bool) {
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
			d64 := make([]float64, len(d))
			for i, v := range d {
				d64[i] = float64(v)
			}
			apart := relL2(c, d64) // what a check between the two paths sees
			t.Logf("assembly %-5v k %5d %-6s: SgemmNT %.2e (gonum Sgemm %.2e); Dot64Rows %.2e (gonum Dsdot %.2e); SgemmNT vs Dot64Rows %.2e", asm, k, data, s32, g32, s64, g64, apart)
			if s32 > maxFused || s64 > maxRef || apart > maxFused+maxRef {
				t.Errorf("assembly %v k %d %s: relative L2 %.3g (SgemmNT), %.3g (Dot64Rows), %.3g apart: want <= %g, %g and %g", asm, k, data, s32, s64, apart, maxFused, maxRef, maxFused+maxRef)
			}
		}
	}
}
