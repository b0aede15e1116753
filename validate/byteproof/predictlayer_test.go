package byteproof

import (
	"fmt"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
)

// TestProofOrder: the proof lays out the weight and scale stacks in the
// order it has always reported a stack that cannot be laid out in (gate
// and up weights, their scales, down's), then the global and input
// scales in layout.StackOrder's order; and it walks every stack of
// StackOrder exactly once, so a role added there is not passed over.
func TestProofOrder(t *testing.T) {
	st := func(p layout.Proj, r layout.Role) layout.Stack { return layout.Stack{Proj: p, Role: r} }
	want := []layout.Stack{
		st(layout.ProjGate, layout.RoleWeight), st(layout.ProjUp, layout.RoleWeight), st(layout.ProjGateUp, layout.RoleWeight),
		st(layout.ProjGate, layout.RoleScale), st(layout.ProjUp, layout.RoleScale), st(layout.ProjGateUp, layout.RoleScale),
		st(layout.ProjDown, layout.RoleWeight), st(layout.ProjDown, layout.RoleScale),
		st(layout.ProjGate, layout.RoleGlobal), st(layout.ProjUp, layout.RoleGlobal), st(layout.ProjGateUp, layout.RoleGlobal), st(layout.ProjDown, layout.RoleGlobal),
		st(layout.ProjGate, layout.RoleInput), st(layout.ProjUp, layout.RoleInput), st(layout.ProjGateUp, layout.RoleInput), st(layout.ProjDown, layout.RoleInput),
	}
	if fmt.Sprint(proofOrder) != fmt.Sprint(want) {
		t.Errorf("proofOrder %v\nwant %v", proofOrder, want)
	}
	seen := map[layout.Stack]int{}
	for _, s := range proofOrder {
		seen[s]++
	}
	for _, s := range layout.StackOrder {
		if seen[s] != 1 {
			t.Errorf("stack %s %d of StackOrder is in proofOrder %d times, want once", s.Proj, s.Role, seen[s])
		}
	}
	if len(proofOrder) != len(layout.StackOrder) {
		t.Errorf("proofOrder has %d stacks, StackOrder %d", len(proofOrder), len(layout.StackOrder))
	}
}

// TestPredictFirstMissing: where several of a bank expert's tensors are
// missing from SRC (renamed in the plan), the prediction names the first
// in the order it reads them: gate, up and down weights, then the global
// scales, then the scales.
func TestPredictFirstMissing(t *testing.T) {
	type miss struct {
		p layout.Proj
		r layout.Role
	}
	for _, tc := range []struct {
		name    string
		fixture string
		missing []miss // renamed in routed expert 3 of the first MoE layer
		want    miss   // the one the error names
	}{
		{"up before down", "deepseek-v3-bf16", []miss{{layout.ProjDown, layout.RoleWeight}, {layout.ProjUp, layout.RoleWeight}}, miss{layout.ProjUp, layout.RoleWeight}},
		{"gate before up", "deepseek-v3-bf16", []miss{{layout.ProjUp, layout.RoleWeight}, {layout.ProjGate, layout.RoleWeight}}, miss{layout.ProjGate, layout.RoleWeight}},
		{"a weight before a scale", "deepseek-v3-fp8", []miss{{layout.ProjGate, layout.RoleScale}, {layout.ProjDown, layout.RoleWeight}}, miss{layout.ProjDown, layout.RoleWeight}},
		{"gate's scale before down's", "deepseek-v3-fp8", []miss{{layout.ProjDown, layout.RoleScale}, {layout.ProjGate, layout.RoleScale}}, miss{layout.ProjGate, layout.RoleScale}},
		{"up's scale before down's", "deepseek-v3-fp8", []miss{{layout.ProjDown, layout.RoleScale}, {layout.ProjUp, layout.RoleScale}}, miss{layout.ProjUp, layout.RoleScale}},
		{"a global scale before a scale", "deepseek-v3-nvfp4", []miss{{layout.ProjGate, layout.RoleScale}, {layout.ProjDown, layout.RoleGlobal}}, miss{layout.ProjDown, layout.RoleGlobal}},
		{"up's global scale before down's", "deepseek-v3-nvfp4", []miss{{layout.ProjDown, layout.RoleGlobal}, {layout.ProjUp, layout.RoleGlobal}}, miss{layout.ProjUp, layout.RoleGlobal}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cv := convertFixture(t, tc.fixture, convert.Options{TP: 1}, nil)
			e := &cv.plan.Layers[0].Experts[3]
			var want string
			for _, m := range tc.missing {
				old := e.Get(m.p, m.r)
				if old == "" {
					t.Fatalf("%s: expert 3 has no %s %d tensor", tc.fixture, m.p, m.r)
				}
				e.Set(m.p, m.r, old+".renamed")
				if m == tc.want {
					want = old + ".renamed"
				}
			}
			_, err := predict(cv.src, cv.plan, cv.c)
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("tensor %s is missing", want)) {
				t.Fatalf("err %v, want it to name %s as missing", err, want)
			}
		})
	}
}

// TestPredictGateUpPairs: a fused stack holds each bank expert's gate and
// up pieces in the layout's order (gate first for gate_up, up first for
// up_gate), for the weights and the scales alike.
func TestPredictGateUpPairs(t *testing.T) {
	for _, l := range []layout.Layout{layout.GateUp, layout.UpGate} {
		t.Run(string(l), func(t *testing.T) {
			cv := convertFixture(t, "deepseek-v3-fp8", convert.Options{TP: 1, Layout: l}, nil)
			pred, err := predict(cv.src, cv.plan, cv.c)
			if err != nil {
				t.Fatal(err)
			}
			li := cv.c.Layers[0]
			var sl *family.Layer
			for i := range cv.plan.Layers {
				if cv.plan.Layers[i].Index == li.Index {
					sl = &cv.plan.Layers[i]
				}
			}
			first, second := layout.ProjGate, layout.ProjUp
			if l == layout.UpGate {
				first, second = second, first
			}
			names := cv.c.Names(li)
			for _, r := range []layout.Role{layout.RoleWeight, layout.RoleScale} {
				name := names.Get(layout.ProjGateUp, r)
				segs := pred.tensors[name]
				if name == "" || len(segs) != 2*len(sl.Experts) {
					t.Fatalf("stack %q: %d segments, want 2 for each of %d experts", name, len(segs), len(sl.Experts))
				}
				for b, x := range sl.Experts {
					for i, p := range []layout.Proj{first, second} {
						if got, want := segs[2*b+i].src.Name, x.Get(p, r); got != want || segs[2*b+i].expert != b {
							t.Errorf("%s: segment %d is expert %d's %s, want expert %d's %s (%s)", name, 2*b+i, segs[2*b+i].expert, got, b, want, p)
						}
					}
				}
			}
		})
	}
}
