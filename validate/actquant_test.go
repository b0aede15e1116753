package validate

import (
	"context"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/judge"
)

// TestReferenceW8A8 runs the CPU reference in w8a8 numerics on the FP8
// DeepSeek-V3 fixture's MoE layers (routed and shared experts): it must
// move the output off the precise reference and HF's float32 golden by the
// 0.01..0.08 band two e4m3 roundings per expert give, with the routing
// unchanged (the router stays precise).
func TestReferenceW8A8(t *testing.T) {
	src, ck, plan := openFixture(t, "deepseek-v3-fp8")
	n := 0
	for i := range plan.Layers {
		layer := &plan.Layers[i]
		if len(layer.Experts) == 0 {
			continue
		}
		g := goldenOf(t, src, plan, layer)
		precise, err := cpuref.ReferenceLayer(context.Background(), ck, plan, layer, g.X, g.T, cpuref.RefOptions{Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		w8, err := cpuref.ReferenceLayer(context.Background(), ck, plan, layer, g.X, g.T, cpuref.RefOptions{Workers: 2, W8A8: true})
		if err != nil {
			t.Fatal(err)
		}
		d, dg := judge.Compare(w8.Y, precise.Y).RelL2, judge.Compare(w8.Y, g.Y).RelL2
		t.Logf("layer %d: w8a8 reference vs precise %.3g, vs HF golden %.3g", layer.Index, d, dg)
		if !(d >= 0.005 && d <= judge.TolW8A8Golden.MaxRelL2) || !(dg <= judge.TolW8A8Golden.MaxRelL2) {
			t.Errorf("layer %d: w8a8 reference %.3g from the precise one, %.3g from the golden; want 0.005..%g", layer.Index, d, dg, judge.TolW8A8Golden.MaxRelL2)
		}
		if !slices.Equal(w8.Routing.IDs, precise.Routing.IDs) {
			t.Errorf("layer %d: w8a8 changed the routing", layer.Index)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no MoE layer in the fixture")
	}
}
