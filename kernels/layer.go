package kernels

import (
	"fmt"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
)

// RoutePrecision is the element type the router GEMM reads x and the router
// weight in. It has no default: every LayerRunner names one, because the two
// give different logits (and, at near ties, different experts).
type RoutePrecision uint8

const (
	// RouteF32 routes f32 x through an f32 router weight: for bf16 tokens
	// that is the bf16 x exactly, and a golden's f32 x routes as HF routed
	// it (validate).
	RouteF32 RoutePrecision = iota + 1
	// RouteBF16 routes bf16 x through a bf16 router weight, as serving
	// engines do (bench).
	RouteBF16
)

func (p RoutePrecision) String() string {
	switch p {
	case RouteF32:
		return "f32"
	case RouteBF16:
		return "bf16"
	}
	return fmt.Sprintf("RoutePrecision(%d)", uint8(p))
}

// mat is the matrix type the router GEMM's inputs must have.
func (p RoutePrecision) mat() MatDType {
	if p == RouteBF16 {
		return MatBF16
	}
	return MatF32
}

// LayerOptions are every numeric choice of a LayerRunner: each caller sets
// them all, so a difference between two callers is a difference here.
type LayerOptions struct {
	Route RoutePrecision
	// GEMM is the grouped GEMM's precision and kernel path (Act, Path,
	// W8A8). Quant and Scratch are per-call buffers: leave them nil here
	// and pass them to the GEMM methods.
	GEMM GEMMOptions
}

// Check rejects options a LayerRunner cannot run.
func (o LayerOptions) Check() error {
	switch {
	case o.Route != RouteF32 && o.Route != RouteBF16:
		return fmt.Errorf("layer runner: route precision %v", o.Route)
	case o.GEMM.Act != MatF32 && o.GEMM.Act != MatBF16:
		return fmt.Errorf("layer runner: activation type %v", o.GEMM.Act)
	case o.GEMM.Quant != nil || o.GEMM.Scratch != nil:
		return fmt.Errorf("layer runner: Quant and Scratch are per call, not options")
	}
	return nil
}

// LayerRunner queues the fused MoE layer's steps (router GEMM, gate,
// moe_align_block_size, the grouped GEMM's two stages with their
// activation, finalize) on one stream, on buffers the caller owns, with one
// set of LayerOptions. It allocates nothing on the device and never
// synchronises: bench captures and times its launches, validate
// interleaves them with its host-side bookkeeping.
type LayerRunner struct {
	dev    *cuda.Device
	stream cuda.Stream
	opt    LayerOptions
}

// NewLayerRunner returns a runner queueing on stream of dev.
func NewLayerRunner(dev *cuda.Device, stream cuda.Stream, opt LayerOptions) (*LayerRunner, error) {
	if err := opt.Check(); err != nil {
		return nil, err
	}
	return &LayerRunner{dev: dev, stream: stream, opt: opt}, nil
}

// Options are the runner's options.
func (r *LayerRunner) Options() LayerOptions { return r.opt }

// FusedGate is the gate of a layer over a bank laid out by contract c
// (nil: an unfused bank): route plus c's shared slots, and finalize's
// scale, 1 when rsf is folded into the weights, else rsf. This is the one
// place the GPU paths derive the shared slots' weight and the final scale:
// both are the contract's (shared_slot_weight, RuntimeScale), exactly as
// the CPU twin's FusedSlots uses them.
func FusedGate(route moe.RouteSpec, c *layout.Contract) (GateSpec, float32) {
	gs := GateSpec{RouteSpec: route}
	if c == nil {
		return gs, float32(route.RoutedScalingFactor)
	}
	if c.NumFusedSharedExperts > 0 {
		gs.Shared = moe.SharedSlots{PerToken: c.SharedSlices, Replicas: c.SharedReplicas, Weight: float32(c.SharedSlotWeight)}
	}
	return gs, float32(c.RuntimeScale())
}

// Sorted is the grouped GEMM's view of the alignment's arrays (no copy:
// freeing a frees it).
func (a *Alignment) Sorted() *Sorted {
	return &Sorted{SortedIDs: a.SortedTokenIDs, ExpertIDs: a.ExpertIDs, Total: a.Total, BlockSize: a.BlockSize, Numel: int(a.Numel)}
}

// Router queues the router GEMM: logits [t,rows] = x [t,h] . w [rows,h]^T;
// x and w must be of the runner's route precision.
func (r *LayerRunner) Router(x, w Mat, logits *cuda.Buffer[float32], t, h, rows int) error {
	if want := r.opt.Route.mat(); x.DType != want || w.DType != want {
		return fmt.Errorf("layer runner: router inputs %v x %v, route precision %v", x.DType, w.DType, r.opt.Route)
	}
	return RouterGEMM(r.dev, r.stream, x, w, logits, t, h, rows)
}

// Gate queues the gate on t tokens' logits (bias: the correction bias or nil).
func (r *LayerRunner) Gate(spec GateSpec, t int, logits, bias *cuda.Buffer[float32], out *GateOut) error {
	return Gate(r.stream, spec, t, logits, bias, out)
}

// Align queues moe_align_block_size of ids ([T,K] slots) into a; a.Sorted()
// is the GEMM's view of the result.
func (r *LayerRunner) Align(ids *cuda.Buffer[int32], a *Alignment) error {
	return AlignBlockSize(r.stream, ids, a)
}

// gemmOpt is the runner's GEMM options with this call's scratch.
func (r *LayerRunner) gemmOpt(quant *QuantScratch, scratch *cuda.Buffer[float32]) GEMMOptions {
	opt := r.opt.GEMM
	opt.Quant, opt.Scratch = quant, scratch
	return opt
}

// GateUp queues the grouped GEMM's first stage and its activation (quant:
// the w8a8 scratch, scratch: f32 room for a bank with UnfusedAct; nil
// where unused).
func (r *LayerRunner) GateUp(bank *ExpertBank, sorted *Sorted, x Mat, t, k int, inter Mat, quant *QuantScratch, scratch *cuda.Buffer[float32]) error {
	return MoEGateUp(r.dev, r.stream, bank, sorted, x, t, k, inter, r.gemmOpt(quant, scratch))
}

// Down queues the grouped GEMM's second stage into out [Numel,H].
func (r *LayerRunner) Down(bank *ExpertBank, sorted *Sorted, inter Mat, out *cuda.Buffer[float32], quant *QuantScratch, scratch *cuda.Buffer[float32]) error {
	return MoEDown(r.dev, r.stream, bank, sorted, inter, out, r.gemmOpt(quant, scratch))
}

// GroupedGEMM queues both stages (GateUp, then Down).
func (r *LayerRunner) GroupedGEMM(bank *ExpertBank, sorted *Sorted, x Mat, t, k int, inter Mat, out *cuda.Buffer[float32], quant *QuantScratch, scratch *cuda.Buffer[float32]) error {
	return GroupedGEMM(r.dev, r.stream, bank, sorted, x, t, k, inter, out, r.gemmOpt(quant, scratch))
}

// Finalize queues y [t,h] = scale * sum over each token's k slots of w * out.
func (r *LayerRunner) Finalize(out, w, y *cuda.Buffer[float32], t, k, h int, scale float32) error {
	return Finalize(r.dev, r.stream, out, w, y, t, k, h, scale)
}

// LayerBuffers are one fused layer's caller-owned device buffers and
// shapes, for Layer.
type LayerBuffers struct {
	T, H, Rows int // tokens, hidden size, router rows (experts)
	// RouterX is the router's x [T,H] (the route precision's type), X the
	// grouped GEMM's [T,H] (the activation type); they may be one buffer.
	RouterX, X Mat
	RouterW    Mat                   // [Rows,H]
	Bias       *cuda.Buffer[float32] // correction bias [Rows] or nil
	Logits     *cuda.Buffer[float32] // [T,Rows]
	Spec       GateSpec
	Gate       *GateOut
	Align      *Alignment // over Gate.IDs
	Sorted     *Sorted    // Align.Sorted()
	Inter      Mat        // [T*K,I]
	Out        *cuda.Buffer[float32]
	Y          *cuda.Buffer[float32]
	Scale      float32       // finalize's
	Quant      *QuantScratch // w8a8 scratch or nil
	Scratch    *cuda.Buffer[float32]
}

// Layer queues the six steps back to back: router GEMM, gate, align, the
// grouped GEMM's two stages, finalize, the slots' weights being the gate's.
func (r *LayerRunner) Layer(b *LayerBuffers, bank *ExpertBank) error {
	k := b.Spec.SlotsPerToken()
	for _, f := range []func() error{
		func() error { return r.Router(b.RouterX, b.RouterW, b.Logits, b.T, b.H, b.Rows) },
		func() error { return r.Gate(b.Spec, b.T, b.Logits, b.Bias, b.Gate) },
		func() error { return r.Align(b.Gate.IDs, b.Align) },
		func() error { return r.GateUp(bank, b.Sorted, b.X, b.T, k, b.Inter, b.Quant, b.Scratch) },
		func() error { return r.Down(bank, b.Sorted, b.Inter, b.Out, b.Quant, b.Scratch) },
		func() error { return r.Finalize(b.Out, b.Gate.Weights, b.Y, b.T, k, b.H, b.Scale) },
	} {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}
