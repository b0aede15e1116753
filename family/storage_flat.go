package family

import (
	"fmt"
	"strconv"
)

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

// flat checks a family's flattened experts (DBRX): gate, up and down each
// one [E*I, H] tensor.
func (k *checker) flat(where string, names [3]string, hint string) error {
	shape := []int64{int64(k.p.NumExperts) * int64(k.p.MoEIntermediateSize), int64(k.p.HiddenSize)}
	for _, name := range names {
		if err := k.wholeStack(where, name, shape, hint); err != nil {
			return err
		}
	}
	return nil
}

// flatViews plans expert e of flattened experts: rows e*I..(e+1)*I-1 of
// the gate and up tensors, and the same rows of the down tensor read
// transposed to [H, I].
func (k *checker) flatViews(where string, names [3]string, e int, hint string) (MLP, error) {
	i := k.p.MoEIntermediateSize
	r0, r1 := e*i, (e+1)*i
	m := MLPOf(ViewName(names[0], -1, r0, r1), ViewName(names[1], -1, r0, r1), ViewName(names[2], -1, r0, r1)+"[T:0:"+strconv.Itoa(k.p.HiddenSize)+":1]")
	return m, k.viewWeights(where, m, i, hint)
}
