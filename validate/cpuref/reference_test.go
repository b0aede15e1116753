package cpuref_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/moelayer"
)

// handMLP is one expert of H = 2, I = 1: gate and up [1,2], down [2,1].
type handMLP struct{ gate, up, down [2]float32 }

// out is the expert's SwiGLU on x, in float64: down * silu(gate . x) * (up . x).
func (m handMLP) out(x [2]float32) [2]float64 {
	g := float64(m.gate[0])*float64(x[0]) + float64(m.gate[1])*float64(x[1])
	u := float64(m.up[0])*float64(x[0]) + float64(m.up[1])*float64(x[1])
	h := g / (1 + math.Exp(-g)) * u
	return [2]float64{float64(m.down[0]) * h, float64(m.down[1]) * h}
}

// plusShared is want with the shared expert's output for token x added.
func plusShared(want [2]float64, shared handMLP, x [2]float32) [2]float64 {
	o := shared.out(x)
	return [2]float64{want[0] + o[0], want[1] + o[1]}
}

// checkTokenY holds token tok's two outputs in y to want, within tol
// relative (absolute below 1).
func checkTokenY(t *testing.T, y []float32, tok int, want [2]float64, tol float64) {
	t.Helper()
	for h := range 2 {
		got := float64(y[tok*2+h])
		if math.Abs(got-want[h]) > tol*math.Max(1, math.Abs(want[h])) {
			t.Errorf("token %d: y[%d] = %v, want %v", tok, h, got, want[h])
		}
	}
}

// handLayer is a two-expert softmax layer in F32 on a cktest.Mem, small
// enough to check by hand: the router's rows are the experts' logits.
func handLayer(router [2][2]float32, experts [2]handMLP, shared *handMLP, topK int, rsf float64) (cktest.Mem, *family.Plan, *family.Layer) {
	src := cktest.Mem{}
	p := "model.layers.1.mlp"
	l := family.Layer{Index: 1, Prefix: p, Router: p + ".gate.weight"}
	src.PutF32(l.Router, []int64{2, 2}, router[0][0], router[0][1], router[1][0], router[1][1])
	put := func(prefix string, m handMLP) family.MLP {
		n := family.MLPOf(prefix+".gate_proj.weight", prefix+".up_proj.weight", prefix+".down_proj.weight")
		src.PutF32(n.Weight(layout.ProjGate), []int64{1, 2}, m.gate[:]...)
		src.PutF32(n.Weight(layout.ProjUp), []int64{1, 2}, m.up[:]...)
		src.PutF32(n.Weight(layout.ProjDown), []int64{2, 1}, m.down[:]...)
		return n
	}
	for e, m := range experts {
		l.Experts = append(l.Experts, put(fmt.Sprintf("%s.experts.%d", p, e), m))
	}
	plan := &family.Plan{Family: "qwen2_moe", ModelType: "qwen2_moe", HiddenSize: 2, MoEIntermediateSize: 1,
		NumExperts: 2, TopK: topK, TopKMethod: moe.TopKGreedy, NGroup: 1, TopKGroup: 1, Scoring: moe.Softmax,
		RoutedScalingFactor: rsf, WeightDType: safetensors.F32, Quantization: family.QuantNone}
	if shared != nil {
		n := put(p+".shared_experts", *shared)
		l.Shared = &n
		plan.NumSharedExperts, plan.SharedIntermediateSize = 1, 1
	}
	plan.Layers = []family.Layer{l}
	return src, plan, &plan.Layers[0]
}

// TestReferenceLayerByHand: the unfused reference of a two-expert layer
// routes each token as its logits say and sums softmax weight x rsf x the
// expert's SwiGLU (plus the shared expert), each value checked against the
// same few lines of arithmetic done here in float64.
func TestReferenceLayerByHand(t *testing.T) {
	router := [2][2]float32{{1, 0}, {0, 1}} // expert e's logit is x[e]
	experts := [2]handMLP{
		{gate: [2]float32{1, 0}, up: [2]float32{0.5, 0}, down: [2]float32{1, 2}},
		{gate: [2]float32{0, 1}, up: [2]float32{0, 1}, down: [2]float32{1, -1}},
	}
	shared := handMLP{gate: [2]float32{1, 1}, up: [2]float32{1, 0}, down: [2]float32{0.25, 0}}
	softmax := func(a, b float32) (float64, float64) {
		ea, eb := math.Exp(float64(a)), math.Exp(float64(b))
		return ea / (ea + eb), eb / (ea + eb)
	}
	for _, tc := range []struct {
		name   string
		x      [][2]float32
		topK   int
		rsf    float64
		shared bool
		ids    []int32 // per token, top-k in order
	}{
		// token 0: logits (2, 0), expert 0 with weight e^2/(e^2+1) = 0.8808;
		// token 1: logits (0, 3), expert 1 with weight e^3/(1+e^3) = 0.9526;
		// y = (1.5516, 3.1032) and (8.1668, -8.1668)
		{"top-1", [][2]float32{{2, 0}, {0, 3}}, 1, 1, false, []int32{0, 1}},
		{"top-1 rsf 2.5", [][2]float32{{2, 0}, {0, 3}}, 1, 2.5, false, []int32{0, 1}},
		{"top-2", [][2]float32{{2, 0}, {1, 3}}, 2, 1, false, []int32{0, 1, 1, 0}},
		{"top-1 and a shared expert", [][2]float32{{2, 0}, {0, 3}}, 1, 1, true, []int32{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sh *handMLP
			if tc.shared {
				sh = &shared
			}
			src, plan, layer := handLayer(router, experts, sh, tc.topK, tc.rsf)
			var x []float32
			for _, v := range tc.x {
				x = append(x, v[:]...)
			}
			ref, err := cpuref.ReferenceLayer(context.Background(), src, plan, layer, x, len(tc.x), cpuref.RefOptions{Workers: 1})
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(ref.Routing.IDs) != fmt.Sprint(tc.ids) {
				t.Fatalf("ids %v, want %v", ref.Routing.IDs, tc.ids)
			}
			for tok, xt := range tc.x {
				w0, w1 := softmax(xt[0], xt[1])
				var want [2]float64
				for j := range tc.topK {
					e := tc.ids[tok*tc.topK+j]
					w := w0
					if e == 1 {
						w = w1
					}
					if got := float64(ref.Routing.Weights[tok*tc.topK+j]); math.Abs(got-w) > 1e-6 {
						t.Errorf("token %d slot %d: weight %v, want %v", tok, j, got, w)
					}
					o := experts[e].out(xt)
					want[0] += w * tc.rsf * o[0]
					want[1] += w * tc.rsf * o[1]
				}
				if tc.shared {
					want = plusShared(want, shared, xt)
				}
				checkTokenY(t, ref.Y, tok, want, 1e-6)
			}
		})
	}
}

// handStacked is handLayer converted by hand to the stacked layout: the
// experts' gate, up and down as stacks [bank, 1, 2], [bank, 1, 2] and
// [bank, 2, 1], the shared expert (when fused) the bank's last expert,
// weighing 1 in every token's slots (rsf 1: folded or not, 1/rsf is 1).
func handStacked(src cktest.Mem, plan *family.Plan, l *family.Layer, fuse bool) (cktest.Mem, *moelayer.FusedLayer) {
	c := &layout.Contract{Version: layout.ContractVersion, Layout: layout.Stacked, SourceFormat: "safetensors", Family: plan.Family,
		NumExperts: 2, SharedFirstID: 2, RoutedScalingFactor: plan.RoutedScalingFactor, WeightDType: string(plan.WeightDType),
		Quantization: string(plan.Quantization), Layers: []layout.LayerInfo{{Index: l.Index, Prefix: l.Prefix}}, SharedSlotWeight: 1}
	mlps := l.Experts
	if fuse {
		c.SharedReplicas, c.SharedSlices, c.NumFusedSharedExperts = 1, 1, 1
		mlps = append(mlps[:len(mlps):len(mlps)], *l.Shared)
	}
	dst := cktest.Mem{}
	dst.Put(l.Router, safetensors.F32, []int64{2, 2}, src.Bytes(l.Router))
	n := layout.Names(layout.Stacked, l.Prefix, false)
	stack := func(name string, pick func(family.MLP) string, rows, cols int64) {
		var raw []byte
		for _, m := range mlps {
			raw = append(raw, src.Bytes(pick(m))...)
		}
		dst.Put(name, safetensors.F32, []int64{int64(len(mlps)), rows, cols}, raw)
	}
	stack(n.Weight(layout.ProjGate), func(m family.MLP) string { return m.Weight(layout.ProjGate) }, 1, 2)
	stack(n.Weight(layout.ProjUp), func(m family.MLP) string { return m.Weight(layout.ProjUp) }, 1, 2)
	stack(n.Weight(layout.ProjDown), func(m family.MLP) string { return m.Weight(layout.ProjDown) }, 2, 1)
	fl := &moelayer.FusedLayer{Index: l.Index, Router: l.Router, Spec: plan.RouteSpec(), Contract: c, Names: n}
	if !fuse && l.Shared != nil { // copied as it is, run beside the bank
		for _, name := range []string{l.Shared.Weight(layout.ProjGate), l.Shared.Weight(layout.ProjUp), l.Shared.Weight(layout.ProjDown)} {
			dst.Put(name, safetensors.F32, src[name].Shape, src.Bytes(name))
		}
		fl.Shared = l.Shared
	}
	return dst, fl
}

// TestFusedLayerByHand: the CPU fused twin on the hand-converted stacks
// gives the reference's routing and, within float32 rounding, its output:
// the by-hand values of TestReferenceLayerByHand, with the shared expert
// as an unfused MLP or as a fused bank expert in every token's slots.
func TestFusedLayerByHand(t *testing.T) {
	router := [2][2]float32{{1, 0}, {0, 1}}
	experts := [2]handMLP{
		{gate: [2]float32{1, 0}, up: [2]float32{0.5, 0}, down: [2]float32{1, 2}},
		{gate: [2]float32{0, 1}, up: [2]float32{0, 1}, down: [2]float32{1, -1}},
	}
	shared := handMLP{gate: [2]float32{1, 1}, up: [2]float32{1, 0}, down: [2]float32{0.25, 0}}
	x := [][2]float32{{2, 0}, {0, 3}}
	// token 0 takes expert 0 at e^2/(e^2+1), token 1 expert 1 at e^3/(1+e^3)
	w := [2]float64{math.Exp(2) / (math.Exp(2) + 1), math.Exp(3) / (1 + math.Exp(3))}
	for _, tc := range []struct {
		name          string
		shared, fused bool
		bank          int
	}{
		{"no shared expert", false, false, 2},
		{"shared expert beside the bank", true, false, 2},
		{"shared expert fused into the bank", true, true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sh *handMLP
			if tc.shared {
				sh = &shared
			}
			src, plan, layer := handLayer(router, experts, sh, 1, 1)
			dst, fl := handStacked(src, plan, layer, tc.fused)
			if got := fl.Contract.BankSize(); got != tc.bank {
				t.Fatalf("bank of %d, want %d", got, tc.bank)
			}
			var xs []float32
			for _, v := range x {
				xs = append(xs, v[:]...)
			}
			res, err := cpuref.FusedLayerRun(context.Background(), dst, fl, xs, len(x), cpuref.FusedOptions{BlockSize: 4, Workers: 1})
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(res.Routing.IDs) != "[0 1]" {
				t.Fatalf("ids %v, want [0 1]", res.Routing.IDs)
			}
			for tok, xt := range x {
				o := experts[tok].out(xt)
				want := [2]float64{w[tok] * o[0], w[tok] * o[1]}
				if tc.shared {
					want = plusShared(want, shared, xt)
				}
				checkTokenY(t, res.Y, tok, want, 1e-5)
			}
		})
	}
}
