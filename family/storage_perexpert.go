package family

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/moeprep/moeprep/weightfmt"
)

// perExpert: each expert's projections are tensors of their own under
// <experts>.<id>. (Mixtral's experts.3.w1.weight), the hub's usual layout.
type perExpert struct{ n naming }

func (st perExpert) experts(k *checker, where, prefix string, names []string) ([]MLP, error) {
	p, n := k.p, st.n
	if err := st.scan(where, prefix, names, p, p.Quantization.scaleDTypeRead(), p.Quantization == QuantInt4Pack); err != nil {
		return nil, err
	}
	out := make([]MLP, p.NumExperts)
	hint := fmt.Sprintf("(H=%d, I=%d)", p.HiddenSize, p.MoEIntermediateSize)
	for e := range out {
		w := fmt.Sprintf("%s: expert %d", where, e)
		ep := prefix + "." + n.experts + "." + strconv.Itoa(e)
		var err error
		if out[e], err = k.mlp(w, ep, n.proj, p.MoEIntermediateSize, hint); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// scan rejects tensors under the experts container that no expert slot
// accounts for: ids >= E, or names other than the three projections and
// their block scales (or, scaled is set, their weight_scale: FP8 per
// channel or per tensor), or the tensors the plan's format names for a
// projection (TensorsOf: packed weights, global and activation scales).
func (st perExpert) scan(where, prefix string, names []string, p *Plan, scaled, packed bool) error {
	numExperts := p.NumExperts
	tails := map[string]bool{}
	if f, err := p.Format(); err == nil {
		for _, pr := range st.n.proj {
			if pr == "" {
				continue // ungated: no gate projection
			}
			tn := weightfmt.TensorsOf(f, pr+".weight")
			for _, n := range []string{tn.Weight, tn.Scale, tn.Global, tn.Shape, tn.Input} {
				tails[n] = n != ""
			}
		}
	}
	ep := prefix + "." + st.n.experts + "."
	for _, name := range names {
		rest, ok := strings.CutPrefix(name, ep)
		if !ok || st.n.biasInExperts(name) {
			continue
		}
		seg, tail, _ := strings.Cut(rest, ".")
		id, ok := parseIndex(seg)
		if !ok {
			return fmt.Errorf("%s: unexpected tensor %s", where, name)
		}
		if id >= numExperts && id < numExperts+p.ZeroExperts && (tail == st.n.proj[0]+".weight" || tail == st.n.proj[1]+".weight") {
			// LongCat-Flash: transformers holds gate_up_proj for all E+Z
			// experts and saves the zero-compute ones' gate and up too,
			// which nothing reads; carried byte for byte
			continue
		}
		if id >= numExperts {
			return fmt.Errorf("%s: expert %d: tensor %s is beyond num_experts=%d", where, id, name, numExperts)
		}
		known := false
		for _, pr := range st.n.proj {
			if pr == "" {
				continue
			}
			known = known || tail == pr+".weight" || tail == pr+".weight_scale_inv" || scaled && tail == pr+".weight_scale" ||
				packed && (tail == pr+".weight_packed" || tail == pr+".weight_shape" || tail == pr+".weight_zero_point" || tail == pr+".weight_g_idx") ||
				tails[tail]
		}
		if !known {
			return fmt.Errorf("%s: expert %d: unexpected tensor %s", where, id, name)
		}
	}
	return nil
}
