package validate

import (
	"context"
	"fmt"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/moelayer"
)

// runBoth runs the reference on m's source and the fused path on dst.
func runBoth(t *testing.T, m *memModel, dst cktest.Mem, fl *moelayer.FusedLayer, tokens, block int) (*moelayer.RefResult, *moelayer.FusedResult, judge.Diff) {
	t.Helper()
	x := DrawX(11, m.layerIndex, tokens, m.H)
	ref, err := cpuref.ReferenceLayer(context.Background(), m.src, m.plan, &m.plan.Layers[0], x, tokens, cpuref.RefOptions{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	fused, err := cpuref.FusedLayerRun(context.Background(), dst, fl, x, tokens, cpuref.FusedOptions{BlockSize: block, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	return ref, fused, judge.Compare(fused.Y, ref.Y)
}

// TestFusedMatchesReference: the two independent paths agree to float32
// rounding on every layout, dtype, replica count, slice count and fold mode.
func TestFusedMatchesReference(t *testing.T) {
	type variant struct {
		fp8      bool
		s, r     int
		lay      layout.Layout
		fuse     bool
		fold     bool
		tokens   int
		block    int
		softmax  bool
		gated    bool
		experts  int
		topk     int
		tol      judge.Tolerance
		hiddenSz int
	}
	vs := []variant{
		{lay: layout.Stacked, s: 1, r: 1, fuse: true, tokens: 37, block: 16},
		{lay: layout.GateUp, s: 1, r: 4, fuse: true, tokens: 37, block: 64},
		{lay: layout.UpGate, s: 2, r: 2, fuse: true, tokens: 20, block: 1},
		{lay: layout.Stacked, s: 1, r: 8, fuse: true, tokens: 1, block: 64},
		{lay: layout.Stacked, s: 1, fuse: false, tokens: 33, block: 8},
		{lay: layout.Stacked, s: 1, r: 2, fuse: true, fold: true, tokens: 33, block: 8, tol: judge.TolBF16Fold},
		{fp8: true, lay: layout.Stacked, s: 1, r: 1, fuse: true, fold: true, tokens: 30, block: 16},
		{fp8: true, lay: layout.GateUp, s: 2, r: 2, fuse: true, fold: true, tokens: 17, block: 4},
		{fp8: true, lay: layout.UpGate, s: 1, r: 3, fuse: true, tokens: 17, block: 64},
		{fp8: true, lay: layout.Stacked, s: 1, fuse: false, tokens: 9, block: 64},
		{softmax: true, gated: true, s: 1, lay: layout.GateUp, tokens: 25, block: 16},
		{softmax: true, lay: layout.Stacked, tokens: 25, block: 16},
		{lay: layout.GateUp, s: 1, r: 8, fuse: true, tokens: 40, block: 16, experts: 264, topk: 8, hiddenSz: 64},
	}
	for i, v := range vs {
		name := fmt.Sprintf("%d-%s-fp8=%v-S%d-R%d-fuse=%v-fold=%v-T%d-B%d", i, v.lay, v.fp8, v.s, v.r, v.fuse, v.fold, v.tokens, v.block)
		t.Run(name, func(t *testing.T) {
			mm := memModel{H: 160, I: 128, E: 16, S: v.s, K: 4, NGroup: 4, TopKGroup: 2, RSF: 2.5, FP8: v.fp8,
				Softmax: v.softmax, SharedGated: v.gated}
			if v.softmax {
				mm.RSF, mm.NGroup, mm.TopKGroup = 1, 1, 1
			}
			if v.experts != 0 {
				mm.E, mm.K, mm.H = v.experts, v.topk, v.hiddenSz
			}
			if !v.fp8 {
				mm.I = 48 // not a multiple of anything in particular
			}
			m := newMemModel(uint64(i+1), mm)
			dst, _, fl := m.convert(convertOpts{layout: v.lay, fuse: v.fuse, replicas: v.r, fold: v.fold})
			ref, fused, d := runBoth(t, m, dst, fl, v.tokens, v.block)
			tol := v.tol
			if tol.Name == "" {
				tol = judge.TolFP32
			}
			if why := tol.Verdict(d); why != "" {
				t.Fatalf("%s: %s", tol.Name, why)
			}
			if tol == judge.TolBF16Fold && d.RelL2 < 1e-5 {
				t.Errorf("bf16 folding changed nothing (rel_l2 %.3g): the fold did not happen", d.RelL2)
			}
			ok, total, err := moe.TopKAgreement(fused.Routing.IDs, ref.Routing.IDs, v.tokens, m.K, ref.Routing.Choice, m.E, moe.TieTolerance)
			if err != nil || ok != total {
				t.Fatalf("routing agreement %d/%d %v", ok, total, err)
			}
			// Shared slots as the contract says.
			if v.fuse {
				k := fused.Slots.K
				for tok := range v.tokens {
					for s := range v.s {
						want := int32(m.E + (tok%v.r)*v.s + s)
						if got := fused.Slots.IDs[tok*k+m.K+s]; got != want {
							t.Fatalf("token %d shared slot %d -> %d, want %d", tok, s, got, want)
						}
					}
				}
			}
			t.Logf("rel_l2 %.3g max_abs %.3g cos %.9f", d.RelL2, d.MaxAbs, d.Cosine)
		})
	}
}

// TestMutationsInMemory plants each mutation of issue 4 into an in-memory
// converted layer and checks the fused-vs-reference error is at least 10x
// the threshold (the on-disk suite with convert's output is in mutation_test.go).
func TestMutationsInMemory(t *testing.T) {
	build := func(fp8 bool, biasLike bool) (*memModel, cktest.Mem, *moelayer.FusedLayer) {
		mm := memModel{H: 160, I: 128, E: 16, S: 1, K: 4, NGroup: 4, TopKGroup: 2, RSF: 2.5, FP8: fp8, deepseekLikeBiases: biasLike}
		m := newMemModel(42, mm)
		dst, _, fl := m.convert(convertOpts{layout: layout.Stacked, fuse: true, replicas: 2, fold: fp8})
		return m, dst, fl
	}
	type mutation struct {
		name   string
		fp8    bool
		biases bool
		apply  func(m *memModel, dst cktest.Mem, fl *moelayer.FusedLayer)
	}
	swapSlices := func(dst cktest.Mem, name string, a, b int) {
		t := dst[name]
		raw := dst.Bytes(name)
		per := len(raw) / int(t.Shape[0])
		tmp := append([]byte(nil), raw[a*per:(a+1)*per]...)
		copy(raw[a*per:], raw[b*per:(b+1)*per])
		copy(raw[b*per:], tmp)
		dst.Put(name, t.DType, t.Shape, raw)
	}
	// The expert the first token selects, so every mutation is on a used expert.
	muts := []mutation{
		{"gate and up swapped in one expert", false, false, func(m *memModel, dst cktest.Mem, fl *moelayer.FusedLayer) {
			g, u := dst.Bytes(fl.Names.Weight(layout.ProjGate)), dst.Bytes(fl.Names.Weight(layout.ProjUp))
			per := len(g) / int(dst[fl.Names.Weight(layout.ProjGate)].Shape[0])
			e := usedExpert(t, m)
			tmp := append([]byte(nil), g[e*per:(e+1)*per]...)
			copy(g[e*per:], u[e*per:(e+1)*per])
			copy(u[e*per:], tmp)
			dst.Put(fl.Names.Weight(layout.ProjGate), dst[fl.Names.Weight(layout.ProjGate)].DType, dst[fl.Names.Weight(layout.ProjGate)].Shape, g)
			dst.Put(fl.Names.Weight(layout.ProjUp), dst[fl.Names.Weight(layout.ProjUp)].DType, dst[fl.Names.Weight(layout.ProjUp)].Shape, u)
		}},
		{"two experts swapped", false, false, func(m *memModel, dst cktest.Mem, fl *moelayer.FusedLayer) {
			e := usedExpert(t, m)
			for _, n := range []string{fl.Names.Weight(layout.ProjGate), fl.Names.Weight(layout.ProjUp), fl.Names.Weight(layout.ProjDown)} {
				swapSlices(dst, n, e, (e+1)%m.E)
			}
		}},
		{"rsf folded twice (fp8 scales)", true, false, func(m *memModel, dst cktest.Mem, fl *moelayer.FusedLayer) {
			scaleStack(dst, fl.Names.Get(layout.ProjDown, layout.RoleScale), m.E, m.RSF)
		}},
		{"rsf neither folded nor applied", false, false, func(m *memModel, dst cktest.Mem, fl *moelayer.FusedLayer) {
			fl.Contract.RoutedScalingFactorFolded = true // contract claims folded, weights are not
			fl.Contract.SharedSlotWeight = 1
		}},
		{"one shared replica zeroed", false, false, func(m *memModel, dst cktest.Mem, fl *moelayer.FusedLayer) {
			n := dst[fl.Names.Weight(layout.ProjDown)]
			raw := dst.Bytes(fl.Names.Weight(layout.ProjDown))
			per := len(raw) / int(n.Shape[0])
			clear(raw[(m.E+1)*per : (m.E+2)*per]) // replica 1 of 2
			dst.Put(fl.Names.Weight(layout.ProjDown), n.DType, n.Shape, raw)
		}},
		{"correction bias rounded to bf16", false, true, func(m *memModel, dst cktest.Mem, fl *moelayer.FusedLayer) {
			b := make([]float32, m.E)
			for i, v := range m.bias {
				b[i] = numfmt.RoundBF16(v)
			}
			dst.Put(fl.RouterBias, dst[fl.RouterBias].DType, dst[fl.RouterBias].Shape, testkit.F32LE(b...))
		}},
		{"one wrong fp8 scale block", true, false, func(m *memModel, dst cktest.Mem, fl *moelayer.FusedLayer) {
			n := dst[fl.Names.Get(layout.ProjUp, layout.RoleScale)]
			raw := dst.Bytes(fl.Names.Get(layout.ProjUp, layout.RoleScale))
			per := len(raw) / int(n.Shape[0])
			e := usedExpert(t, m)
			scaleF32(raw[e*per:e*per+4], 4)
			dst.Put(fl.Names.Get(layout.ProjUp, layout.RoleScale), n.DType, n.Shape, raw)
		}},
	}
	for _, mu := range muts {
		t.Run(mu.name, func(t *testing.T) {
			m, dst, fl := build(mu.fp8, mu.biases)
			_, _, clean := runBoth(t, m, dst, fl, 32, 16)
			if why := judge.TolFP32.Verdict(clean); why != "" {
				t.Fatalf("unmutated layer fails: %s", why)
			}
			mu.apply(m, dst, fl)
			_, _, d := runBoth(t, m, dst, fl, 32, 16)
			if !(d.RelL2 >= 10*judge.TolFP32.MaxRelL2) {
				t.Fatalf("mutation moved rel_l2 only to %.3g (threshold %.3g)", d.RelL2, judge.TolFP32.MaxRelL2)
			}
			t.Logf("rel_l2 %.3g", d.RelL2)
		})
	}
}

// usedExpert is an expert the first tokens of runBoth's x select.
func usedExpert(t *testing.T, m *memModel) int {
	x := DrawX(11, m.layerIndex, 1, m.H)
	ref, err := cpuref.ReferenceLayer(context.Background(), m.src, m.plan, &m.plan.Layers[0], x, 1, cpuref.RefOptions{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	return int(ref.Routing.IDs[0])
}

// scaleStack multiplies the F32 scales of the first n experts of a stack by f.
func scaleStack(dst cktest.Mem, name string, n int, f float64) {
	t := dst[name]
	raw := dst.Bytes(name)
	per := len(raw) / int(t.Shape[0])
	scaleF32(raw[:n*per], f)
	dst.Put(name, t.DType, t.Shape, raw)
}
