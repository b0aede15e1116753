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
				return fail("rank %d: layer %s: stack %s is missing", ri.Rank, family.KeyLabel(li.Index), st.name)
			}
			sec, err := f.Section(st.name)
			if err != nil {
				return err
			}
			if ti.Shape[0] != int64(x.SlotsPerRank+S) {
				return fail("rank %d: layer %s: %s holds %d slots, want %d and %d shared", ri.Rank, family.KeyLabel(li.Index), st.name, ti.Shape[0], x.SlotsPerRank, S)
			}
			if d, _, _, ok := k.pred.Want(st.name); ok && d != ti.DType {
				return fail("rank %d: layer %s: %s is %s, the contract's stacks %s", ri.Rank, family.KeyLabel(li.Index), st.name, ti.DType, d)
			}
			per := ti.NumBytes() / ti.Shape[0]
			for j := range x.SlotsPerRank + S {
				if err := ctx.Err(); err != nil {
					return err
				}
				// bank is the whole model's bank expert the slot is cut
				// from: its logical expert, or shared slice s (E+s)
				var what string
				var bank int
				if j < x.SlotsPerRank {
					bank = x.Logical(i, ri, j)
					what = fmt.Sprintf("slot %d (physical slot %d, expert %d)", j, ri.FirstSlot+j, bank)
				} else {
					s := j - x.SlotsPerRank
					bank = k.c.NumExperts + s
					what = fmt.Sprintf("slot %d (shared slice %d of replica %d)", j, s, ri.EPRank)
				}
				exp, err := k.slotBytes(pl, st, bank, int64(ri.MoETPRank))
				if err != nil {
					return fmt.Errorf("rank %d: layer %s: %s: %w", ri.Rank, family.KeyLabel(li.Index), what, err)
				}
				if int64(len(exp)) != per {
					return fail("rank %d: layer %s: %s: %s has %d bytes a slot, SRC's expert gives %d", ri.Rank, family.KeyLabel(li.Index), what, st.name, per, len(exp))
				}
				got := make([]byte, per)
				if err := readFull(sec, got, int64(j)*per); err != nil {
					return err
				}
				k.res.DSTBytesRead += per
				if at := firstDiff(got, exp); at >= 0 {
					return fail("rank %d: layer %s: %s: %s differs from SRC's expert at byte %d of the slot", ri.Rank, family.KeyLabel(li.Index), what, st.name, at)
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

// slotBytes predicts one slot's bytes of stack st: bank expert bank of
// the whole model's stack as the byte proof predicts it (byteproof's
// ExpertBytes: cut, transposed, dequantised, requantised and folded as the
// contract says), cut to MoE-TP part t of M (cutPart).
func (k *checker) slotBytes(pl family.Layer, st stack, bank int, t int64) ([]byte, error) {
	// The whole expert is predicted, then cut: under --moe-tp each part's
	// check reads its expert's other parts from SRC too (M times the
	// part's bytes), the price of one prediction for every option.
	b, read, err := k.pred.ExpertBytes(st.name, bank)
	if err != nil {
		return nil, err
	}
	k.res.SRCBytesRead += read
	M := int64(k.x.MoETP)
	if M == 1 {
		return b, nil
	}
	if k.c.Oriented() == layout.InOut {
		return nil, fmt.Errorf("a MoE-TP part of an in-out stack is not predicted")
	}
	return cutPart(b, st, k.f, int64(k.plan.IntermediateOf(pl)), int64(k.plan.HiddenSize), M, t)
}

// cutPart is MoE-TP part t of M of one bank expert's bytes b of stack st
// (its projections' pieces one after the other, all of one size), each
// piece cut on the intermediate dimension I of the [I, H] gate and up and
// the [H, I] down stored as f: gate and up rows [t*I/M, (t+1)*I/M) and
// down columns, with the scale entries that cover them; a per-tensor
// scale whole in every part; gate and up biases their rows, and the down
// bias on part 0 alone, zeros in the others, so the parts' sum adds it
// once (CONTRACT.md, "Expert biases under --moe-tp").
func cutPart(b []byte, st stack, f weightfmt.Format, I, H, M, t int64) ([]byte, error) {
	n := int64(len(b)) / int64(len(st.projs))
	Ir := I / M
	var out []byte
	for i, pj := range st.projs {
		piece := b[int64(i)*n : int64(i+1)*n]
		var r weightfmt.Region
		switch st.role {
		case layout.RoleWeight, layout.RoleScale:
			var sl weightfmt.Slice
			if pj == layout.ProjDown {
				sl = weightfmt.Matrix{Format: f, Rows: H, Cols: I}.ColBlock(t*Ir, Ir)
			} else {
				sl = weightfmt.Matrix{Format: f, Rows: I, Cols: H}.RowBlock(t*Ir, Ir)
			}
			r = sl.Weight
			if st.role == layout.RoleScale {
				r = sl.Scale
			}
		case layout.RoleBias:
			if pj == layout.ProjDown {
				if t == 0 {
					out = append(out, piece...)
				} else {
					out = append(out, make([]byte, n)...)
				}
				continue
			}
			es := n / I
			if es*I != n {
				return nil, fmt.Errorf("a %s bias of %d bytes is not %d values", pj, n, I)
			}
			r = weightfmt.Region{Off: t * Ir * es, Rows: 1, RowLen: Ir * es, Stride: Ir * es}
		default: // a per-tensor scalar: whole in every part
			r = weightfmt.Region{Rows: 1, RowLen: n, Stride: n}
		}
		for _, rg := range r.Ranges() {
			if rg[0] < 0 || rg[1] > n {
				return nil, fmt.Errorf("%s's part %d of %d reaches past its %d bytes", pj, t, M, n)
			}
			out = append(out, piece[rg[0]:rg[1]]...)
		}
	}
	return out, nil
}
