package bench

import "github.com/moeprep/moeprep/kernels"

// Timed kernels and stages, in report order.
const (
	KRouter     = "router_gemm"  // logits [T,E] f32 = x [T,H] bf16 . Wr [E,H] bf16
	KGate       = "gate"         // sigmoid + bias grouped top-k + shared slots
	KAlign      = "align"        // moe_align_block_size (3 launches + a memset)
	KGateUp     = "gemm_gate_up" // grouped GEMM stage 1: silu(x Wg) * (x Wu)
	KDown       = "gemm_down"    // grouped GEMM stage 2: inter Wd, [T*K,H] f32
	KGEMM       = "grouped_gemm" // both stages
	KFinalize   = "finalize"     // weighted sum of the slots
	KLayer      = "layer"        // router GEMM to finalize, launched on a stream
	KLayerGraph = "layer_graph"  // the same, replayed as one CUDA graph
)

// Kernels lists the rows of a report for one token count.
var Kernels = []string{KRouter, KGate, KAlign, KGateUp, KDown, KGEMM, KFinalize, KLayer, KLayerGraph}

// actBytes is the size of an activation element: x, the intermediate and
// the layer output are bf16 as serving engines run them.
const actBytes = 2

// scaleGrid is the number of f32 block scales of a rows x cols fp8 matrix.
func scaleGrid(rows, cols int) int64 {
	return int64(kernels.CeilDiv(rows, kernels.FP8ScaleBlock)) * int64(kernels.CeilDiv(cols, kernels.FP8ScaleBlock))
}

// GateUpBytes is one expert's gate and up weights (and fp8 scales).
func (s Shape) GateUpBytes(d DType) int64 {
	b := 2 * int64(s.H) * int64(s.I) * d.WeightBytes()
	if d == FP8 {
		b += 2 * scaleGrid(s.I, s.H) * 4
	}
	return b
}

// DownBytes is one expert's down weight (and fp8 scales).
func (s Shape) DownBytes(d DType) int64 {
	b := int64(s.H) * int64(s.I) * d.WeightBytes()
	if d == FP8 {
		b += scaleGrid(s.H, s.I) * 4
	}
	return b
}

// ExpertBytes is one expert's three weights.
func (s Shape) ExpertBytes(d DType) int64 { return s.GateUpBytes(d) + s.DownBytes(d) }

// BankBytes is the whole fused bank, E + R*S experts.
func (s Shape) BankBytes(d DType) int64 { return int64(s.BankExperts()) * s.ExpertBytes(d) }

// FloorBytes is the fewest bytes kernel must move through device memory
// for t tokens when touched experts receive at least one slot: each input
// read once, each output written once. The layer's floor counts the
// touched experts' weights, the router weight, x and a bf16 output (a fully
// fused layer keeps its intermediates on chip); each kernel's floor counts
// its own inputs and outputs as its interface defines them.
func (s Shape) FloorBytes(kernel string, d DType, t int, touched float64) int64 {
	T, H, I, E := int64(t), int64(s.H), int64(s.I), int64(s.Routed)
	K, EB := int64(s.Slots()), int64(s.BankExperts())
	weights := func(per int64) int64 { return int64(touched * float64(per)) }
	gateUp := weights(s.GateUpBytes(d)) + T*H*actBytes + T*K*I*actBytes
	down := weights(s.DownBytes(d)) + T*K*I*actBytes + T*K*H*4
	if b, ok := gemmStages(kernel, gateUp, down); ok {
		return b
	}
	switch kernel {
	case KRouter:
		return T*H*actBytes + E*H*actBytes + T*E*4
	case KGate:
		return T*E*4 + E*4 + T*K*8
	case KAlign:
		return T*K*4*2 + EB*4*2
	case KFinalize:
		return T*K*H*4 + T*K*4 + T*H*4
	case KLayer, KLayerGraph:
		return weights(s.ExpertBytes(d)) + E*H*actBytes + T*H*actBytes*2
	}
	return 0
}

// FLOPs is the multiply-add work of kernel (2 per multiply-add), 0 for the
// kernels whose cost is not arithmetic.
func (s Shape) FLOPs(kernel string, t int) float64 {
	T, H, I, E, K := float64(t), float64(s.H), float64(s.I), float64(s.Routed), float64(s.Slots())
	router := 2 * T * H * E
	gateUp := 2 * T * K * H * 2 * I
	down := 2 * T * K * I * H
	if f, ok := gemmStages(kernel, gateUp, down); ok {
		return f
	}
	switch kernel {
	case KRouter:
		return router
	case KLayer, KLayerGraph:
		return router + gateUp + down
	}
	return 0
}

// gemmStages is a cost of the grouped GEMM's kernels from those of its two
// stages: gate-up's, down's, or both for the whole GEMM; ok is false for
// any other kernel.
func gemmStages[T int64 | float64](kernel string, gateUp, down T) (cost T, ok bool) {
	switch kernel {
	case KGateUp:
		return gateUp, true
	case KDown:
		return down, true
	case KGEMM:
		return gateUp + down, true
	}
	return 0, false
}

// FloorMicros is the time to move bytes at bytesPerSec, in microseconds.
func FloorMicros(bytes int64, bytesPerSec float64) float64 {
	if bytesPerSec <= 0 {
		return 0
	}
	return float64(bytes) / bytesPerSec * 1e6
}

// CopyBandwidth turns one device-to-device copy of n bytes taking ms
// milliseconds into bytes per second, counting the read and the write.
func CopyBandwidth(n int64, ms float64) float64 {
	if ms <= 0 {
		return 0
	}
	return 2 * float64(n) / (ms / 1e3)
}
