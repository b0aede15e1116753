package layout

import (
	"math"
	"strings"
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
		// Step-3.7: the limit caps silu(g), so silu(2) = 1.76 becomes 1,
		// where clamping g first would give silu(1) = 0.73.
		{"step-3.7 activated gate capped", ClampedAfter(1), 2, 0.5, 1 * 0.5},
		{"step-3.7 under the cap", ClampedAfter(1), 0.5, 3, 0.5 * sig(0.5) * 1},
		{"step-3.7 negative gate untouched", ClampedAfter(1), -4, -0.5, -4 * sig(-4) * -0.5},
		{"step-3.7 limit 0 is swiglu", ClampedAfter(0), 2, 3, 2 * sig(2) * 3},
		// Gemma 4: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u; gelu_tanh(1) = 0.8411919906082768
		{"gemma-4 geglu", GeGLUTanh(), 1, -2, 0.8411919906082768 * -2},
		{"gemma-4 geglu negative gate", GeGLUTanh(), -1, 3, -0.15880800939172324 * 3},
		// Nemotron-H: relu(u)^2, the gate argument unread
		{"nemotron-h relu2", ReLU2(), 5, 1.5, 2.25},
		{"nemotron-h relu2 negative up", ReLU2(), 5, -1.5, 0},
	} {
		if got := c.a.Apply(c.g, c.u); math.Abs(got-c.want) > 1e-12*math.Max(1, math.Abs(c.want)) {
			t.Errorf("%s: Apply(%v, %v) = %v, want %v", c.name, c.g, c.u, got, c.want)
		}
	}
	for _, bad := range []Activation{{Gate: "relu"}, {Gate: GateGeluTanh, Limit: 7}, {Gate: GateGeluTanh, Alpha: 1.702},
		{Gate: GateNoneReLU2, Limit: 7}, {Gate: GateNoneReLU2, UpOffset: 1}} {
		if bad.Check() == nil {
			t.Errorf("Check accepts %+v", bad)
		}
	}
	if GeGLUTanh().Check() != nil || GeGLUTanh().SwiGLU() || GeGLUTanh().Describe() != "GeGLU (tanh gelu)" {
		t.Errorf("GeGLU: check %v, SwiGLU %v, %q", GeGLUTanh().Check(), GeGLUTanh().SwiGLU(), GeGLUTanh().Describe())
	}
	if ReLU2().Check() != nil || ReLU2().SwiGLU() || !ReLU2().Ungated() || GeGLUTanh().Ungated() || (Activation{}).Ungated() || ReLU2().Describe() != "relu2, relu(up)^2" {
		t.Errorf("relu2: check %v, SwiGLU %v, ungated %v, %q", ReLU2().Check(), ReLU2().SwiGLU(), ReLU2().Ungated(), ReLU2().Describe())
	}
	// the contract: ungated experts are stacked all_up and all_down, no
	// all_gate, and a gate-up layout or expert biases with them are refused
	c := &Contract{Version: ContractVersion, Layout: Stacked, NumExperts: 4, SharedSlotWeight: 1, OutputScale: 1, WeightDType: "BF16",
		Quantization: "none", Activation: &Activation{Gate: GateNoneReLU2}, Layers: []LayerInfo{{Index: 1, Prefix: "backbone.layers.1.mixer"}}}
	if err := c.Check(); err != nil {
		t.Fatalf("ungated contract: %v", err)
	}
	if n := c.Names(c.Layers[0]); n.Weight(ProjGate) != "" || n.Weight(ProjUp) != "backbone.layers.1.mixer.experts.all_up.weight" || n.Weight(ProjDown) == "" {
		t.Errorf("ungated names: %+v", n)
	}
	for _, bad := range []func(*Contract){func(c *Contract) { c.Layout = GateUp }, func(c *Contract) { c.Layout = UpGate }, func(c *Contract) { c.ExpertBias = true }} {
		b := *c
		bad(&b)
		if err := b.Check(); err == nil || !strings.Contains(err.Error(), "ungated") {
			t.Errorf("ungated contract %s bias %v: %v", b.Layout, b.ExpertBias, err)
		}
	}
	if !(Activation{}).SwiGLU() || !(Activation{Alpha: 1}).SwiGLU() || oai.SwiGLU() || (Activation{Limit: 10}).SwiGLU() {
		t.Error("SwiGLU() misclassifies")
	}
	if ClampedAfter(0) != (Activation{}) || ClampedAfter(7).SwiGLU() {
		t.Error("ClampedAfter(0) must be SwiGLU and ClampedAfter(7) not")
	}
	for _, bad := range []Activation{{Alpha: -1}, {Limit: -2}, {UpOffset: math.NaN()}, {Alpha: math.Inf(1)}, {ClampAfter: true}} {
		if bad.Check() == nil {
			t.Errorf("Check(%+v) = nil", bad)
		}
	}
	if oai.Check() != nil {
		t.Error("gpt-oss activation refused")
	}
}

// TestSiTUActivation: SiTU applies moe.SiTU with its betas, says so, and
// refuses betas no config could mean and SwiGLU's knobs beside it.
func TestSiTUActivation(t *testing.T) {
	a := SiTU(4, 25)
	if got, want := a.Apply(1, 2), 1.4293511315552199; got < want-1e-12 || got > want+1e-12 {
		t.Errorf("Apply(1, 2) = %.17g, want %.17g", got, want)
	}
	if err := a.Check(); err != nil || a.Describe() != "SiTU (beta 4, linear beta 25)" || a.SwiGLU() {
		t.Errorf("check %v, describe %q, SwiGLU %v", err, a.Describe(), a.SwiGLU())
	}
	for _, bad := range []Activation{
		{Gate: GateSiTU}, // beta 0
		{Gate: GateSiTU, Beta: 4, LinearBeta: -1}, // negative linear beta
		{Gate: GateSiTU, Beta: 4, Limit: 7},       // a SwiGLU knob
		{Beta: 4},                                 // a beta without SiTU
	} {
		if err := bad.Check(); err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
}
