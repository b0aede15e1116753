// Package layout names the tensors moeprep writes for a converted MoE layer and
// defines the contract (the "moeprep" object of the output config.json) that
// serving engines and `moeprep validate` read to know what was done.
package layout

import (
	"fmt"
	"strings"
)

// Layout is how a layer's experts are stacked in the output.
type Layout string

const (
	// Stacked keeps gate, up and down as three stacks: all_gate, all_up [E,I,H], all_down [E,H,I].
	Stacked Layout = "stacked"
	// GateUp concatenates each expert's gate rows then up rows: gate_up_proj [E,2I,H]
	// (transformers 5, vLLM and SGLang hold this in memory), plus down_proj [E,H,I].
	GateUp Layout = "gate-up"
	// UpGate is GateUp with up rows first (TensorRT-LLM's w3_w1 order): up_gate_proj [E,2I,H].
	UpGate Layout = "up-gate"
)

// Layouts lists every layout, default first.
var Layouts = []Layout{Stacked, GateUp, UpGate}

// Parse reads a --layout value; "" means Stacked.
func Parse(s string) (Layout, error) {
	if s == "" {
		return Stacked, nil
	}
	for _, l := range Layouts {
		if strings.EqualFold(s, string(l)) {
			return l, nil
		}
	}
	return "", fmt.Errorf("unknown layout %q (want stacked, gate-up or up-gate)", s)
}

// Fused reports whether gate and up share one tensor.
func (l Layout) Fused() bool { return l == GateUp || l == UpGate }

func (l Layout) String() string { return string(l) }
