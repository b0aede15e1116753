package kernels_test

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/moe"
)

// TestFinalizeMatchesTwin: the kernel multiplies and adds separately in
// slot order, as moe.Finalize does, so on amd64 (where Go never fuses
// a*b+c) the results are bit-identical; elsewhere within 1e-6 relative.
// (TestFinalizeConforms holds it to the float64 sum.)
func TestFinalizeMatchesTwin(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct {
		tok, k, h int
		scale     float32
	}{{1, 9, 160, 2.5}, {37, 9, 160, 1}, {5, 1, 7168, 2.827}, {70, 3, 33, 1}, {16, 9, 7168, 2.5}, {3, 20, 1000, 1}} {
		out := randn(r, c.tok*c.k*c.h, 1)
		w := randn(r, c.tok*c.k, 0.3)
		y := poisoned(t, dev, c.tok*c.h)
		err := kernels.Finalize(dev, 0, toDevice(t, dev, out), toDevice(t, dev, w), y, c.tok, c.k, c.h, c.scale)
		if err != nil {
			t.Fatal(err)
		}
		got := fromDevice(t, y)
		want, err := moe.Finalize(out, c.tok, c.k, c.h, w, c.scale)
		if err != nil {
			t.Fatal(err)
		}
		checkClose(t, "finalize", got, want)
	}
}

// TestAddRows checks the unfused path's shared-expert add with and without
// a sigmoid gate against the same arithmetic on the CPU.
func TestAddRows(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(5, 6))
	const tok, h = 37, 160
	for _, gated := range []bool{false, true} {
		y0 := randn(r, tok*h, 1)
		o := randn(r, tok*h, 1)
		logit := randn(r, tok, 2)
		yb := toDevice(t, dev, y0)
		var gb = toDevice(t, dev, logit)
		if !gated {
			gb = nil
		}
		if err := kernels.AddRows(dev, 0, yb, toDevice(t, dev, o), gb, tok, h); err != nil {
			t.Fatal(err)
		}
		got := fromDevice(t, yb)
		want := make([]float32, tok*h)
		for i := range want {
			f := float32(1)
			if gated {
				f = float32(1 / (1 + math.Exp(-float64(logit[i/h]))))
			}
			want[i] = y0[i] + f*o[i]
		}
		checkClose(t, "add rows", got, want)
	}
}

// checkClose demands bit equality on amd64 and 1e-6 relative elsewhere.
func checkClose(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if got[i] == want[i] {
			continue
		}
		if runtime.GOARCH == "amd64" || !(math.Abs(float64(got[i]-want[i])) <= 1e-6*math.Abs(float64(want[i]))) {
			t.Fatalf("%s: element %d = %v, want %v", what, i, got[i], want[i])
		}
	}
}
