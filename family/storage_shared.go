package family

import "fmt"

// sharedPerProj: one shared MLP of per-projection tensors under the shared
// module (DeepSeek's shared_experts.gate_proj.weight), with their biases
// where config.json turns them on (checker.sharedBias: ERNIE 4.5).
type sharedPerProj struct {
	named bool      // the family names a shared module (naming.shared)
	proj  [3]string // naming.sharedProjections
}

func (st sharedPerProj) present(k *checker, sp string) bool {
	return st.named && k.anyOf(sp, st.proj)
}

func (st sharedPerProj) plan(k *checker, where, sp string, out *Layer) error {
	p := k.p
	hint := fmt.Sprintf("(H=%d, shared I=%d)", p.HiddenSize, p.SharedIntermediateSize)
	k.inShared = true
	shared, err := k.mlp(where+": shared expert", sp, st.proj, p.SharedIntermediateSize, hint)
	k.inShared = false
	if err == nil && k.sharedBias {
		err = k.mlpBiases(where+": shared expert", sp, st.proj, p.SharedIntermediateSize, &shared)
	}
	if err != nil {
		return err
	}
	out.Shared = &shared
	return nil
}

// sharedGateUp: one shared MLP storing gate and up rows in one [2I, H]
// tensor and down [H, I], relative to the shared module; planned as views.
type sharedGateUp struct{ gateUp, down string }

func (st sharedGateUp) present(k *checker, sp string) bool {
	_, ok := k.t.Lookup(sp + "." + st.gateUp)
	return ok
}

func (st sharedGateUp) plan(k *checker, where, sp string, out *Layer) error {
	p := k.p
	hint := fmt.Sprintf("(H=%d, shared I=%d)", p.HiddenSize, p.SharedIntermediateSize)
	shared, err := k.views(where+": shared expert", sp+"."+st.gateUp, sp+"."+st.down, -1, p.SharedIntermediateSize, false, false, hint)
	if err != nil {
		return err
	}
	out.Shared = &shared
	return nil
}

// sharedStacked: the S shared experts stacked under the shared module, one
// tensor per projection or gate and up in one (Inkling; checker.sharedStack
// reads naming.sharedStackedGateUp to tell); first is the stack whose
// presence says the layer holds them.
type sharedStacked struct {
	n     naming
	first string
}

func (st sharedStacked) present(k *checker, sp string) bool {
	_, ok := k.t.Lookup(sp + "." + st.first)
	return ok
}

func (st sharedStacked) plan(k *checker, where, sp string, out *Layer) error {
	var err error
	out.SharedExperts, err = k.sharedStack(where, sp, st.n)
	return err
}
