package moelayer

import (
	"math"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit/cktest"
)

// vecSource is an in-memory TensorSource of F32 vectors.
func vecSource(vs map[string][]float32) cktest.Mem {
	m := cktest.Mem{}
	for name, vals := range vs {
		m.PutF32(name, []int64{int64(len(vals))}, vals...)
	}
	return m
}

// TestInputPrep: Gemma 4's two inputs as Gemma4RMSNorm computes them, on
// a hand-checked row; and a norm weight that is not finite, a missing
// half, a bad epsilon are errors naming what is wrong.
func TestInputPrep(t *testing.T) {
	src := vecSource(map[string][]float32{"rs": {2, 4}, "en": {0.5, -1}, "nan": {1, float32(math.NaN())}})
	p := InputPrep{RouterScale: "rs", ExpertNorm: "en", Eps: 1e-6}
	x := []float32{3, 4} // mean square 12.5
	xe, xr, err := p.Inputs(src, x, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	inv := float32(1 / math.Sqrt(float64(float32(12.5)+float32(1e-6))))
	n := []float32{3 * inv, 4 * inv}
	root := float32(math.Pow(2, -0.5))
	if want := []float32{n[0] * 0.5, n[1] * -1}; xe[0] != want[0] || xe[1] != want[1] {
		t.Errorf("experts' input %v, want %v", xe, want)
	}
	if want := []float32{n[0] * 2 * root, n[1] * 4 * root}; xr[0] != want[0] || xr[1] != want[1] {
		t.Errorf("router's input %v, want %v", xr, want)
	}
	if xe, xr, err := (InputPrep{}).Inputs(src, x, 1, 2); err != nil || &xe[0] != &x[0] || xr != nil {
		t.Errorf("no prep: %v %v %v", xe, xr, err)
	}
	for _, c := range []struct {
		p    InputPrep
		want string
	}{
		{InputPrep{RouterScale: "nan", ExpertNorm: "en", Eps: 1e-6}, "mem: tensor nan holds a NaN or Inf at element 1"},
		{InputPrep{RouterScale: "rs", Eps: 1e-6}, "needs both"},
		{InputPrep{RouterScale: "rs", ExpertNorm: "en", Eps: -1}, "epsilon -1"},
		{InputPrep{RouterScale: "rs", ExpertNorm: "missing", Eps: 1e-6}, "missing"},
	} {
		if _, _, err := c.p.Inputs(src, x, 1, 2); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one naming %q", c.p, err, c.want)
		}
	}
}
