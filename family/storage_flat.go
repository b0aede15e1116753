package family

import "fmt"

// flatExperts: the experts flattened on disk (DBRX's experts.mlp.w1, v1,
// w2), relative to the MoE module: gate, up and down of every expert in
// one [E*I, H] tensor each, expert e's rows e*I..(e+1)*I-1; the down
// tensor's rows hold each expert's down projection transposed.
type flatExperts struct{ proj [3]string }

func (st flatExperts) experts(k *checker, where, prefix string, _ []string) ([]MLP, error) {
	p := k.p
	var flat [3]string
	for j, t := range st.proj {
		flat[j] = prefix + "." + t
	}
	hint := fmt.Sprintf("(E=%d, H=%d, I=%d: experts flattened on disk)", p.NumExperts, p.HiddenSize, p.MoEIntermediateSize)
	if err := k.flat(where, flat, hint); err != nil {
		return nil, err
	}
	out := make([]MLP, p.NumExperts)
	for e := range out {
		var err error
		if out[e], err = k.flatViews(fmt.Sprintf("%s: expert %d", where, e), flat, e, hint); err != nil {
			return nil, err
		}
	}
	return out, nil
}
