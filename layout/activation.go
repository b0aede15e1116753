package layout

import (
	"fmt"
	"math"
	"strings"

	"github.com/moeprep/moeprep/moe"
)

// Activation is the gated activation of an expert:
//
//	act(g, u) = g' * sigmoid(Alpha * g') * (u' + UpOffset)
//	g' = min(g, Limit), u' = clamp(u, -Limit, Limit)
//
// or, with ClampAfter, the limit caps the activated gate instead:
//
//	act(g, u) = min(g * sigmoid(Alpha * g), Limit) * (u' + UpOffset)
//
// The zero value is SwiGLU, silu(g) * u (Alpha 1, no limit, offset 0).
// gpt-oss uses Alpha 1.702, Limit 7, UpOffset 1 (its clamped SwiGLU);
// Step-3.7 clamps after the activation (ClampAfter) with per-layer limits.
type Activation struct {
	Alpha    float64 `json:"alpha,omitempty"`     // 0 means 1
	Limit    float64 `json:"limit,omitempty"`     // 0 means no clamp
	UpOffset float64 `json:"up_offset,omitempty"` // added to the (clamped) up projection
	// ClampAfter: Limit caps silu(g), not g (Step-3.7's experts and shared
	// MLP). Meaningless, and left false, without a Limit.
	ClampAfter bool `json:"clamp_after_act,omitempty"`
	// Gate is the gate's nonlinearity: "" is the sigmoid-weighted g above;
	// GateGeluTanh is GeGLU, gelu_tanh(g) * u (Gemma 4's
	// gelu_pytorch_tanh), which takes no alpha, limit or offset.
	Gate string `json:"gate,omitempty"`
	// Beta and LinearBeta are SiTU's (Gate GateSiTU): the gate's tanh
	// width and, where non-zero, the up projection's.
	Beta       float64 `json:"situ_beta,omitempty"`
	LinearBeta float64 `json:"situ_linear_beta,omitempty"`
}

// GateSiTU is Activation.Gate for Kimi K3's SiTU (hidden_act "situ"):
//
//	act(g, u) = Beta tanh(g / Beta) sigmoid(g) * u'
//	u' = LinearBeta tanh(u / LinearBeta), or u where LinearBeta is 0
//
// as SGLang's and vLLM's SituAndMul compute it (in float32 there, here in
// float64 like every other activation). It takes no alpha, limit or offset.
const GateSiTU = "situ"

// SiTU is Kimi K3's activation with its two betas (linearBeta 0: u as is).
func SiTU(beta, linearBeta float64) Activation {
	return Activation{Gate: GateSiTU, Beta: beta, LinearBeta: linearBeta}
}

// GateGeluTanh is Activation.Gate for GeGLU with the tanh approximation
// of gelu: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
const GateGeluTanh = "gelu_tanh"

// GeGLUTanh is Gemma 4's experts' activation, gelu_tanh(g) * u.
func GeGLUTanh() Activation { return Activation{Gate: GateGeluTanh} }

// GateNoneReLU2 is Activation.Gate for ungated experts (Nemotron-H's):
// an expert has no gate projection, only up and down, and act = relu(u)^2
// (transformers' relu2). Its stacks are all_up and all_down alone (no
// all_gate, and no gate-up layout); it takes no alpha, limit or offset.
const GateNoneReLU2 = "none_relu2"

// ReLU2 is Nemotron-H's ungated experts' activation, relu(u)^2.
func ReLU2() Activation { return Activation{Gate: GateNoneReLU2} }

// Ungated reports whether the experts have no gate projection: act reads
// u alone, and the stacks hold up and down only.
func (a Activation) Ungated() bool { return a.Gate == GateNoneReLU2 }

// SwiGLU reports whether a is plain silu(g) * u.
func (a Activation) SwiGLU() bool {
	return (a.Alpha == 0 || a.Alpha == 1) && a.Limit == 0 && a.UpOffset == 0 && a.Gate == ""
}

// Check refuses values no activation could have.
func (a Activation) Check() error {
	for _, v := range []float64{a.Alpha, a.Limit, a.UpOffset, a.Beta, a.LinearBeta} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("activation %+v: not finite", a)
		}
	}
	if a.Alpha < 0 || a.Limit < 0 {
		return fmt.Errorf("activation %+v: alpha and limit must not be negative", a)
	}
	if a.ClampAfter && a.Limit == 0 {
		return fmt.Errorf("activation %+v: clamp_after_act without a limit", a)
	}
	if (a.Beta != 0 || a.LinearBeta != 0) != (a.Gate == GateSiTU) {
		return fmt.Errorf("activation %+v: situ_beta and situ_linear_beta belong to gate %s alone", a, GateSiTU)
	}
	switch a.Gate {
	case "":
	case GateSiTU:
		if a.Beta <= 0 || a.LinearBeta < 0 {
			return fmt.Errorf("activation %+v: SiTU needs a positive beta and a linear beta not negative", a)
		}
		if a.Alpha != 0 || a.Limit != 0 || a.UpOffset != 0 || a.ClampAfter {
			return fmt.Errorf("activation %+v: gate %s takes no alpha, limit or up offset", a, a.Gate)
		}
	case GateGeluTanh, GateNoneReLU2:
		if a.Alpha != 0 || a.Limit != 0 || a.UpOffset != 0 || a.ClampAfter {
			return fmt.Errorf("activation %+v: gate %s takes no alpha, limit or up offset", a, a.Gate)
		}
	default:
		return fmt.Errorf("activation %+v: gate %q is not one moeprep computes (want %q, %q, %q or none)", a, a.Gate, GateGeluTanh, GateNoneReLU2, GateSiTU)
	}
	return nil
}

// Apply is act(g, u) in float64.
func (a Activation) Apply(g, u float64) float64 {
	if a.Ungated() {
		return moe.ReLU2(u)
	}
	if a.Gate == GateGeluTanh {
		return moe.GeluTanh(g) * u
	}
	if a.Gate == GateSiTU {
		return moe.SiTU(g, u, a.Beta, a.LinearBeta)
	}
	if a.ClampAfter {
		return moe.SwiGLUClampedAfter(g, u, a.Alpha, a.Limit, a.UpOffset)
	}
	return moe.ClampedSwiGLU(g, u, a.Alpha, a.Limit, a.UpOffset)
}

// Describe spells out the activation for people: "SwiGLU", or the values
// that differ from it, e.g. "clamped SwiGLU (limit 7, alpha 1.702, up
// offset 1)".
func (a Activation) Describe() string {
	if a.SwiGLU() {
		return "SwiGLU"
	}
	if a.Gate == GateGeluTanh {
		return "GeGLU (tanh gelu)"
	}
	if a.Ungated() {
		return "relu2, relu(up)^2"
	}
	if a.Gate == GateSiTU {
		return fmt.Sprintf("SiTU (beta %g, linear beta %g)", a.Beta, a.LinearBeta)
	}
	alpha := a.Alpha
	if alpha == 0 {
		alpha = 1
	}
	var parts []string
	if a.Limit > 0 {
		parts = append(parts, fmt.Sprintf("limit %g", a.Limit))
	}
	if alpha != 1 {
		parts = append(parts, fmt.Sprintf("alpha %g", alpha))
	}
	if a.UpOffset != 0 {
		parts = append(parts, fmt.Sprintf("up offset %g", a.UpOffset))
	}
	name := "SwiGLU variant"
	switch {
	case a.Limit > 0 && a.ClampAfter:
		name = "SwiGLU with silu(gate) capped"
	case a.Limit > 0:
		name = "clamped SwiGLU"
	}
	return name + " (" + strings.Join(parts, ", ") + ")"
}

// ClampedAfter is Step-3.7's activation with limit L (0: SwiGLU, the
// layers its config leaves unclamped).
func ClampedAfter(limit float64) Activation {
	if limit == 0 {
		return Activation{}
	}
	return Activation{Limit: limit, ClampAfter: true}
}

// ExpertBiases names a layer's stacked expert biases (gpt-oss): per expert
// the gate and up biases [I] (or, fused, one [2I] in the layout's order) and
// the down bias [H].
type ExpertBiases struct {
	Gate, Up, GateUp, Down string
}

// BiasNames gives the bias stacks that go with Names(l, moePrefix, ...).
func BiasNames(l Layout, moePrefix string) ExpertBiases {
	return BiasNamesIn(l, moePrefix, "")
}

// BiasNamesIn is BiasNames with the stacks under module (ExpertsPrefixIn).
func BiasNamesIn(l Layout, moePrefix, module string) ExpertBiases {
	p := ExpertsPrefixIn(l, moePrefix, module)
	switch l {
	case GateUp:
		return ExpertBiases{GateUp: p + ".gate_up_proj_bias", Down: p + ".down_proj_bias"}
	case UpGate:
		return ExpertBiases{GateUp: p + ".up_gate_proj_bias", Down: p + ".down_proj_bias"}
	}
	return ExpertBiases{Gate: p + ".all_gate.bias", Up: p + ".all_up.bias", Down: p + ".all_down.bias"}
}
