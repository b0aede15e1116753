package moe_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/moe/moetest"
)

// cpuRouter is the gate as the CPU paths compose it: Route (or RouteHashed
// for a hash-routed layer), the router's scale, then the shared slots.
type cpuRouter struct{}

func (cpuRouter) Route(c *moetest.RouteCase) (*moetest.RouteResult, error) {
	var r *moe.Routing
	var err error
	if c.HashIDs != nil {
		r, err = moe.RouteHashed(c.Spec, c.Logits, c.HashIDs, c.T)
	} else {
		r, err = moe.Route(c.Spec, c.Logits, c.Bias, c.T)
	}
	if err != nil {
		return nil, err
	}
	if c.Scale != 1 {
		moe.ScaleRouting(r, c.Scale)
	}
	s, err := moe.FusedSlots(r, c.Spec.NumExperts, c.Shared, 1)
	if err != nil {
		return nil, err
	}
	return &moetest.RouteResult{IDs: s.IDs, Weights: s.Weights, Choice: r.Choice, Shared: r.Shared}, nil
}

func TestRouteConforms(t *testing.T) { moetest.TestRoute(t, cpuRouter{}) }

type cpuAligner struct{}

func (cpuAligner) Align(ids []int32, e, block int) (*moe.Alignment, error) {
	return moe.AlignBlockSize(ids, e, block)
}

func TestAlignConforms(t *testing.T) { moetest.TestAlign(t, cpuAligner{}) }

type cpuGEMM struct{ workers int }

func (g cpuGEMM) GroupedGEMM(c *moetest.GEMMCase) ([]float32, error) {
	load := func(_ context.Context, e int) (*moe.ExpertMats, error) { return &c.Experts[e], nil }
	return moe.GroupedGEMM(context.Background(), c.X, c.T, c.H, c.I, c.K, c.Align, load, moe.GEMMOptions{Workers: g.workers})
}

// TestGroupedGEMMConforms: float32 accumulation (gonum's Sgemm) against
// the float64 reference, 1e-5 per row (TestGroupedGEMM's note), with one
// expert at a time and with several in flight.
func TestGroupedGEMMConforms(t *testing.T) {
	for _, w := range []int{1, 3} {
		t.Run(fmt.Sprintf("workers %d", w), func(t *testing.T) { moetest.TestGroupedGEMM(t, cpuGEMM{w}, 1e-5) })
	}
}

type cpuFinalizer struct{}

func (cpuFinalizer) Finalize(out []float32, t, k, h int, w []float32, scale float32) ([]float32, error) {
	return moe.Finalize(out, t, k, h, w, scale)
}

func TestFinalizeConforms(t *testing.T) { moetest.TestFinalize(t, cpuFinalizer{}) }
