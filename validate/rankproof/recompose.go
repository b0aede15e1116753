package rankproof

import (
	"context"
	"fmt"
	"io"
	"path"
	"path/filepath"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/moelayer"
)

// Recomposed is one MoE layer's routed experts run as the ranks serve
// them, beside the same on SRC.
type Recomposed struct {
	// Got, Want [T+forced, H]: the ranks' parts summed; SRC's routed
	// experts. The rows past T are the forced tokens that route to every
	// logical expert (moelayer.NewCoverage).
	Got, Want []float32
	// Replicas is the most replicas any expert of the layer has: replica
	// choices 0..Replicas-1 exercise every physical slot.
	Replicas int
}

// RecomposeRouted runs contract layer i's routed experts (the shared
// expert left out: its bytes are the byte proof's) on tokens x [T,H], and
// forced tokens (drawn from seed) that route to every logical expert, as
// a per-rank output serves them: each token's logical experts through the
// physical slot of their replica-th replica (their last where they have
// fewer), on the rank that holds it, each MoE-TP part computed from that
// rank's slice alone, the parts summed; and the same layer on SRC. Both
// run the unfused CPU reference (cpuref.ReferenceLayer), the ranks' side
// over views of their stacks' slots, so the sum equals SRC's to the
// order of the float additions (and the rounding of a folded
// routed_scaling_factor).
func RecomposeRouted(ctx context.Context, src, dst string, i int, x []float32, T, replica int, seed uint64) (*Recomposed, error) {
	rc, err := openRecomposer(src, dst)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	l, err := rc.layer(i, seed)
	if err != nil {
		return nil, err
	}
	want, err := cpuref.ReferenceLayer(ctx, rc.src, rc.plan, &l.routed, x, T, cpuref.RefOptions{Coverage: l.cov})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	got, err := rc.cpuParts(ctx, l, x, T, replica)
	if err != nil {
		return nil, err
	}
	return &Recomposed{Got: got, Want: want.Y, Replicas: l.most}, nil
}

// recomposer is what a recomposition reads: SRC planned, DST's contract
// and shared files (the routers), and the ranks' stacks, each opened the
// first time a slot of it serves.
type recomposer struct {
	srcDir, dst string
	c           *layout.Contract
	x           *layout.ExpertParallel
	src         *checkpoint.Checkpoint
	plan        *family.Plan
	dck         *checkpoint.Checkpoint
	ranks       map[int]*safetensors.Sharded
}

func openRecomposer(src, dst string) (*recomposer, error) {
	c, err := readContract(dst)
	if err != nil {
		return nil, err
	}
	if c == nil || c.ExpertParallel == nil {
		return nil, fmt.Errorf("%s: not a per-rank output", dst)
	}
	// Expert biases (gpt-oss) are a role of their own: each slot's bias
	// rows are viewed like its weights; under --moe-tp the down bias is on
	// part 0 alone (zeros in the others), so the parts' sum adds it once.
	// An in-out slot is read back transposed, and a dequantised one plain
	// (views.expert).
	sck, plan, err := openPlanned(src)
	if err != nil {
		return nil, err
	}
	dck, err := checkpoint.Open(dst) // the shared files: routers
	if err != nil {
		sck.Close()
		return nil, err
	}
	return &recomposer{srcDir: src, dst: dst, c: c, x: c.ExpertParallel, src: sck, plan: plan, dck: dck, ranks: map[int]*safetensors.Sharded{}}, nil
}

func (rc *recomposer) Close() {
	for _, s := range rc.ranks {
		s.Close()
	}
	rc.dck.Close()
	rc.src.Close()
}

// recomposedLayer is contract layer i's routed experts on SRC, its forced
// tokens, and where each logical expert's replicas are.
type recomposedLayer struct {
	i      int
	routed family.Layer // SRC's layer, its shared experts left out
	cov    *moelayer.Coverage
	occ    [][]int // each logical expert's physical slots
	most   int     // the most replicas any expert has
}

func (rc *recomposer) layer(i int, seed uint64) (*recomposedLayer, error) {
	plan, c := rc.plan, rc.c
	if i < 0 || i >= len(plan.Layers) || i >= len(c.Layers) {
		return nil, fmt.Errorf("layer %d of %d", i, len(plan.Layers))
	}
	l := &recomposedLayer{i: i, routed: plan.Layers[i]}
	// Inkling's router-weighted shared experts too: they are whole on
	// every rank, not cut by --moe-tp, so a part would read them at I/M.
	l.routed.Shared, l.routed.SharedGate, l.routed.SharedExperts = nil, "", nil
	var err error
	if l.cov, err = moelayer.NewCoverage(moelayer.CoverageOptions{Seed: seed, Layer: l.routed.Index, H: plan.HiddenSize, E: plan.NumExperts, K: plan.TopK}); err != nil {
		return nil, err
	}
	l.occ = make([][]int, plan.NumExperts)
	for q, le := range rc.x.PhysicalToLogical[i] {
		l.occ[le] = append(l.occ[le], q)
	}
	for e, o := range l.occ {
		if len(o) == 0 {
			return nil, fmt.Errorf("layer %d: expert %d has no slot", c.Layers[i].Index, e)
		}
		l.most = max(l.most, len(o))
	}
	return l, nil
}

// part is MoE-TP part t of layer l as the ranks serve it: the plan and
// layer of SRC's routed experts at I/M, each expert a view of the slot of
// its replica-th replica (its last where it has fewer) on the rank that
// holds that slot's part t.
func (rc *recomposer) part(l *recomposedLayer, t, replica int) (*family.Plan, *family.Layer, *views, error) {
	plan, c, x := rc.plan, rc.c, rc.x
	M, per := x.MoETP, x.SlotsPerRank
	I := plan.IntermediateOf(plan.Layers[l.i])
	vs := &views{base: rc.dck, virt: map[string]*checkpoint.Tensor{}}
	part := *plan
	part.MoEIntermediateSize = I / M
	if c.RoutedScalingFactorFolded {
		part.RoutedScalingFactor = 1 // in the routed down projections already
	}
	pl := l.routed
	if pl.Intermediate > 0 {
		pl.Intermediate = I / M
	}
	pl.Experts = make([]family.MLP, len(l.routed.Experts))
	for e := range pl.Experts {
		p := l.occ[e][min(replica, len(l.occ[e])-1)]
		r := (p/per)*M + t
		sh, ok := rc.ranks[r]
		if !ok {
			ri, _ := x.Rank(r)
			var err error
			if sh, err = safetensors.OpenSharded(filepath.Join(rc.dst, filepath.FromSlash(path.Dir(ri.Index)))); err != nil {
				return nil, nil, nil, err
			}
			rc.ranks[r] = sh
		}
		var err error
		if pl.Experts[e], err = vs.expert(c, c.Layers[l.i], l.routed.Experts[e], sh, r, p%per, e); err != nil {
			return nil, nil, nil, err
		}
	}
	return &part, &pl, vs, nil
}

// partRun computes one MoE-TP part t of a layer over the ranks' views.
type partRun func(t int, part *family.Plan, pl *family.Layer, vs *views) ([]float32, error)

// sumParts sums run's outputs over layer l's MoE-TP parts, each expert
// through its replica-th replica.
func (rc *recomposer) sumParts(l *recomposedLayer, replica int, run partRun) ([]float32, error) {
	var got []float32
	for t := range rc.x.MoETP {
		part, pl, vs, err := rc.part(l, t, replica)
		if err != nil {
			return nil, err
		}
		y, err := run(t, part, pl, vs)
		if err != nil {
			return nil, fmt.Errorf("%s: part %d: %w", rc.dst, t, err)
		}
		if got == nil {
			got = make([]float32, len(y))
		}
		for k, v := range y {
			got[k] += v
		}
	}
	return got, nil
}

// cpuParts sums layer l's MoE-TP parts, each run by the CPU reference.
func (rc *recomposer) cpuParts(ctx context.Context, l *recomposedLayer, x []float32, T, replica int) ([]float32, error) {
	return rc.sumParts(l, replica, func(t int, part *family.Plan, pl *family.Layer, vs *views) ([]float32, error) {
		opts := cpuref.RefOptions{Coverage: l.cov}
		opts.NoZeroExperts = t > 0 // the identity experts' output, once in the sum
		res, err := cpuref.ReferenceLayer(ctx, vs, part, pl, x, T, opts)
		if err != nil {
			return nil, err
		}
		return res.Y, nil
	})
}

// views serves the shared files' tensors and, by made-up names, an
// expert's tensors as views of one slot of a rank's stacks.
type views struct {
	base *checkpoint.Checkpoint
	virt map[string]*checkpoint.Tensor
}

func (v *views) Tensor(name string) (*checkpoint.Tensor, bool) {
	if t, ok := v.virt[name]; ok {
		return t, true
	}
	return v.base.Tensor(name)
}

// expert is SRC's expert m (its roles) as views of local slot j of rank
// r's stacks in layer li.
func (v *views) expert(c *layout.Contract, li layout.LayerInfo, m family.MLP, sh *safetensors.Sharded, r, j, e int) (family.MLP, error) {
	names := c.Names(li)
	var out family.MLP
	dequantised := c.Dequantized != nil
	for _, pj := range layout.MLPProjs {
		for role := range layout.NumRole {
			if m.Get(pj, role) == "" || role == layout.RoleShape {
				continue
			}
			if dequantised && role != layout.RoleWeight && role != layout.RoleBias {
				continue // dequantised with them: DST has the plain weight alone
			}
			stack, half := names.Get(pj, role), -1
			fused := c.Layout == layout.GateUp || c.Layout == layout.UpGate
			if fused && pj != layout.ProjDown {
				stack, half = names.Get(layout.ProjGateUp, role), 0
				if (pj == layout.ProjUp) == (c.Layout == layout.GateUp) {
					half = 1
				}
			}
			if role == layout.RoleBias {
				// the bias stacks are named apart from the weights'
				// (layout.BiasNames), in the same order and halves
				stack = ""
				if bn, ok := c.Biases(li); ok {
					stack = map[layout.Proj]string{layout.ProjGate: bn.Gate, layout.ProjUp: bn.Up, layout.ProjDown: bn.Down}[pj]
					if half >= 0 {
						stack = bn.GateUp
					}
				}
			}
			if stack == "" {
				return out, fmt.Errorf("rank %d: no stack holds %s's %s role %d", r, m.Get(pj, role), pj, role)
			}
			f, ti, ok := sh.Lookup(stack)
			if !ok {
				return out, fmt.Errorf("rank %d: stack %s is missing", r, stack)
			}
			sec, err := f.Section(stack)
			if err != nil {
				return out, err
			}
			slot := ti.NumBytes() / ti.Shape[0]
			shape := append([]int64(nil), ti.Shape[1:]...)
			off := int64(j) * slot
			name := fmt.Sprintf("rank%d.slot%d.expert%d.%s.%d", r, j, e, pj, role)
			if c.Oriented() == layout.InOut && (role == layout.RoleWeight || role == layout.RoleScale) && len(shape) == 2 {
				// [in, out] (gate-up: [in, 2 out], the gate's columns
				// first or second as the layout says): read back [out, in]
				st := &checkpoint.Tensor{Name: stack, DType: ti.DType, Shape: shape, File: f.Path, Data: io.NewSectionReader(sec, off, slot)}
				c0, n := int64(0), shape[1]
				if half >= 0 {
					n /= 2
					c0 = int64(half) * n
				}
				tr, err := checkpoint.TransposedColumns(st, name, c0, n)
				if err != nil {
					return out, err
				}
				v.virt[name] = tr
				out.Set(pj, role, name)
				continue
			}
			if half >= 0 {
				slot /= 2
				off += int64(half) * slot
				if len(shape) > 0 {
					shape[0] /= 2
				}
			}
			if len(shape) == 1 && shape[0] == 1 {
				shape = nil // a per-tensor scalar
			}
			v.virt[name] = &checkpoint.Tensor{Name: name, DType: ti.DType, Shape: shape, File: f.Path, Data: io.NewSectionReader(sec, off, slot)}
			out.Set(pj, role, name)
		}
	}
	return out, nil
}
