package kernels_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/moe"
)

// TestRouterGEMM compares the router GEMM with moe.RouterLogits (f64
// accumulation) on the same decoded inputs. Bound: f32 accumulation of H
// products, |d| <= 1e-5 * sum_h |x_h w_h| (the rounding error of an f32 sum
// is about H*2^-24 of that sum in the worst case, far less in practice).
func TestRouterGEMM(t *testing.T) {
	dev := testDevice(t)
	cases := []struct {
		name   string
		tok, e int
		h      int
		xd, wd kernels.MatDType
	}{
		{"T1 f32", 1, 264, 160, kernels.MatF32, kernels.MatF32},
		{"T37 bf16 x bf16", 37, 264, 160, kernels.MatBF16, kernels.MatBF16},
		{"T5 odd H", 5, 8, 33, kernels.MatF32, kernels.MatBF16},
		{"T6 bf16 x f32 384", 6, 384, 96, kernels.MatBF16, kernels.MatF32},
		{"T4 deepseek shape", 4, 256, 7168, kernels.MatF32, kernels.MatBF16},
		// bf16 x bf16: the tensor-core kernels (s: T <= 16, m: <= 1024, l: above).
		{"T3 bf16 deepseek shape (mma s)", 3, 256, 7168, kernels.MatBF16, kernels.MatBF16},
		{"T130 bf16 deepseek shape (mma m)", 130, 256, 7168, kernels.MatBF16, kernels.MatBF16},
		{"T20 bf16 H 168, a partial k chunk, 40 experts (mma m)", 20, 40, 168, kernels.MatBF16, kernels.MatBF16},
		{"T2100 bf16 264 experts (mma l; Hopper c128n128s2; partial tiles)", 2100, 264, 512, kernels.MatBF16, kernels.MatBF16},
		{"T9 bf16 H 36 (not a multiple of 8: SIMT)", 9, 24, 36, kernels.MatBF16, kernels.MatBF16},
		// Hopper: cluster kernels (routerClusterPick; TestRouterClusterKernels
		// runs every one); elsewhere mma m / l.
		{"T4000 bf16 H 512 (c128n128s2, a partial row tile)", 4000, 256, 512, kernels.MatBF16, kernels.MatBF16},
		{"T2048 bf16 H 1024 (c128n256s6)", 2048, 256, 1024, kernels.MatBF16, kernels.MatBF16},
		{"T1000 bf16 deepseek shape (c128n256s8)", 1000, 256, 7168, kernels.MatBF16, kernels.MatBF16},
		{"T600 bf16 H 520, a partial K step (c64n256s8)", 600, 256, 520, kernels.MatBF16, kernels.MatBF16},
		{"T700 bf16 96 experts H 256, ranks without K steps (c64n256s8)", 700, 96, 256, kernels.MatBF16, kernels.MatBF16},
		{"T515 bf16 7 experts H 64 (c64n256s8, odd E)", 515, 7, 64, kernels.MatBF16, kernels.MatBF16},
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := randn(r, c.tok*c.h, 1)
			w := randn(r, c.e*c.h, 1/math.Sqrt(float64(c.h)))
			upload := func(v []float32, d kernels.MatDType) ([]float32, kernels.Mat) {
				if d == kernels.MatBF16 {
					b := toBF16(v)
					return fromBF16(b), kernels.BF16Mat(toDevice(t, dev, b))
				}
				return v, kernels.F32Mat(toDevice(t, dev, v))
			}
			xv, xm := upload(x, c.xd)
			wv, wm := upload(w, c.wd)
			logits := poisoned(t, dev, c.tok*c.e)
			if err := kernels.RouterGEMM(dev, 0, xm, wm, logits, c.tok, c.h, c.e); err != nil {
				t.Fatal(err)
			}
			got := fromDevice(t, logits)
			// Deterministic: a second run gives the same bits.
			again := poisoned(t, dev, c.tok*c.e)
			if err := kernels.RouterGEMM(dev, 0, xm, wm, again, c.tok, c.h, c.e); err != nil {
				t.Fatal(err)
			}
			for i, v := range fromDevice(t, again) {
				if math.Float32bits(v) != math.Float32bits(got[i]) {
					t.Fatalf("second run: logit [%d,%d] = %v, first %v", i/c.e, i%c.e, v, got[i])
				}
			}
			want, err := moe.RouterLogits(xv, c.tok, c.h, wv, c.e)
			if err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			for i := range want {
				tok, e := i/c.e, i%c.e
				var mag float64
				for k := range c.h {
					mag += math.Abs(float64(xv[tok*c.h+k]) * float64(wv[e*c.h+k]))
				}
				d := math.Abs(float64(got[i]) - float64(want[i]))
				if !(d <= 1e-5*mag) {
					t.Fatalf("logit [%d,%d] = %v, want %v (|d| %.3g, bound %.3g)", tok, e, got[i], want[i], d, 1e-5*mag)
				}
				worst = max(worst, d/mag)
			}
			kern := "simt"
			if c.xd == kernels.MatBF16 && c.wd == kernels.MatBF16 && c.h%8 == 0 {
				kern = kernels.RouterKernel(dev, c.tok, c.e)
			}
			t.Logf("%s: max |d| / sum|x w| = %.3g, rel_l2 %.3g", kern, worst, relL2(got, want))
		})
	}
}

// TestRouterClusterKernels runs every Hopper cluster kernel by name, whatever
// RouterGEMM picks, on partial row, column and K tiles, a real K and ranks
// without K steps, against moe.RouterLogits with TestRouterGEMM's
// bound, twice (the bits must repeat).
func TestRouterClusterKernels(t *testing.T) {
	dev := testDevice(t)
	var names []string
	for _, n := range kernels.RouterKernels(dev) {
		if strings.HasPrefix(n, "router_mma_c") {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		t.Skipf("no cluster kernels on %s (Hopper only)", dev)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct{ tok, e, h int }{{300, 264, 520}, {129, 256, 7168}, {37, 7, 64}} {
		xv := fromBF16(toBF16(randn(r, c.tok*c.h, 1)))
		wv := fromBF16(toBF16(randn(r, c.e*c.h, 1/math.Sqrt(float64(c.h)))))
		xm := kernels.BF16Mat(toDevice(t, dev, toBF16(xv)))
		wm := kernels.BF16Mat(toDevice(t, dev, toBF16(wv)))
		want, err := moe.RouterLogits(xv, c.tok, c.h, wv, c.e)
		if err != nil {
			t.Fatal(err)
		}
		bound := make([]float64, len(want))
		for i := range want {
			tok, e := i/c.e, i%c.e
			for k := range c.h {
				bound[i] += 1e-5 * math.Abs(float64(xv[tok*c.h+k])*float64(wv[e*c.h+k]))
			}
		}
		for _, n := range names {
			var first []float32
			for run := range 2 {
				out := poisoned(t, dev, c.tok*c.e)
				if err := dev.Do(func(cx *cuda.Ctx) error {
					return kernels.LaunchRouterKernelCtx(cx, "router_gemm", n, xm, wm, out, c.tok, c.h, c.e)
				}); err != nil {
					t.Fatal(err)
				}
				got := fromDevice(t, out)
				for i := range want {
					if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= bound[i]) {
						t.Fatalf("%s T %d E %d H %d: logit [%d,%d] = %v, want %v (bound %.3g)", n, c.tok, c.e, c.h, i/c.e, i%c.e, got[i], want[i], bound[i])
					}
					if run == 1 && math.Float32bits(got[i]) != math.Float32bits(first[i]) {
						t.Fatalf("%s T %d E %d H %d: second run logit %d = %v, first %v", n, c.tok, c.e, c.h, i, got[i], first[i])
					}
				}
				first = got
			}
		}
		t.Logf("T %d E %d H %d: %d cluster kernels within the bound, deterministic", c.tok, c.e, c.h, len(names))
	}
}

func TestRouterGEMMRejectsBadShapes(t *testing.T) {
	// Shape and dtype checks run before any device call.
	m := kernels.Mat{DType: kernels.MatFP8, Ptr: 256, Len: 100}
	if err := kernels.RouterGEMM(nil, 0, m, m, nil, 2, 10, 5); err == nil {
		t.Fatal("fp8 router input accepted")
	}
	f := kernels.Mat{DType: kernels.MatF32, Ptr: 256, Len: 19}
	if err := kernels.RouterGEMM(nil, 0, f, f, nil, 2, 10, 1); err == nil {
		t.Fatal("x of 19 values accepted for 2x10")
	}
	if err := kernels.RouterGEMM(nil, 0, f, f, nil, 0, 10, 1); err == nil {
		t.Fatal("zero tokens accepted")
	}
}
