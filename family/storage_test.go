package family

import (
	"reflect"
	"testing"
)

// TestStorageFromNaming checks that each family's naming picks the storage
// its checkpoints use, with the names and flags the storage reads: the
// choice that (*spec).layer's if-chain made before the storages were types.
func TestStorageFromNaming(t *testing.T) {
	hub := func() naming { n := inkling.names; inklingHub(&n); return n }()
	for _, c := range []struct {
		name   string
		n      naming
		routed expertStorage
		shared sharedStorage
	}{
		{"mixtral", mixtral.names, perExpert{n: mixtral.names}, sharedPerProj{named: false, proj: [3]string{"w1", "w3", "w2"}}},
		{"deepseek", deepseek.names, perExpert{n: deepseek.names}, sharedPerProj{named: true, proj: [3]string{"gate_proj", "up_proj", "down_proj"}}},
		{"granitemoe", graniteMoE.names, stackedGateUp{gateUp: "input_linear.weight", down: "output_linear.weight"},
			sharedGateUp{gateUp: "input_linear.weight", down: "output_linear.weight"}},
		{"llama4", llama4.names, stackedGateUp{gateUp: "experts.gate_up_proj", down: "experts.down_proj", transposed: true},
			sharedPerProj{named: true, proj: [3]string{"gate_proj", "up_proj", "down_proj"}}},
		{"gpt_oss", gptOSS.names, stackedGateUp{gateUp: "experts.gate_up_proj", down: "experts.down_proj",
			gateUpBias: "experts.gate_up_proj_bias", downBias: "experts.down_proj_bias", transposed: true, interleaved: true},
			sharedPerProj{named: false}},
		{"step3p5", step3p5.names, stackedPerProj{proj: [3]string{"gate_proj.weight", "up_proj.weight", "down_proj.weight"}},
			sharedPerProj{named: true, proj: [3]string{"gate_proj", "up_proj", "down_proj"}}},
		{"dbrx", dbrx.names, flatExperts{proj: [3]string{"experts.mlp.w1", "experts.mlp.v1", "experts.mlp.w2"}},
			sharedPerProj{named: false, proj: dbrx.names.proj}},
		{"inkling", inkling.names, stackedGateUp{gateUp: "experts.gate_up_proj", down: "experts.down_proj"},
			sharedStacked{n: inkling.names, first: "gate_proj"}},
		{"inkling hub", hub, stackedGateUp{gateUp: "experts.w13_weight", down: "experts.w2_weight", interleaved: true},
			sharedStacked{n: hub, first: "shared_w13_weight"}},
	} {
		if got := c.n.storage(); !reflect.DeepEqual(got, c.routed) {
			t.Errorf("%s: routed storage %#v, want %#v", c.name, got, c.routed)
		}
		if got := c.n.sharedStorage(); !reflect.DeepEqual(got, c.shared) {
			t.Errorf("%s: shared storage %#v, want %#v", c.name, got, c.shared)
		}
	}
}
