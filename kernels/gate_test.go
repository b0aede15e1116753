package kernels_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate"
)

type gateCase struct {
	name   string
	spec   kernels.GateSpec
	t      int
	bias   bool
	levels int  // >0: logits drawn from this many values, so ties are everywhere
	nans   int  // NaN logits per token
	hash   bool // a hash-routed layer: the experts come from drawn table rows (GateOut.HashIDs)
}

var gateCases = []gateCase{
	{name: "deepseek-v3 T=37 groups 8/4 shared R=8", t: 37, bias: true, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 256, TopK: 8, NGroup: 8, TopKGroup: 4, NormTopKProb: true, SharedSlots: 1, SharedReplicas: 8, SharedWeight: 1}},
	{name: "deepseek-v3 T=1 unfolded 1/rsf", t: 1, bias: true, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 256, TopK: 8, NGroup: 8, TopKGroup: 4, NormTopKProb: true, SharedSlots: 1, SharedReplicas: 1, SharedWeight: float32(1 / 2.5)}},
	{name: "kimi-k2 384 experts n_group 1 T=300", t: 300, bias: true, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 384, TopK: 8, NGroup: 1, TopKGroup: 1, NormTopKProb: true, SharedSlots: 1, SharedReplicas: 1, SharedWeight: 1}},
	{name: "kimi-k2 384 experts T=1", t: 1, bias: true, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 384, TopK: 8, NGroup: 1, TopKGroup: 1, NormTopKProb: true}},
	{name: "264 experts groups 8/3", t: 129, bias: true, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 264, TopK: 8, NGroup: 8, TopKGroup: 3, NormTopKProb: true, SharedSlots: 2, SharedReplicas: 3, SharedWeight: 0.4}},
	{name: "512 experts top-16 groups 16/5 no renorm", t: 65, bias: true, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 512, TopK: 16, NGroup: 16, TopKGroup: 5}},
	{name: "sigmoid no bias, groups = topk_group (no masking)", t: 17, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 96, TopK: 6, NGroup: 4, TopKGroup: 4, NormTopKProb: true}},
	{name: "ties: 3 logit levels, groups 8/4", t: 50, levels: 3, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 256, TopK: 8, NGroup: 8, TopKGroup: 4, NormTopKProb: true, SharedSlots: 1, SharedReplicas: 2, SharedWeight: 1}},
	{name: "ties: all logits equal", t: 5, levels: 1, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 384, TopK: 8, NGroup: 8, TopKGroup: 2, NormTopKProb: true}},
	{name: "ties with bias levels", t: 40, bias: true, levels: 2, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 264, TopK: 8, NGroup: 1, NormTopKProb: true}},
	{name: "NaN logits rank last", t: 20, bias: true, nans: 5, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 256, TopK: 8, NGroup: 8, TopKGroup: 4, NormTopKProb: true}},
	{name: "group size 1 (one expert per group)", t: 9, bias: true, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 16, TopK: 4, NGroup: 16, TopKGroup: 6, NormTopKProb: true}},
	{name: "qwen2-moe softmax 60 experts top-4 no renorm", t: 33, spec: kernels.GateSpec{Scoring: kernels.Softmax, NumExperts: 60, TopK: 4}},
	{name: "qwen3-moe softmax 128 top-8 renorm T=1", t: 1, spec: kernels.GateSpec{Scoring: kernels.Softmax, NumExperts: 128, TopK: 8, NormTopKProb: true}},
	{name: "mixtral softmax 8 top-2", t: 300, spec: kernels.GateSpec{Scoring: kernels.Softmax, NumExperts: 8, TopK: 2, NormTopKProb: true}},
	{name: "deepseek-v2 softmax group max 160 groups 8/3 shared S=2 R=2", t: 70, spec: kernels.GateSpec{Scoring: kernels.Softmax, NumExperts: 160, TopK: 6, NGroup: 8, TopKGroup: 3, GroupByMax: true, SharedSlots: 2, SharedReplicas: 2, SharedWeight: float32(1 / 16.0)}},
	{name: "softmax ties: 4 levels, 384 experts", t: 31, levels: 4, spec: kernels.GateSpec{Scoring: kernels.Softmax, NumExperts: 384, TopK: 8, NormTopKProb: true}},
	{name: "ernie-4.5 softmax + correction bias 64 top-6 shared", t: 45, bias: true, spec: kernels.GateSpec{Scoring: kernels.Softmax, NumExperts: 64, TopK: 6, NormTopKProb: true, SharedSlots: 2, SharedReplicas: 1, SharedWeight: 1}},
	{name: "deepseek-v4 sqrtsoftplus + bias 256 top-6 shared R=8", t: 77, bias: true, spec: kernels.GateSpec{Scoring: kernels.SqrtSoftplus, NumExperts: 256, TopK: 6, NormTopKProb: true, SharedSlots: 1, SharedReplicas: 8, SharedWeight: float32(1 / 1.5)}},
	{name: "sqrtsoftplus ties: 3 levels, 384 experts", t: 21, levels: 3, bias: true, spec: kernels.GateSpec{Scoring: kernels.SqrtSoftplus, NumExperts: 384, TopK: 8, NormTopKProb: true}},
	{name: "sqrtsoftplus NaN ranks last", t: 9, bias: true, nans: 4, spec: kernels.GateSpec{Scoring: kernels.SqrtSoftplus, NumExperts: 64, TopK: 6, NormTopKProb: true}},
	{name: "softmax NaN poisons the row (as the twin)", t: 3, nans: 1, spec: kernels.GateSpec{Scoring: kernels.Softmax, NumExperts: 64, TopK: 4, NormTopKProb: true}},
	// Inkling: 2 shared router rows in one normalisation with the top-k, global_scale.
	{name: "inkling 256 + 2 shared rows, bias, global_scale 0.75", t: 61, bias: true, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 256, TopK: 6, SharedLogits: 2, WeightScale: 0.75}},
	{name: "inkling ties: 3 levels, 8 + 2 rows, global_scale 1.25", t: 19, levels: 3, bias: true, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 8, TopK: 2, SharedLogits: 2, WeightScale: 1.25}},
	{name: "inkling NaN ranks last, 64 + 3 rows", t: 9, bias: true, nans: 3, spec: kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 64, TopK: 4, SharedLogits: 3}},
	// DeepSeek-V4 hash layers: the table's experts weighted by their scores.
	{name: "deepseek-v4 hash layer 256 top-6 shared R=4", t: 33, hash: true, spec: kernels.GateSpec{Scoring: kernels.SqrtSoftplus, NumExperts: 256, TopK: 6, NormTopKProb: true, SharedSlots: 1, SharedReplicas: 4, SharedWeight: float32(1 / 1.5)}},
	{name: "hash layer, rows naming an expert twice, ties", t: 7, hash: true, levels: 2, spec: kernels.GateSpec{Scoring: kernels.SqrtSoftplus, NumExperts: 16, TopK: 4, NormTopKProb: true}},
	// Phi-3.5-MoE's sparsemixer top-2.
	{name: "phimoe sparsemixer 16 experts eps 0.3", t: 50, spec: kernels.GateSpec{Scoring: kernels.SparseMixer, NumExperts: 16, TopK: 2, JitterEps: 0.3}},
	{name: "sparsemixer eps 0.01 64 experts shared R=2", t: 33, spec: kernels.GateSpec{Scoring: kernels.SparseMixer, NumExperts: 64, TopK: 2, JitterEps: 0.01, SharedSlots: 1, SharedReplicas: 2, SharedWeight: 1}},
	{name: "sparsemixer eps 0 (only exact ties join)", t: 17, levels: 4, spec: kernels.GateSpec{Scoring: kernels.SparseMixer, NumExperts: 32, TopK: 2}},
	{name: "sparsemixer ties: 3 levels, 384 experts", t: 11, levels: 3, spec: kernels.GateSpec{Scoring: kernels.SparseMixer, NumExperts: 384, TopK: 2, JitterEps: 0.1}},
	{name: "sparsemixer NaN poisons the weights (as the twin)", t: 5, nans: 1, spec: kernels.GateSpec{Scoring: kernels.SparseMixer, NumExperts: 16, TopK: 2, JitterEps: 0.3}},
}

func routeSpec(s kernels.GateSpec) validate.RouteSpec {
	sc := family.Sigmoid
	switch s.Scoring {
	case kernels.Softmax:
		sc = family.Softmax
	case kernels.SqrtSoftplus:
		sc = family.SqrtSoftplus
	case kernels.SparseMixer:
		sc = family.SparseMixer
	}
	r := validate.RouteSpec{Scoring: sc, NumExperts: s.NumExperts, TopK: s.TopK, NGroup: s.NGroup, TopKGroup: s.TopKGroup,
		NormTopKProb: s.NormTopKProb, GroupByMax: s.GroupByMax, RoutedScalingFactor: 2.5, SharedLogits: s.SharedLogits, JitterEps: float64(s.JitterEps)}
	if r.NGroup < 1 {
		r.NGroup, r.TopKGroup = 1, 1
	}
	return r
}

func contractFor(s kernels.GateSpec) *layout.Contract {
	c := &layout.Contract{Version: layout.ContractVersion, Layout: layout.Stacked, NumExperts: s.NumExperts,
		SharedSlotWeight: 1, RoutedScalingFactor: 2.5, RoutedScalingFactorFolded: true}
	if s.SharedSlots > 0 {
		c.NumFusedSharedExperts = s.SharedSlots * s.SharedReplicas
		c.SharedReplicas, c.SharedSlices, c.SharedFirstID = s.SharedReplicas, s.SharedSlots, s.NumExperts
		c.SharedSlotWeight = float64(s.SharedWeight)
	}
	return c
}

func gateInputs(r *rand.Rand, c gateCase) (logits, bias []float32) {
	e := c.spec.Rows()
	logits = make([]float32, c.t*e)
	for i := range logits {
		if c.levels > 0 {
			logits[i] = float32(r.IntN(c.levels)) - 1
		} else {
			logits[i] = float32(r.NormFloat64() * 2)
		}
	}
	for tok := range c.t {
		for range c.nans {
			logits[tok*e+r.IntN(e)] = float32(math.NaN())
		}
	}
	if c.bias {
		bias = make([]float32, c.spec.NumExperts) // the routed experts only: shared router rows have none
		for i := range bias {
			if c.levels > 0 {
				bias[i] = float32(r.IntN(c.levels)) * 0.25
			} else {
				bias[i] = float32(r.NormFloat64() * 0.1)
			}
		}
	}
	return logits, bias
}

func sameFloat(a, b float32, rtol float64) bool {
	if a != a || b != b {
		return a != a && b != b
	}
	return math.Abs(float64(a)-float64(b)) <= rtol*math.Abs(float64(b))+1e-30
}

// gateVariants are the gate kernels the tests run and time.
func gateVariants() []string {
	return []string{kernels.GateReg, kernels.GateWarp, kernels.GateBlock}
}

// TestGateMatchesCPU runs the fused gate against validate.Route +
// validate.FusedSlots: ids exactly (ties to the lower index included),
// weights within rtol 1e-5, and the ranked scores.
func TestGateMatchesCPU(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(5, 55))
	for _, kernel := range gateVariants() {
		for _, c := range gateCases {
			if kernel != kernels.GateReg && ((c.bias && c.spec.Scoring == kernels.Softmax) || c.hash || c.spec.SharedLogits > 0 || c.spec.WeightScale != 0 || c.spec.Scoring == kernels.SparseMixer) {
				continue // softmax + bias (ERNIE 4.5), hash ids, shared router rows, a weight scale and sparsemixer are the register gate's alone
			}
			t.Run(kernel+"/"+c.name, func(t *testing.T) {
				logits, bias := gateInputs(r, c)
				var hashIDs []int32
				var routing *validate.Routing
				var err error
				if c.hash {
					hashIDs = make([]int32, c.t*c.spec.TopK)
					for i := range hashIDs {
						hashIDs[i] = int32(r.IntN(c.spec.NumExperts))
					}
					routing, err = validate.RouteHashed(routeSpec(c.spec), logits, hashIDs, c.t)
				} else {
					routing, err = validate.Route(routeSpec(c.spec), logits, bias, c.t)
				}
				if err != nil {
					t.Fatal(err)
				}
				if s := c.spec.WeightScale; s != 0 { // the twin's router scale (validate.routeLogits): one f32 multiply
					for i := range routing.Weights {
						routing.Weights[i] *= s
					}
					for i := range routing.Shared {
						routing.Shared[i] *= s
					}
				}
				want, err := validate.FusedSlots(routing, contractFor(c.spec))
				if err != nil {
					t.Fatal(err)
				}
				dl := toDevice(t, dev, logits)
				var db *cuda.Buffer[float32]
				if bias != nil {
					db = toDevice(t, dev, bias)
				}
				out, err := kernels.NewGateOut(dev, c.spec, c.t, true)
				if err != nil {
					t.Fatal(err)
				}
				defer out.Free()
				if hashIDs != nil {
					out.HashIDs = toDevice(t, dev, hashIDs)
				}
				// Poison the outputs so an unwritten slot cannot pass.
				if err := out.IDs.Fill(-7); err != nil {
					t.Fatal(err)
				}
				if err := out.Weights.Fill(float32(math.NaN())); err != nil {
					t.Fatal(err)
				}
				err = dev.Do(func(cx *cuda.Ctx) error { return kernels.GateKernelCtx(cx, kernel, 0, c.spec, c.t, dl, db, out) })
				if err != nil {
					t.Fatal(err)
				}
				ids, w, choice := fromDevice(t, out.IDs), fromDevice(t, out.Weights), fromDevice(t, out.Choice)
				if want.K != out.K {
					t.Fatalf("K %d, twin %d", out.K, want.K)
				}
				bad := 0
				for i := range want.IDs {
					if ids[i] != want.IDs[i] || !sameFloat(w[i], want.Weights[i], 1e-5) {
						if bad < 5 {
							t.Errorf("token %d slot %d: id %d weight %g, twin id %d weight %g", i/want.K, i%want.K, ids[i], w[i], want.IDs[i], want.Weights[i])
						}
						bad++
					}
				}
				for i := range routing.Choice {
					if !sameFloat(choice[i], routing.Choice[i], 1e-6) {
						t.Fatalf("score %d: %g, twin %g", i, choice[i], routing.Choice[i])
					}
				}
				if bad > 0 {
					t.Fatalf("%d of %d slots differ", bad, len(want.IDs))
				}
				if c.spec.SharedLogits > 0 {
					shared := fromDevice(t, out.Shared)
					if len(routing.Shared) != c.t*c.spec.SharedLogits {
						t.Fatalf("twin has %d shared weights", len(routing.Shared))
					}
					for i, v := range routing.Shared {
						if !sameFloat(shared[i], v, 1e-6) {
							t.Fatalf("token %d shared %d: %g, twin %g", i/c.spec.SharedLogits, i%c.spec.SharedLogits, shared[i], v)
						}
					}
				}
			})
		}
	}
}

func TestGateSpecCheck(t *testing.T) {
	good := kernels.GateSpec{Scoring: kernels.Sigmoid, NumExperts: 256, TopK: 8, NGroup: 8, TopKGroup: 4, SharedSlots: 1, SharedReplicas: 1, SharedWeight: 1}
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}
	for i, mut := range []func(*kernels.GateSpec){
		func(s *kernels.GateSpec) { s.NumExperts = 513 },
		func(s *kernels.GateSpec) { s.NumExperts = 0 },
		func(s *kernels.GateSpec) { s.TopK = 0 },
		func(s *kernels.GateSpec) { s.NGroup = 7 },
		func(s *kernels.GateSpec) { s.TopKGroup = 9 },
		func(s *kernels.GateSpec) { s.TopKGroup = 0 },
		func(s *kernels.GateSpec) { s.TopK, s.TopKGroup = 65, 2 },
		func(s *kernels.GateSpec) { s.SharedReplicas = 0 },
		func(s *kernels.GateSpec) { s.SharedWeight = float32(math.NaN()) },
		func(s *kernels.GateSpec) { s.Scoring = 7 },
		func(s *kernels.GateSpec) { s.SharedLogits = -1 },
		func(s *kernels.GateSpec) { s.Scoring, s.SharedLogits = kernels.Softmax, 2 },
		func(s *kernels.GateSpec) { s.WeightScale = float32(math.NaN()) },
		func(s *kernels.GateSpec) { s.WeightScale = float32(math.Inf(1)) },
		func(s *kernels.GateSpec) { s.Scoring, s.TopK, s.NGroup, s.TopKGroup = kernels.SparseMixer, 3, 1, 1 },
		func(s *kernels.GateSpec) { s.Scoring, s.NGroup = kernels.SparseMixer, 8 },
		func(s *kernels.GateSpec) { s.Scoring, s.TopK, s.NGroup, s.JitterEps = kernels.SparseMixer, 2, 1, -1 },
	} {
		s := good
		mut(&s)
		if err := s.Check(); err == nil {
			t.Errorf("mutation %d: %+v accepted", i, s)
		}
	}
}

// TestGateTiming logs the gate's device time at DeepSeek-V3 and Kimi-K2
// shapes (mean of 50 back-to-back launches; not an assertion).
func TestGateTiming(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(9, 9))
	for _, c := range []gateCase{
		{name: "dsv3", bias: true, spec: gateCases[0].spec},
		{name: "kimi", bias: true, spec: gateCases[2].spec},
	} {
		for _, tok := range []int{1, 128, 4096} {
			c.t = tok
			logits, bias := gateInputs(r, c)
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
