package kernels_test

import (
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
)

// Every numeric choice of the layer runner must be named: no zero default.
func TestLayerOptionsCheck(t *testing.T) {
	ok := kernels.GEMMOptions{Act: kernels.MatBF16}
	for _, c := range []struct {
		opt  kernels.LayerOptions
		good bool
	}{
		{kernels.LayerOptions{Route: kernels.RouteF32, GEMM: ok}, true},
		{kernels.LayerOptions{Route: kernels.RouteBF16, GEMM: kernels.GEMMOptions{Act: kernels.MatF32}}, true},
		{kernels.LayerOptions{GEMM: ok}, false},                // route precision unset
		{kernels.LayerOptions{Route: kernels.RouteF32}, false}, // activation unset
		{kernels.LayerOptions{Route: kernels.RouteF32, GEMM: kernels.GEMMOptions{Act: kernels.MatFP8}}, false},
		{kernels.LayerOptions{Route: kernels.RouteF32, GEMM: kernels.GEMMOptions{Act: kernels.MatBF16, Scratch: &cuda.Buffer[float32]{}}}, false},
	} {
		if err := c.opt.Check(); (err == nil) != c.good {
			t.Errorf("%+v: Check() = %v, want ok %v", c.opt, err, c.good)
		}
	}
	if _, err := kernels.NewLayerRunner(nil, 0, kernels.LayerOptions{GEMM: ok}); err == nil {
		t.Error("NewLayerRunner took options without a route precision")
	}
}

// FusedGate takes the shared slots and the final scale from the contract,
// as the CPU twin (moe.FusedSlots through cpuref) does.
func TestFusedGate(t *testing.T) {
	route := moe.RouteSpec{Scoring: moe.Sigmoid, NumExperts: 8, TopK: 2, RoutedScalingFactor: 2.5}
	gs, scale := kernels.FusedGate(route, nil)
	if gs.Shared != (moe.SharedSlots{}) || scale != 2.5 || gs.RouteSpec != route {
		t.Errorf("no contract: shared %+v, scale %v; want none, 2.5", gs.Shared, scale)
	}
	c := &layout.Contract{NumExperts: 8, NumFusedSharedExperts: 4, SharedReplicas: 2, SharedSlices: 2, SharedSlotWeight: 0.4, RoutedScalingFactor: 2.5}
	gs, scale = kernels.FusedGate(route, c)
	if want := (moe.SharedSlots{PerToken: 2, Replicas: 2, Weight: 0.4}); gs.Shared != want || scale != 2.5 || gs.SlotsPerToken() != 4 {
		t.Errorf("unfolded: shared %+v, scale %v; want %+v, 2.5", gs.Shared, scale, want)
	}
	c.RoutedScalingFactorFolded, c.SharedSlotWeight = true, 1
	if gs, scale = kernels.FusedGate(route, c); gs.Shared.Weight != 1 || scale != 1 {
		t.Errorf("folded: shared weight %v, scale %v; want 1, 1", gs.Shared.Weight, scale)
	}
	c.NumFusedSharedExperts = 0
	if gs, _ = kernels.FusedGate(route, c); gs.Shared != (moe.SharedSlots{}) {
		t.Errorf("shared expert not fused: shared %+v, want none", gs.Shared)
	}
}

// Sorted is a view of the alignment's own arrays.
func TestAlignmentSorted(t *testing.T) {
	a := &kernels.Alignment{BlockSize: 64, Numel: 9 * 16,
		SortedTokenIDs: &cuda.Buffer[int32]{}, ExpertIDs: &cuda.Buffer[int32]{}, Total: &cuda.Buffer[int32]{}}
	s := a.Sorted()
	if s.SortedIDs != a.SortedTokenIDs || s.ExpertIDs != a.ExpertIDs || s.Total != a.Total || s.BlockSize != 64 || s.Numel != 144 {
		t.Errorf("Sorted() = %+v", s)
	}
}
