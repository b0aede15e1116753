package family

import (
	"fmt"
	"slices"
)

// stackedGateUp: the experts stacked on disk, gate and up in one tensor
// (Granite MoE's input_linear, the transformers 5 experts.gate_up_proj):
// [E, 2I, H] holding each expert's gate rows then up rows (interleaved:
// alternating), and down [E, H, I]; transposed, [E, H, 2I] and [E, I, H]
// (Llama 4). Each expert is planned as views of them (view.go). MXFP4
// stacks (gpt-oss's *_blocks and *_scales) and per-expert biases are
// planned here too.
type stackedGateUp struct {
	gateUp, down string // relative to the MoE module
	// gateUpBias [E, 2I] and downBias [E, H], relative to the MoE module;
	// "" if none.
	gateUpBias, downBias string
	// transposed: naming.stackedTransposed; eitherWay:
	// naming.stackedEitherWay; interleaved: naming.stackedInterleaved.
	transposed, eitherWay, interleaved bool
}

func (st stackedGateUp) experts(k *checker, where, prefix string, _ []string) ([]MLP, error) {
	p := k.p
	out := make([]MLP, p.NumExperts)
	gu, dn := prefix+"."+st.gateUp, prefix+"."+st.down
	hint := fmt.Sprintf("(E=%d, H=%d, I=%d: experts stacked on disk)", p.NumExperts, p.HiddenSize, p.MoEIntermediateSize)
	mx := p.Quantization == QuantMXFP4
	transposed := st.transposed
	if st.eitherWay {
		var err error
		if transposed, err = k.stackedOrientation(where, gu, dn, hint); err != nil {
			return nil, err
		}
	}
	if mx {
		if err := k.mxfp4Stacked(where, gu, dn, st.interleaved, hint); err != nil {
			return nil, err
		}
	} else if err := k.stacked(where, gu, dn, transposed, hint); err != nil {
		return nil, err
	}
	for e := range out {
		var err error
		if mx {
			out[e] = k.mxfp4Views(gu, dn, e, p.MoEIntermediateSize, st.interleaved)
		} else if out[e], err = k.views(fmt.Sprintf("%s: expert %d", where, e), gu, dn, e, p.MoEIntermediateSize, transposed, st.interleaved, hint); err != nil {
			return nil, err
		}
		if st.gateUpBias != "" {
			if err := k.expertBiases(fmt.Sprintf("%s: expert %d", where, e), prefix+"."+st.gateUpBias, prefix+"."+st.downBias, e, st.interleaved, &out[e]); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// stackedPerProj: the experts stacked on disk one tensor per projection
// (Step-3.5/3.7's moe.gate_proj.weight, up_proj, down_proj): gate and up
// [E, I, H], down [E, H, I], relative to the MoE module; each expert is
// planned as views of them (checker.separateStacks).
type stackedPerProj struct{ proj [3]string }

func (st stackedPerProj) experts(k *checker, where, prefix string, _ []string) ([]MLP, error) {
	var names [3]string
	for j, t := range st.proj {
		names[j] = prefix + "." + t
	}
	return k.separateStacks(where, names)
}

// stacked checks a family's stacked expert tensors: gate-up [E, 2I, H]
// and down [E, H, I], in an unquantised float dtype (quantised stacked
// sources are not planned: their scales would need views too).
//
// Transposed (Llama 4: x @ W) they are gate-up [E, H, 2I] holding each
// expert's gate columns then up columns, and down [E, I, H].
func (k *checker) stacked(where, gateUp, down string, transposed bool, hint string) error {
	e, h, i := int64(k.p.NumExperts), int64(k.p.HiddenSize), int64(k.p.MoEIntermediateSize)
	gu, dn := []int64{e, 2 * i, h}, []int64{e, h, i}
	if transposed {
		gu, dn = []int64{e, h, 2 * i}, []int64{e, i, h}
	}
	if err := k.wholeStack(where, gateUp, gu, hint); err != nil {
		return err
	}
	return k.wholeStack(where, down, dn, hint)
}

// separateStacks checks experts stacked one tensor per projection, gate
// and up [E, I, H] and down [E, H, I], and plans each expert as its slice
// of the three.
func (k *checker) separateStacks(where string, st [3]string) ([]MLP, error) {
	e, h, i := int64(k.p.NumExperts), int64(k.p.HiddenSize), int64(k.p.MoEIntermediateSize)
	hint := fmt.Sprintf("(E=%d, H=%d, I=%d: experts stacked on disk, one tensor per projection)", e, h, i)
	for j, shape := range [3][]int64{{e, i, h}, {e, i, h}, {e, h, i}} {
		if err := k.wholeStack(where, st[j], shape, hint); err != nil {
			return nil, err
		}
	}
	out := make([]MLP, e)
	for x := range out {
		m := MLPOf(ViewName(st[0], x, 0, 0), ViewName(st[1], x, 0, 0), ViewName(st[2], x, 0, 0))
		if err := k.viewWeights(fmt.Sprintf("%s: expert %d", where, x), m, int(i), hint); err != nil {
			return nil, err
		}
		out[x] = m
	}
	return out, nil
}

// stackedOrientation says whether a layer's stacked gate-up and down
// tensors are stored transposed ([E, H, 2I] and [E, I, H]) or not ([E, 2I,
// H] and [E, H, I]), for a family that meets both. One of the two shapes
// always tells (H = 2I and H = I cannot both hold); where both tell, they
// must agree. A shape that fits neither is left to stacked's check.
func (k *checker) stackedOrientation(where, gateUp, down, hint string) (bool, error) {
	e, h, i := int64(k.p.NumExperts), int64(k.p.HiddenSize), int64(k.p.MoEIntermediateSize)
	says := func(name string, plain, transposed []int64) (known, t bool) {
		meta, ok := k.t.Lookup(name)
		switch {
		case !ok || slices.Equal(plain, transposed):
			return false, false
		case slices.Equal(meta.Shape, transposed):
			return true, true
		case slices.Equal(meta.Shape, plain):
			return true, false
		}
		return false, false
	}
	guKnown, guT := says(gateUp, []int64{e, 2 * i, h}, []int64{e, h, 2 * i})
	dnKnown, dnT := says(down, []int64{e, h, i}, []int64{e, i, h})
	if guKnown && dnKnown && guT != dnT {
		return false, fmt.Errorf("%s: %s is stored %s but %s %s %s", where, gateUp, orientation(guT), down, orientation(dnT), hint)
	}
	return guT || dnT, nil
}

func orientation(transposed bool) string {
	if transposed {
		return "transposed (x @ W)"
	}
	return "as [out, in]"
}
