package family

import "fmt"

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
