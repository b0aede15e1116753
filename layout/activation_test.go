package layout

import (
	"math"
	"testing"
)

func TestActivationApply(t *testing.T) {
	sig := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
	oai := Activation{Alpha: 1.702, Limit: 7, UpOffset: 1}
	for _, c := range []struct {
		name string
		a    Activation
		g, u float64
		want float64
	}{
		{"swiglu zero value", Activation{}, 1.5, -2, 1.5 * sig(1.5) * -2},
		{"swiglu alpha 1", Activation{Alpha: 1}, -0.5, 3, -0.5 * sig(-0.5) * 3},
		{"gpt-oss inside the limit", oai, 2, 0.5, 2 * sig(1.702*2) * 1.5},
		{"gpt-oss gate clamped from above", oai, 9, 0.5, 7 * sig(1.702*7) * 1.5},
		{"gpt-oss gate not clamped from below", oai, -9, 0.5, -9 * sig(1.702*-9) * 1.5},
		{"gpt-oss up clamped both ways", oai, 1, -12, 1 * sig(1.702) * (-7 + 1)},
		{"gpt-oss up clamped above", oai, 1, 12, 1 * sig(1.702) * 8},
		{"deepseek-v4 style limit only", Activation{Limit: 10}, 11, 11, 10 * sig(10) * 10},
	} {
		if got := c.a.Apply(c.g, c.u); math.Abs(got-c.want) > 1e-12*math.Max(1, math.Abs(c.want)) {
			t.Errorf("%s: Apply(%v, %v) = %v, want %v", c.name, c.g, c.u, got, c.want)
		}
	}
	if !(Activation{}).SwiGLU() || !(Activation{Alpha: 1}).SwiGLU() || oai.SwiGLU() || (Activation{Limit: 10}).SwiGLU() {
		t.Error("SwiGLU() misclassifies")
	}
	for _, bad := range []Activation{{Alpha: -1}, {Limit: -2}, {UpOffset: math.NaN()}, {Alpha: math.Inf(1)}} {
		if bad.Check() == nil {
			t.Errorf("Check(%+v) = nil", bad)
		}
	}
	if oai.Check() != nil {
		t.Error("gpt-oss activation refused")
	}
}
