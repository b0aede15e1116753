package rankproof

import (
	"context"
	"fmt"
	"path"
	"path/filepath"
	"slices"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// stack is one of a layer's output stacks: its name, and per slot the
// projections and role whose source bytes it holds, in order.
type stack struct {
	name  string
	projs []layout.Proj
	role  layout.Role
}

// stacksOf lists layer li's stacks in the contract's layout: each
// projection's weight and scale, the global and input scales, biases.
func (k *checker) stacksOf(li layout.LayerInfo) []stack {
	names := k.c.Names(li)
	order := []layout.Proj{layout.ProjGate, layout.ProjUp}
	if k.c.Layout == layout.UpGate {
		order = []layout.Proj{layout.ProjUp, layout.ProjGate}
	}
	var out []stack
	for _, st := range layout.StackOrder {
		n := names.Get(st.Proj, st.Role)
		if n == "" || (st.Role == layout.RoleInput && !k.c.InputScales) {
			continue
		}
		projs := []layout.Proj{st.Proj}
		if st.Proj == layout.ProjGateUp {
			projs = order
		}
		out = append(out, stack{n, projs, st.Role})
	}
	if bn, ok := k.c.Biases(li); ok {
		if bn.GateUp != "" {
			out = append(out, stack{bn.GateUp, order, layout.RoleBias})
		} else {
			out = append(out, stack{bn.Gate, []layout.Proj{layout.ProjGate}, layout.RoleBias}, stack{bn.Up, []layout.Proj{layout.ProjUp}, layout.RoleBias})
		}
		out = append(out, stack{bn.Down, []layout.Proj{layout.ProjDown}, layout.RoleBias})
	}
	return out
}

// checkRank proves rank ri's stacks: every slot of every layer against
// the source expert its placement names, cut to the rank's part.
func (k *checker) checkRank(ctx context.Context, ri layout.RankInfo) error {
	x := k.x
	dir := filepath.Join(k.dst, filepath.FromSlash(path.Dir(ri.Index)))
	sh, err := safetensors.OpenSharded(dir)
	if err != nil {
		return fail("rank %d: %v", ri.Rank, err)
	}
	defer sh.Close()
	if shards := sh.Index.Shards(); len(shards) != len(ri.Files) {
		return fail("rank %d: its index names %d shards, the contract %d", ri.Rank, len(shards), len(ri.Files))
	}
	for _, s := range sh.Index.Shards() {
		if !slices.Contains(ri.Files, path.Join(path.Dir(ri.Index), s)) {
			return fail("rank %d: its index names shard %s, which the contract does not list", ri.Rank, s)
		}
	}
	want := 0
	S := k.c.SharedSlices
	if k.c.NumFusedSharedExperts == 0 {
		S = 0
	}
	for i, li := range k.c.Layers {
		pl := k.plan.Layers[i]
		for _, st := range k.stacksOf(li) {
			want++
			f, ti, ok := sh.Lookup(st.name)
			if !ok {
				return fail("rank %d: layer %d: stack %s is missing", ri.Rank, li.Index, st.name)
			}
			sec, err := f.Section(st.name)
			if err != nil {
				return err
			}
			if ti.Shape[0] != int64(x.SlotsPerRank+S) {
				return fail("rank %d: layer %d: %s holds %d slots, want %d and %d shared", ri.Rank, li.Index, st.name, ti.Shape[0], x.SlotsPerRank, S)
			}
			per := ti.NumBytes() / ti.Shape[0]
			for j := range x.SlotsPerRank + S {
				if err := ctx.Err(); err != nil {
					return err
				}
				what := ""
				var got []byte
				var exp []byte
				if j < x.SlotsPerRank {
					e := x.Logical(i, ri, j)
					what = fmt.Sprintf("slot %d (physical slot %d, expert %d)", j, ri.FirstSlot+j, e)
					exp, err = k.slotBytes(pl, pl.Experts[e], int64(x.MoETP), int64(ri.MoETPRank), st, true)
				} else {
					s := j - x.SlotsPerRank
					what = fmt.Sprintf("slot %d (shared slice %d of replica %d)", j, s, ri.EPRank)
					M := int64(x.MoETP)
					exp, err = k.slotBytes(pl, *pl.Shared, int64(S)*M, int64(s)*M+int64(ri.MoETPRank), st, false)
				}
				if err != nil {
					return fmt.Errorf("rank %d: layer %d: %s: %w", ri.Rank, li.Index, what, err)
				}
				if int64(len(exp)) != per {
					return fail("rank %d: layer %d: %s: %s has %d bytes a slot, SRC's expert gives %d", ri.Rank, li.Index, what, st.name, per, len(exp))
				}
				got = make([]byte, per)
				if err := readFull(sec, got, int64(j)*per); err != nil {
					return err
				}
				k.res.DSTBytesRead += per
				if at := firstDiff(got, exp); at >= 0 {
					return fail("rank %d: layer %d: %s: %s differs from SRC's expert at byte %d of the slot", ri.Rank, li.Index, what, st.name, at)
				}
			}
		}
		k.res.Slots += x.SlotsPerRank + S
	}
	if n := len(sh.Index.WeightMap); n != want {
		return fail("rank %d: its index names %d tensors, its layers' stacks are %d", ri.Rank, n, want)
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// slotBytes predicts one slot's bytes of stack st: source MLP m, whose
// intermediate is parts x I/M wide (M for a routed expert, S*M for the
// shared expert), part idx of it; routed says whether rsf's fold applies.
func (k *checker) slotBytes(pl family.Layer, m family.MLP, parts, idx int64, st stack, routed bool) ([]byte, error) {
	I := int64(k.plan.IntermediateOf(pl))
	H := int64(k.plan.HiddenSize)
	M := int64(k.x.MoETP)
	Ir := I / M
	W := parts * Ir // the source tensor's intermediate width
	var out []byte
	for _, pj := range st.projs {
		name := m.Get(pj, st.role)
		if name == "" {
			return nil, fmt.Errorf("SRC names no %s tensor of role %d", pj, st.role)
		}
		t, ok := k.src.Tensor(name)
		if !ok {
			return nil, fmt.Errorf("SRC's %s is missing", name)
		}
		var r weightfmt.Region
		switch {
		case st.role == layout.RoleWeight || st.role == layout.RoleScale:
			var sl weightfmt.Slice
			if pj == layout.ProjDown {
				sl = weightfmt.Matrix{Format: k.f, Rows: H, Cols: W}.ColBlock(idx*Ir, Ir)
			} else {
				sl = weightfmt.Matrix{Format: k.f, Rows: W, Cols: H}.RowBlock(idx*Ir, Ir)
			}
			r = sl.Weight
			if st.role == layout.RoleScale {
				r = sl.Scale
			}
		case st.role == layout.RoleBias && parts > 1:
			return nil, fmt.Errorf("a bias cut %d ways is not predicted", parts)
		default: // a per-tensor scalar, a bias: whole
			n := t.NumBytes()
			r = weightfmt.Region{Rows: 1, RowLen: n, Stride: n}
		}
		b := make([]byte, r.Size())
		for row := range r.Rows {
			if err := readFull(t.Data, b[row*r.RowLen:(row+1)*r.RowLen], r.Off+row*r.Stride); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
		}
		k.res.SRCBytesRead += r.Size()
		if routed && pj == layout.ProjDown && k.c.RoutedScalingFactorFolded && k.foldsInto(st.role) {
			weightfmt.FoldInPlace(t.DType, b, k.c.RoutedScalingFactor)
		}
		out = append(out, b...)
	}
	return out, nil
}

// foldsInto says whether a folded rsf lives in the routed down
// projection's tensors of role: the weights where the format folds into
// them (or has no scales), else the scales.
func (k *checker) foldsInto(role layout.Role) bool {
	into := k.f.Fold().Into
	if _, scaled := k.f.Scale(); !scaled {
		into = weightfmt.FoldWeights
	}
	switch into {
	case weightfmt.FoldWeights:
		return role == layout.RoleWeight
	case weightfmt.FoldScales:
		return role == layout.RoleScale
	}
	return false
}
