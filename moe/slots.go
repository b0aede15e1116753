package moe

import (
	"fmt"
	"math"
)

// SharedSlots is where a fused bank serves the shared experts: their S
// slices sit in the bank R times after the E routed experts, and every
// token gets S more slots, token t's slot s naming bank expert
// E + (t mod R)*S + s (ID), so tokens spread over the replicas the way
// tensor-parallel ranks would take them. The zero value is no shared slots.
type SharedSlots struct {
	PerToken int     // S: shared slots appended to each token's top-k
	Replicas int     // R: copies of the S slices in the bank
	Weight   float32 // every shared slot's weight
}

// ID is the bank expert of token t's shared slot s in a bank whose first
// e experts are the routed ones.
func (l SharedSlots) ID(e, t, s int) int32 {
	return int32(e + (t%l.Replicas)*l.PerToken + s)
}

// Check refuses slots a kernel cannot lay out after e routed experts: a
// negative count, slots without a replica, a weight that is not a finite
// positive number, or bank ids past int32.
func (l SharedSlots) Check(e int) error {
	w := float64(l.Weight)
	switch {
	case l.PerToken < 0:
		return fmt.Errorf("%d shared slots", l.PerToken)
	case l.PerToken == 0:
		return nil
	case l.Replicas <= 0:
		return fmt.Errorf("%d shared slots with %d replicas", l.PerToken, l.Replicas)
	case math.IsNaN(w) || math.IsInf(w, 0) || w <= 0:
		return fmt.Errorf("shared slot weight %v", l.Weight)
	case int64(e)+int64(l.Replicas)*int64(l.PerToken) > math.MaxInt32:
		return fmt.Errorf("%d replicas of %d shared slots overflow int32 ids", l.Replicas, l.PerToken)
	}
	return nil
}

// Slots is the gate's output as the fused kernels consume it: per token the
// K routed slots followed by the S shared slots.
type Slots struct {
	T, K       int       // K = routed top-k + S
	IDs        []int32   // [T,K] expert ids in the bank of E + R*S experts
	Weights    []float32 // [T,K] slot weights
	FinalScale float32   // rsf where it stays a runtime multiply, 1 where folded
}

// FusedSlots appends the shared slots to a routing over e routed experts:
// token t's shared slot s goes to shared.ID(e, t, s) with shared.Weight.
// Routed slot weights are the routing's, without rsf: where rsf is folded
// the routed down projections carry it, otherwise finalScale (the runtime
// multiply Finalize applies) does, and turns a shared weight of 1/rsf back
// into 1. The weight is taken as given: the caller's contract vouches for it.
func FusedSlots(r *Routing, e int, shared SharedSlots, finalScale float32) (*Slots, error) {
	if r.K <= 0 || len(r.IDs) != r.T*r.K {
		return nil, fmt.Errorf("fused slots: routing has %d ids for %d tokens x %d", len(r.IDs), r.T, r.K)
	}
	s := shared.PerToken
	if s < 0 || s > 0 && shared.Replicas <= 0 {
		return nil, fmt.Errorf("fused slots: %d shared slots with %d replicas", s, shared.Replicas)
	}
	k := r.K + s
	out := &Slots{T: r.T, K: k, IDs: make([]int32, r.T*k), Weights: make([]float32, r.T*k), FinalScale: finalScale}
	for t := range r.T {
		copy(out.IDs[t*k:], r.IDs[t*r.K:(t+1)*r.K])
		copy(out.Weights[t*k:], r.Weights[t*r.K:(t+1)*r.K])
		for j := range s {
			out.IDs[t*k+r.K+j] = shared.ID(e, t, j)
			out.Weights[t*k+r.K+j] = shared.Weight
		}
	}
	return out, nil
}
