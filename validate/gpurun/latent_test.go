package gpurun

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/internal/testkit/gputest"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/moelayer"
)

// TestLatentOnDevice: a latent MoE's projections on the router GEMM's f32
// kernel (latentIn, latentOut) are moelayer.Latent's float64 host
// arithmetic within float32 sums' rounding; the bank's input is the
// latent of the routed tokens followed by the forced rows as they are, and
// its router reads x, H wide; an input of the wrong width is refused.
func TestLatentOnDevice(t *testing.T) {
	gputest.Need(t)
	ck, plan := cktest.OpenPlanned(t, cktest.WritePreset(t, "small-kimi-k3"))
	lt, err := moelayer.LatentOf(plan, &plan.Layers[0])
	if err != nil || lt == nil {
		t.Fatalf("no latent MoE planned: %v", err)
	}
	g, err := Open(PrecisionBF16)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var fr Frees
	defer fr.Release(g)
	r := rand.New(rand.NewPCG(44, 3))
	draw := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		return v
	}
	tok, forced := 37, 3
	x := draw(tok * lt.H)
	xin, err := g.Input(x, tok, lt.H, &fr)
	if err != nil {
		t.Fatal(err)
	}
	cov := &moelayer.Coverage{T: forced, X: draw(forced * lt.L)}
	in, err := g.latentIn(ck, lt, xin, cov, &fr)
	if err != nil {
		t.Fatal(err)
	}
	if in.t != tok+forced || in.h != lt.L || in.routerH() != lt.H || in.routerX() != xin.x32 {
		t.Fatalf("bank input %d x %d routed on %d wide (x's buffer: %v), want %d x %d on %d", in.t, in.h, in.routerH(), in.routerX() == xin.x32, tok+forced, lt.L, lt.H)
	}
	got, err := in.x32.ToHost(in.t * lt.L)
	if err != nil {
		t.Fatal(err)
	}
	want, err := lt.In(ck, x, tok)
	if err != nil {
		t.Fatal(err)
	}
	closeTo(t, "down projection", got[:tok*lt.L], want, 1e-6)
	for i, v := range cov.X {
		if got[tok*lt.L+i] != v {
			t.Fatalf("forced value %d: %v, want %v as given", i, got[tok*lt.L+i], v)
		}
	}
	n := 11
	y := draw(n * lt.L)
	yd, err := toDevice(g, y, &fr)
	if err != nil {
		t.Fatal(err)
	}
	out, err := g.latentOut(ck, lt, yd, n, &fr)
	if err != nil {
		t.Fatal(err)
	}
	if got, err = out.ToHost(n * lt.H); err != nil {
		t.Fatal(err)
	}
	if want, err = lt.Out(ck, y, n); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "norm and up projection", got, want, 1e-6)
	if _, err := g.latentIn(ck, lt, in, nil, &fr); err == nil || !strings.Contains(err.Error(), "latent down projection: x is") {
		t.Errorf("a latent-wide input as x: %v", err)
	}
}

// closeTo fails t unless got is want within rel L2 tol (judge.Compare:
// a reference of zeros or a non-finite value fails too).
func closeTo(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	d := judge.Compare(got, want)
	if d.Problem != "" || !(d.RelL2 <= tol) {
		t.Fatalf("%s: rel L2 %.3g against the host's float64 %s, want <= %g", what, d.RelL2, d.Problem, tol)
	}
	t.Logf("%s: rel L2 %.3g, max abs %.3g against the host's float64", what, d.RelL2, d.MaxAbs)
}
