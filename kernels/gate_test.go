package kernels_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/moe"
)

// gateVariants are the gate kernels the tests run and time.
func gateVariants() []string {
	return []string{kernels.GateReg, kernels.GateWarp, kernels.GateBlock}
}

// deepSeekV3Gate is DeepSeek-V3's gate with one shared slot over R
// replicas (shared weight 1: rsf folded); kimiK2Gate is Kimi-K2's.
func deepSeekV3Gate(replicas int) kernels.GateSpec {
	return kernels.GateSpec{
		RouteSpec: moe.RouteSpec{Scoring: moe.Sigmoid, NumExperts: 256, TopK: 8, NGroup: 8, TopKGroup: 4, NormTopKProb: true, RoutedScalingFactor: 2.5},
		Shared:    moe.SharedSlots{PerToken: 1, Replicas: replicas, Weight: 1},
	}
}

func kimiK2Gate() kernels.GateSpec {
	return kernels.GateSpec{
		RouteSpec: moe.RouteSpec{Scoring: moe.Sigmoid, NumExperts: 384, TopK: 8, NGroup: 1, TopKGroup: 1, NormTopKProb: true, RoutedScalingFactor: 2.827},
		Shared:    moe.SharedSlots{PerToken: 1, Replicas: 1, Weight: 1},
	}
}

// gateInputs draws t tokens' logits N(0, 4) and a correction bias N(0, 0.01).
func gateInputs(r *rand.Rand, spec kernels.GateSpec, t int) (logits, bias []float32) {
	return randn(r, t*spec.Rows(), 2), randn(r, spec.NumExperts, 0.1)
}

func TestGateSpecCheck(t *testing.T) {
	good := deepSeekV3Gate(1)
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		mut  func(*kernels.GateSpec)
	}{
		{"1025 experts", func(s *kernels.GateSpec) { s.NumExperts = 1025 }},
		{"no experts", func(s *kernels.GateSpec) { s.NumExperts = 0 }},
		{"top-0", func(s *kernels.GateSpec) { s.TopK = 0 }},
		{"7 groups", func(s *kernels.GateSpec) { s.NGroup = 7 }},
		{"topk_group 9 of 8", func(s *kernels.GateSpec) { s.TopKGroup = 9 }},
		{"topk_group 0", func(s *kernels.GateSpec) { s.TopKGroup = 0 }},
		{"top-65 from 2 groups of 32", func(s *kernels.GateSpec) { s.TopK, s.TopKGroup = 65, 2 }},
		{"no routed scaling factor", func(s *kernels.GateSpec) { s.RoutedScalingFactor = 0 }},
		{"shared slots without a replica", func(s *kernels.GateSpec) { s.Shared.Replicas = 0 }},
		{"shared weight NaN", func(s *kernels.GateSpec) { s.Shared.Weight = float32(math.NaN()) }},
		{"shared weight +Inf", func(s *kernels.GateSpec) { s.Shared.Weight = float32(math.Inf(1)) }},
		{"negative shared slots", func(s *kernels.GateSpec) { s.Shared.PerToken = -1 }},
		{"shared ids past int32", func(s *kernels.GateSpec) { s.Shared.Replicas = math.MaxInt32 }},
		{"unknown scoring", func(s *kernels.GateSpec) { s.Scoring = "relu" }},
		{"no scoring", func(s *kernels.GateSpec) { s.Scoring = "" }},
		{"negative shared router rows", func(s *kernels.GateSpec) { s.SharedLogits = -1 }},
		{"shared router rows with softmax", func(s *kernels.GateSpec) { s.Scoring, s.SharedLogits = moe.Softmax, 2 }},
		{"weight scale NaN", func(s *kernels.GateSpec) { s.WeightScale = float32(math.NaN()) }},
		{"weight scale +Inf", func(s *kernels.GateSpec) { s.WeightScale = float32(math.Inf(1)) }},
		{"sparsemixer top-3", func(s *kernels.GateSpec) { s.Scoring, s.TopK, s.NGroup, s.TopKGroup = moe.SparseMixer, 3, 1, 1 }},
		{"sparsemixer with groups", func(s *kernels.GateSpec) { s.Scoring, s.TopK = moe.SparseMixer, 2 }},
		{"sparsemixer eps -1", func(s *kernels.GateSpec) { s.Scoring, s.TopK, s.NGroup, s.JitterEps = moe.SparseMixer, 2, 1, -1 }},
		{"sparsemixer eps past float32", func(s *kernels.GateSpec) { s.Scoring, s.TopK, s.NGroup, s.JitterEps = moe.SparseMixer, 2, 1, 1e39 }},
	} {
		s := good
		c.mut(&s)
		if err := s.Check(); err == nil {
			t.Errorf("%s: %+v accepted", c.name, s)
		}
	}
}

// TestGateKernelFor (CPU): the gate runs the register kernel up to
// GateMaxExperts experts and the block kernel, the only one that takes
// more, past them (Kimi K3's 896).
func TestGateKernelFor(t *testing.T) {
	for _, c := range []struct {
		e    int
		want string
	}{{8, kernels.GateReg}, {384, kernels.GateReg}, {512, kernels.GateReg}, {513, kernels.GateBlock}, {896, kernels.GateBlock}, {1024, kernels.GateBlock}} {
		s := kimiK2Gate()
		s.NumExperts = c.e
		if got := kernels.GateKernelFor(s); got != c.want {
			t.Errorf("%d experts: %s, want %s", c.e, got, c.want)
		}
		if err := s.Check(); err != nil {
			t.Errorf("%d experts refused: %v", c.e, err)
		}
	}
}

// TestGateTiming logs the gate's device time at DeepSeek-V3 and Kimi-K2
// shapes (mean of 50 back-to-back launches; not an assertion).
func TestGateTiming(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(9, 9))
	for _, c := range []struct {
		name string
		spec kernels.GateSpec
	}{{"dsv3", deepSeekV3Gate(8)}, {"kimi", kimiK2Gate()}} {
		for _, tok := range []int{1, 128, 4096} {
			logits, bias := gateInputs(r, c.spec, tok)
			dl, db := toDevice(t, dev, logits), toDevice(t, dev, bias)
			out, err := kernels.NewGateOut(dev, c.spec, tok, false)
			if err != nil {
				t.Fatal(err)
			}
			for _, kernel := range gateVariants() {
				us := rtTimeUs(t, dev, 50, func(cx *cuda.Ctx) error { return kernels.GateKernelCtx(cx, kernel, 0, c.spec, tok, dl, db, out) })
				t.Logf("gate %s %s E=%d T=%d: %.1f us", kernel, c.name, c.spec.NumExperts, tok, us)
			}
			out.Free()
		}
	}
}
