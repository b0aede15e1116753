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
	x0 := c.ExpertParallel
	sck, plan, err := openPlanned(src)
	if err != nil {
		return nil, err
	}
	defer sck.Close()
	if i < 0 || i >= len(plan.Layers) || i >= len(c.Layers) {
		return nil, fmt.Errorf("layer %d of %d", i, len(plan.Layers))
	}
	routedOnly := plan.Layers[i]
	// Inkling's router-weighted shared experts too: they are whole on
	// every rank, not cut by --moe-tp, so a part would read them at I/M.
	routedOnly.Shared, routedOnly.SharedGate, routedOnly.SharedExperts = nil, "", nil
	cov, err := moelayer.NewCoverage(moelayer.CoverageOptions{Seed: seed, Layer: routedOnly.Index, H: plan.HiddenSize, E: plan.NumExperts, K: plan.TopK})
	if err != nil {
		return nil, err
	}
	opts := cpuref.RefOptions{Coverage: cov}
	want, err := cpuref.ReferenceLayer(ctx, sck, plan, &routedOnly, x, T, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	dck, err := checkpoint.Open(dst) // the shared files: routers
	if err != nil {
		return nil, err
	}
	defer dck.Close()
	ranks := map[int]*safetensors.Sharded{}
	defer func() {
		for _, s := range ranks {
			s.Close()
		}
	}()
	M := x0.MoETP
	I := plan.IntermediateOf(plan.Layers[i])
	row := x0.PhysicalToLogical[i]
	per := x0.SlotsPerRank
	got := make([]float32, len(want.Y))
	occ := make([][]int, plan.NumExperts) // each expert's physical slots
	for q, le := range row {
		occ[le] = append(occ[le], q)
	}
	most := 0
	for _, o := range occ {
		most = max(most, len(o))
	}
	for t := range M {
		vs := &views{base: dck, virt: map[string]*checkpoint.Tensor{}}
		part := *plan
		part.MoEIntermediateSize = I / M
		if c.RoutedScalingFactorFolded {
			part.RoutedScalingFactor = 1 // in the routed down projections already
		}
		l := routedOnly
		if l.Intermediate > 0 {
			l.Intermediate = I / M
		}
		l.Experts = make([]family.MLP, len(routedOnly.Experts))
		for e := range l.Experts {
			if len(occ[e]) == 0 {
				return nil, fmt.Errorf("layer %d: expert %d has no slot", c.Layers[i].Index, e)
			}
			p := occ[e][min(replica, len(occ[e])-1)]
			r := (p/per)*M + t
			sh, ok := ranks[r]
			if !ok {
				ri, _ := x0.Rank(r)
				if sh, err = safetensors.OpenSharded(filepath.Join(dst, filepath.FromSlash(path.Dir(ri.Index)))); err != nil {
					return nil, err
				}
				ranks[r] = sh
			}
			if l.Experts[e], err = vs.expert(c, c.Layers[i], routedOnly.Experts[e], sh, r, p%per, e); err != nil {
				return nil, err
			}
		}
		popts := opts
		popts.NoZeroExperts = t > 0 // the identity experts' output, once in the sum
		res, err := cpuref.ReferenceLayer(ctx, vs, &part, &l, x, T, popts)
		if err != nil {
			return nil, fmt.Errorf("%s: part %d: %w", dst, t, err)
		}
		for k, v := range res.Y {
			got[k] += v
		}
	}
	return &Recomposed{Got: got, Want: want.Y, Replicas: most}, nil
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
