package kernels

import (
	"fmt"

	"github.com/moeprep/moeprep/internal/cuda"
)

// finalizeThreads is FIN_THREADS of finalize.cu.
const finalizeThreads = 128

// Finalize queues y[t,:] = scale * sum_k w[t,k] * out[t*K+k,:] on stream s,
// f32, slots summed in order without fused multiply-adds (bit-identical to
// the CPU twin moe.Finalize on amd64). scale is the routed scaling
// factor where it stays a runtime multiply, 1 where folded.
func Finalize(dev *cuda.Device, s cuda.Stream, out, w, y *cuda.Buffer[float32], t, k, h int, scale float32) error {
	if !dimsOK(t, k, h, t*k) {
		return fmt.Errorf("finalize: %d tokens x %d slots x %d", t, k, h)
	}
	switch {
	case out == nil || out.Len() < t*k*h:
		return fmt.Errorf("finalize: expert outputs smaller than %d x %d x %d", t, k, h)
	case w == nil || w.Len() < t*k:
		return fmt.Errorf("finalize: slot weights smaller than %d x %d", t, k)
	case y == nil || y.Len() < t*h:
		return fmt.Errorf("finalize: output smaller than %d x %d", t, h)
	}
	m, err := Load(dev, "finalize")
	if err != nil {
		return err
	}
	if h%4 == 0 && out.Ptr()%16 == 0 && y.Ptr()%16 == 0 {
		// Many CTAs per token row (finalize.cu moe_finalize_v4).
		grid := [3]uint32{uint32(CeilDiv(h/4, finalizeThreads)), uint32(min(t, 65535)), 1}
		return m.Launch("moe_finalize_v4", grid, Block(finalizeThreads), 0, s, out, w, y, int32(t), int32(k), int32(h/4), scale)
	}
	return m.Launch("moe_finalize", Grid(t), Block(256), 0, s, out, w, y, int32(t), int32(k), int32(h), scale)
}

// AddRows queues y[t,:] += f_t * o[t,:] on stream s: the unfused path's
// dense shared expert added to the routed sum, f_t = sigmoid(gateLogit[t])
// for Qwen2-MoE's shared_expert_gate, 1 when gateLogit is nil.
func AddRows(dev *cuda.Device, s cuda.Stream, y, o, gateLogit *cuda.Buffer[float32], t, h int) error {
	if !dimsOK(t, h) {
		return fmt.Errorf("add rows: %d tokens x %d", t, h)
	}
	if y == nil || o == nil || y.Len() < t*h || o.Len() < t*h {
		return fmt.Errorf("add rows: buffers smaller than %d x %d", t, h)
	}
	var g cuda.DevicePtr
	if gateLogit != nil {
		if gateLogit.Len() < t {
			return fmt.Errorf("add rows: %d gate logits for %d tokens", gateLogit.Len(), t)
		}
		g = gateLogit.Ptr()
	}
	m, err := Load(dev, "unfused")
	if err != nil {
		return err
	}
	return m.Launch("moe_add_rows", Grid(t), Block(256), 0, s, y, o, g, int32(t), int32(h))
}
