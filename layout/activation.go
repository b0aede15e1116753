package layout

import (
	"fmt"
	"math"

	"github.com/moeprep/moeprep/moe"
)

// Activation is the gated activation of every expert of a layer:
//
//	act(g, u) = g' * sigmoid(Alpha * g') * (u' + UpOffset)
//	g' = min(g, Limit), u' = clamp(u, -Limit, Limit)
//
// The zero value is SwiGLU, silu(g) * u (Alpha 1, no limit, offset 0).
// gpt-oss uses Alpha 1.702, Limit 7, UpOffset 1 (its clamped SwiGLU).
type Activation struct {
	Alpha    float64 `json:"alpha,omitempty"`     // 0 means 1
	Limit    float64 `json:"limit,omitempty"`     // 0 means no clamp
	UpOffset float64 `json:"up_offset,omitempty"` // added to the (clamped) up projection
}

// SwiGLU reports whether a is plain silu(g) * u.
func (a Activation) SwiGLU() bool { return a == Activation{} || a == Activation{Alpha: 1} }

// Check refuses values no activation could have.
func (a Activation) Check() error {
	for _, v := range []float64{a.Alpha, a.Limit, a.UpOffset} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("activation %+v: not finite", a)
		}
	}
	if a.Alpha < 0 || a.Limit < 0 {
		return fmt.Errorf("activation %+v: alpha and limit must not be negative", a)
	}
	return nil
}

// Apply is act(g, u) in float64.
func (a Activation) Apply(g, u float64) float64 {
	return moe.ClampedSwiGLU(g, u, a.Alpha, a.Limit, a.UpOffset)
}

// ExpertBiases names a layer's stacked expert biases (gpt-oss): per expert
// the gate and up biases [I] (or, fused, one [2I] in the layout's order) and
// the down bias [H].
type ExpertBiases struct {
	Gate, Up, GateUp, Down string
}

// BiasNames gives the bias stacks that go with Names(l, moePrefix, ...).
func BiasNames(l Layout, moePrefix string) ExpertBiases {
	p := ExpertsPrefix(l, moePrefix)
	switch l {
	case GateUp:
		return ExpertBiases{GateUp: p + ".gate_up_proj_bias", Down: p + ".down_proj_bias"}
	case UpGate:
		return ExpertBiases{GateUp: p + ".up_gate_proj_bias", Down: p + ".down_proj_bias"}
	}
	return ExpertBiases{Gate: p + ".all_gate.bias", Up: p + ".all_up.bias", Down: p + ".all_down.bias"}
}
