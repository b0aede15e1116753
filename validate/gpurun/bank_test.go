package gpurun

import (
	"context"
	"fmt"
	"testing"

	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/weightfmt"
)

// TestBankPartsByTable: a bank's parts (no device needed to build them)
// are its layout's projections in load order, each with the stacks the
// table names for it and the shapes the layout gives them, loading into
// that projection's own fields of the bank.
func TestBankPartsByTable(t *testing.T) {
	const e, I, H = 4, 256, 512
	for _, tc := range []struct {
		l     layout.Layout
		f     weightfmt.Format
		projs []layout.Proj
	}{
		{layout.Stacked, weightfmt.FP8Block(128, 128, false), []layout.Proj{layout.ProjGate, layout.ProjUp, layout.ProjDown}},
		{layout.GateUp, weightfmt.FP8Block(128, 128, false), []layout.Proj{layout.ProjGateUp, layout.ProjDown}},
		{layout.UpGate, weightfmt.NVFP4ModelOpt(), []layout.Proj{layout.ProjGateUp, layout.ProjDown}},
		{layout.Stacked, weightfmt.NVFP4CT(), []layout.Proj{layout.ProjGate, layout.ProjUp, layout.ProjDown}},
	} {
		t.Run(fmt.Sprintf("%s %s", tc.l, tc.f), func(t *testing.T) {
			n := layout.NamesFor(tc.l, "model.layers.1.mlp", tc.f)
			shapes := layout.StackShapesFor(tc.l, e, I, H, tc.f)
			b := &Bank{}
			parts := bankParts(n, shapes, b, H, I)
			if len(parts) != len(tc.projs) {
				t.Fatalf("%d parts, want %d (%v)", len(parts), len(tc.projs), tc.projs)
			}
			mats := map[layout.Proj]any{layout.ProjGate: &b.Gate, layout.ProjUp: &b.Up, layout.ProjGateUp: &b.GateUp, layout.ProjDown: &b.Down}
			scales := map[layout.Proj]any{layout.ProjGate: &b.GateScale, layout.ProjUp: &b.UpScale, layout.ProjGateUp: &b.GateUpScale, layout.ProjDown: &b.DownScale}
			for i, p := range tc.projs {
				got := parts[i]
				wantCols := int64(H)
				if p == layout.ProjDown {
					wantCols = I
				}
				if got.name == "" || got.name != n.Weight(p) || got.scaleName != n.Get(p, layout.RoleScale) || got.global != n.Get(p, layout.RoleGlobal) {
					t.Errorf("part %d: %s, %s, %s; want %s's %s, %s, %s", i, got.name, got.scaleName, got.global, p, n.Weight(p), n.Get(p, layout.RoleScale), n.Get(p, layout.RoleGlobal))
				}
				if _, ok := weightfmt.GlobalOf(tc.f); ok && (got.global == "" || len(got.globalShape) == 0) {
					t.Errorf("part %d (%s): %s has global scales, the part names none (%q %v)", i, p, tc.f, got.global, got.globalShape)
				}
				if fmt.Sprint(got.shape, got.scaleShape, got.globalShape) != fmt.Sprint(shapes.Of(p, layout.RoleWeight), shapes.Of(p, layout.RoleScale), shapes.Of(p, layout.RoleGlobal)) || got.cols != wantCols {
					t.Errorf("part %d (%s): shapes %v %v %v, %d columns", i, p, got.shape, got.scaleShape, got.globalShape, got.cols)
				}
				if any(got.mat) != mats[p] || any(got.scale) != scales[p] {
					t.Errorf("part %d (%s) loads into another projection's fields of the bank", i, p)
				}
			}
		})
	}
}

// TestFillStopsOnceCancelled: a bank whose run has failed elsewhere (its
// context ended) loads no further expert, paced or not: fill returns the
// context's error before touching the stager, which this load does not
// have (a copy would panic).
func TestFillStopsOnceCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ld := &orderedLoad{e: 3}
	for _, order := range [][]int{{0, 1, 2}, {2, 0, 1}} {
		if err := ld.fill(ctx, order, nil); err != context.Canceled {
			t.Errorf("order %v: fill after cancel: %v, want %v", order, err, context.Canceled)
		}
	}
}
