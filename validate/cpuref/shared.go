package cpuref

import (
	"context"
	"fmt"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// The shared expert alone: what a golden taken where the module leaves the
// shared MLP out (Granite's block_sparse_moe, family.ModuleRouted) lacks
// against the sum the paths compute.

// SharedOutput is a source layer's shared expert alone over x [T,H], gated
// per token where it has a gate, as ReferenceLayer adds it (float64 sums,
// stored as float32; no output scale).
func SharedOutput(ctx context.Context, src tensorload.TensorSource, plan *family.Plan, layer *family.Layer, x []float32, t, workers int) ([]float32, error) {
	h := plan.HiddenSize
	switch {
	case layer.Shared == nil:
		return nil, fmt.Errorf("layer %d has no shared expert", layer.Key())
	case len(x) != t*h:
		return nil, fmt.Errorf("layer %d: x has %d values for %d tokens x %d", layer.Key(), len(x), t, h)
	case !moelayer.PrepOf(plan, layer).None():
		return nil, fmt.Errorf("layer %d: the shared expert alone is not computed for a layer with two inputs", layer.Key())
	}
	if workers <= 0 {
		workers = moe.Workers()
	}
	r := &refLayer{src: src, plan: plan, layer: layer, x: x, h: h, t: t, workers: workers}
	m, err := r.loadShared()
	if err != nil {
		return nil, err
	}
	defer m.release()
	sh, err := r.sharedWith(ctx, m)
	if err != nil {
		return nil, err
	}
	y64 := make([]float64, t*h)
	sh.addTo(y64, x, t, h)
	return scaled32(y64, 1), nil
}

// FusedSharedOutput is a converted layer's unfused shared expert alone over
// x [T,H], gated per token where it has a gate, as FusedLayerRun adds it
// (float32 sums). A shared expert fused into the bank is not run alone.
func FusedSharedOutput(src tensorload.TensorSource, fl *moelayer.FusedLayer, x []float32, t, h int) ([]float32, error) {
	switch {
	case fl.Shared == nil:
		return nil, fmt.Errorf("layer %d has no unfused shared expert", fl.Index)
	case len(x) != t*h:
		return nil, fmt.Errorf("layer %d: x has %d values for %d tokens x %d", fl.Index, len(x), t, h)
	case !fl.Prep.None():
		return nil, fmt.Errorf("layer %d: the shared expert alone is not computed for a layer with two inputs", fl.Index)
	}
	f := &fusedRun{fl: fl, src: src, x: x, t: t, h: h}
	if err := f.denseSharedErr(); err != nil {
		return nil, err
	}
	if err := f.runDense(); err != nil {
		return nil, err
	}
	y := make([]float32, t*h)
	f.dense.addDense(y, x, t, h)
	return y, nil
}
