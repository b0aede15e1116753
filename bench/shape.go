// Package bench times moeprep's CUDA kernels and the whole fused MoE layer
// at DeepSeek-V3 shapes and compares each time with the HBM floor: the bytes
// the work must move over the device-to-device copy bandwidth measured in
// the same run. The arithmetic (shapes, byte counts, floors, flag parsing,
// the table) is plain Go and runs anywhere; Run needs a CUDA device.
package bench

import (
	"fmt"

	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
)

// Shape is one MoE layer's dimensions and routing.
type Shape struct {
	H, I           int     // hidden size, expert intermediate size
	Routed         int     // routed experts E
	TopK           int     // routed experts per token
	NGroup         int     // expert groups
	TopKGroup      int     // groups kept per token
	SharedReplicas int     // R: fused shared-expert copies (token t uses copy t mod R)
	SharedSlots    int     // S: shared slots per token
	RSF            float32 // routed_scaling_factor
}

// DeepSeekV3 is the DeepSeek-V3/R1 MoE layer with its shared expert fused
// as 8 replicas of one slot: 264 experts in the bank, 9 slots per token.
func DeepSeekV3() Shape {
	return Shape{H: 7168, I: 2048, Routed: 256, TopK: 8, NGroup: 8, TopKGroup: 4,
		SharedReplicas: 8, SharedSlots: 1, RSF: 2.5}
}

// BankExperts is the fused bank's expert count, E + R*S.
func (s Shape) BankExperts() int { return s.Routed + s.SharedReplicas*s.SharedSlots }

// Slots is the slots per token, TopK + S.
func (s Shape) Slots() int { return s.TopK + s.SharedSlots }

// Contract is the fused bank's layout as convert would write it into
// config.json: E routed experts then R replicas of S shared slices; with rsf
// folded (the fp8 bank) the shared slot's weight is 1 and finalize scales
// by 1; unfolded (the bf16 bank) the shared slot's weight is 1/rsf and
// finalize multiplies by rsf. The gate's shared slots and finalize's scale
// come from it through kernels.FusedGate, as validate's do.
func (s Shape) Contract(folded bool) *layout.Contract {
	w := 1 / s.RSF
	if folded {
		w = 1
	}
	return &layout.Contract{NumExperts: s.Routed, NumFusedSharedExperts: s.SharedReplicas * s.SharedSlots,
		SharedReplicas: s.SharedReplicas, SharedSlices: s.SharedSlots, SharedFirstID: s.Routed,
		SharedSlotWeight: float64(w), RoutedScalingFactor: float64(s.RSF), RoutedScalingFactorFolded: folded}
}

// GateSpec is the gate configuration: sigmoid + correction bias, grouped
// top-k with the sum-of-best-two group score, normalised weights, and the
// contract's shared slots.
func (s Shape) GateSpec(folded bool) kernels.GateSpec {
	gs, _ := kernels.FusedGate(s.route(), s.Contract(folded))
	return gs
}

// FinalizeScale is finalize's multiplier: 1 when rsf is folded, else rsf.
func (s Shape) FinalizeScale(folded bool) float32 {
	_, scale := kernels.FusedGate(s.route(), s.Contract(folded))
	return scale
}

func (s Shape) route() moe.RouteSpec {
	return moe.RouteSpec{Scoring: moe.Sigmoid, NumExperts: s.Routed, TopK: s.TopK,
		NGroup: s.NGroup, TopKGroup: s.TopKGroup, NormTopKProb: true, RoutedScalingFactor: float64(s.RSF)}
}

// Check rejects shapes the byte arithmetic or the kernels cannot take.
func (s Shape) Check() error {
	if s.H <= 0 || s.I <= 0 || s.Routed <= 0 || s.TopK <= 0 || s.SharedSlots < 0 || s.SharedReplicas < 0 || s.RSF <= 0 {
		return fmt.Errorf("bench: bad shape %+v", s)
	}
	return s.GateSpec(false).Check()
}

// DType is the expert weights' type.
type DType string

const (
	BF16 DType = "bf16" // rsf unfolded (runtime multiply), as the bf16 checkpoint is served
	FP8  DType = "fp8"  // float8_e4m3fn with 128x128 f32 block scales, rsf folded
)

// ParseDType reads --dtype.
func ParseDType(s string) (DType, error) {
	switch DType(s) {
	case BF16, FP8:
		return DType(s), nil
	}
	return "", fmt.Errorf("--dtype %q: want bf16 or fp8", s)
}

// Folded reports whether rsf is folded into the weights for this dtype.
func (d DType) Folded() bool { return d == FP8 }

// WeightBytes is the bytes of one weight element.
func (d DType) WeightBytes() int64 {
	if d == FP8 {
		return 1
	}
	return 2
}

// Mat is the kernels' matrix type of the weights.
func (d DType) Mat() kernels.MatDType {
	if d == FP8 {
		return kernels.MatFP8
	}
	return kernels.MatBF16
}
