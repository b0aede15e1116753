// Package layout names the tensors moeprep writes for a converted MoE layer and
// defines the contract (the "moeprep" object of the output config.json) that
// serving engines and `moeprep validate` read to know what was done.
package layout

import (
	"fmt"
	"strings"

	"github.com/moeprep/moeprep/weightfmt"
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
	// AsStored keeps every expert tensor as the source checkpoint stores
	// it: its own names, orientation and interleaving, byte for byte. It
	// is what --layout transformers writes for the families transformers
	// 5 holds in memory as their checkpoints store them (aria's fc1/fc2,
	// DBRX's flat w1/v1/w2, gpt-oss's interleaved gate_up_proj and
	// biases), or in a form moeprep's stacks do not write, which it builds
	// from the checkpoint itself on load (LongCat-Flash, Nemotron-H): no
	// stacks of moeprep's naming exist in such an output.
	AsStored Layout = "as-stored"
	// Transformers is a request, never a stored layout: the form
	// transformers 5 holds each family's experts in (the family's data,
	// family.Plan.Transformers), resolved by convert to GateUp in the
	// family's orientation or to AsStored.
	Transformers Layout = "transformers"
)

// Layouts lists every layout convert stacks experts into, default first.
var Layouts = []Layout{Stacked, GateUp, UpGate}

// Parse reads a --layout value; "" means Stacked. Transformers is
// accepted (convert resolves it per family); AsStored is not asked for by
// name, only reached through Transformers.
func Parse(s string) (Layout, error) {
	if s == "" {
		return Stacked, nil
	}
	for _, l := range append(Layouts, Transformers) {
		if strings.EqualFold(s, string(l)) {
			return l, nil
		}
	}
	return "", fmt.Errorf("unknown layout %q (want stacked, gate-up, up-gate or transformers)", s)
}

// Fused reports whether gate and up share one tensor.
func (l Layout) Fused() bool { return l == GateUp || l == UpGate }

func (l Layout) String() string { return string(l) }

// Orientation is how each expert's matrix lies in a stack.
type Orientation string

const (
	// OutIn is [out, in] per expert, as nn.Linear holds its weight:
	// all_gate [E,I,H], all_down [E,H,I], gate_up_proj [E,2I,H]. The default;
	// the contract leaves it out.
	OutIn Orientation = "out-in"
	// InOut is the transpose, [in, out] per expert, for x @ W (K-major B):
	// all_gate [E,H,I], all_down [E,I,H], gate_up_proj [E,H,2I] (each row
	// H the gate's I values, then the up's); scale grids transposed with
	// their weights.
	InOut Orientation = "in-out"
)

// ParseOrientation reads an --orientation value; "" means OutIn.
func ParseOrientation(s string) (Orientation, error) {
	switch {
	case s == "" || strings.EqualFold(s, string(OutIn)):
		return OutIn, nil
	case strings.EqualFold(s, string(InOut)):
		return InOut, nil
	}
	return "", fmt.Errorf("unknown orientation %q (want out-in or in-out)", s)
}

// TransposeRefusal says why weights stored in f cannot be written in-out
// ("" when they can): a format that packs several elements into a unit
// along the row (INT4 eight to an I32, FP4 two to a byte) has no
// byte-exact transpose, and would have to be unpacked and repacked.
func TransposeRefusal(f weightfmt.Format) string {
	if e, _ := packingOf(f); e > 1 {
		return fmt.Sprintf("%s (%s) packs %d elements per unit along each row, so its experts have no byte-exact transpose: --orientation in-out takes weights of one element per unit (bf16, f16, f32, FP8)",
			f, f.Quantization(), e)
	}
	return ""
}
