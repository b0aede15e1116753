package kernels

import (
	"fmt"
	"math"
	"slices"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/moe"
)

// GateMaxExperts is the largest routed expert count the warp and register
// gate kernels take (GATE_MAX_EXPERTS); GateBlockMaxExperts the block
// kernel's (GATE_BLOCK_MAX_EXPERTS: Kimi K3's 896 experts), which GateCtx
// runs past GateMaxExperts.
const (
	GateMaxExperts      = 512
	GateBlockMaxExperts = 1024
)

// Gate kernel variants: GateWarp (one warp per token, 4 tokens per CTA, no
// CTA barriers in the k serial selections) and GateBlock (one CTA of 256
// threads per token). Both match the CPU twin. Measured on an H200 (mean of
// 50 back-to-back launches): DeepSeek-V3 shape T=4096 warp 50 us, block 104
// us; Kimi-K2 T<=128 block 12.5-13.5 us, warp 20-22 us.
//
// GateReg (gate_reg.cu: one warp per token, the token's scores in
// registers, each of the k selections two warp reductions, no barriers) is
// what GateCtx runs: same results, and on an H100 (same method) DeepSeek-V3
// 8.1 / 8.3 / 18.7 us at T=1 / 128 / 4096, Kimi-K2 7.3 / 7.4 / 19.2 us
// (7.7 / 8.0 / 18.4 and 6.9 / 7.2 / 19.5 on an H200).
const (
	GateWarp  = "moe_gate_f32_warp"
	GateBlock = "moe_gate_f32"
	GateReg   = "moe_gate_f32_reg"
)

const (
	gateThreads    = 256
	gateWarpTokens = 4 // GATE_WARP_TOKENS and GR_WARPS
)

// gateRegKernel is the register kernel instantiated for e experts (each
// lane holds ceil(e/32) scores, rounded up to 4, 8 or 16).
func gateRegKernel(e int) string {
	switch {
	case e <= 128:
		return GateReg + "4"
	case e <= 256:
		return GateReg + "8"
	}
	return GateReg + "16"
}

// GateSpec is the gate's configuration: a routing spec (moe.Route's, whose
// rules Check applies) plus the fused bank's shared slots
// (moe.FusedSlots') and a weight scale.
type GateSpec struct {
	moe.RouteSpec
	// Shared are the shared slots appended to every token's top-k: token t's
	// slot s is expert E + (t mod Replicas)*PerToken + s with Shared.Weight.
	Shared moe.SharedSlots
	// WeightScale multiplies every output weight, shared router-weighted
	// ones included (Inkling's global_scale, moe.ScaleRouting); 0 means 1.
	// Other than 1: GateReg only.
	WeightScale float32
}

// gateBlockScorings are the scorings gate.cu's kernels (GateBlock,
// GateWarp) implement; GateReg (gate_reg.cu) implements every moe scoring.
// TestGateScoringCodes holds both sources to these sets.
var gateBlockScorings = []moe.Scoring{moe.Sigmoid, moe.Softmax, moe.SqrtSoftplus}

func (s GateSpec) scale() float32 {
	if s.WeightScale == 0 {
		return 1
	}
	return s.WeightScale
}

// SlotsPerToken is TopK + Shared.PerToken, the K of the gate's [T,K] outputs.
func (s GateSpec) SlotsPerToken() int { return s.TopK + s.Shared.PerToken }

// Check reports a spec the kernel cannot run: whatever moe's routing and
// slot rules refuse, and the kernel's own limits.
func (s GateSpec) Check() error {
	if err := s.RouteSpec.Check(); err != nil {
		return fmt.Errorf("gate: %w", err)
	}
	if err := s.Shared.Check(s.NumExperts); err != nil {
		return fmt.Errorf("gate: %w", err)
	}
	switch e := s.NumExperts; {
	case e > GateBlockMaxExperts:
		return fmt.Errorf("gate: %d experts (the kernels take 1..%d)", e, GateBlockMaxExperts)
	case s.Scoring == moe.SparseMixer && math.IsInf(float64(float32(s.JitterEps)), 0):
		return fmt.Errorf("gate: sparsemixer eps %v is not a finite float32", s.JitterEps)
	case s.WeightScale != s.WeightScale || math.IsInf(float64(s.WeightScale), 0):
		return fmt.Errorf("gate: weight scale %v", s.WeightScale)
	}
	return nil
}

// GateOut are the gate's device outputs for T tokens, and one optional input.
type GateOut struct {
	T, K    int
	IDs     *cuda.Buffer[int32]   // [T,K]: routed ids best first, then the shared slots
	Weights *cuda.Buffer[float32] // [T,K]: slot weights (routed ones without rsf)
	Choice  *cuda.Buffer[float32] // [T,E] ranked scores, or nil
	// Shared [T,SharedLogits]: the router-weighted shared experts' weights
	// (GateSpec.SharedLogits > 0), nil otherwise.
	Shared *cuda.Buffer[float32]
	// HashIDs is an input, set by the caller for a hash-routed layer
	// (DeepSeek-V4): [T,TopK] experts from the token-id table, which the
	// gate weights by their scores instead of choosing a top-k (GateReg
	// only). It is not freed with the outputs.
	HashIDs *cuda.Buffer[int32]
}

// NewGateOut allocates outputs for t tokens (Choice only when withChoice).
func NewGateOut(dev *cuda.Device, spec GateSpec, t int, withChoice bool) (*GateOut, error) {
	if err := spec.Check(); err != nil {
		return nil, err
	}
	if t <= 0 || int64(t)*int64(max(spec.SlotsPerToken(), spec.NumExperts)) > math.MaxInt32 {
		return nil, fmt.Errorf("gate: %d tokens", t)
	}
	k := spec.SlotsPerToken()
	o := &GateOut{T: t, K: k}
	var err error
	if o.IDs, err = cuda.Alloc[int32](dev, t*k); err != nil {
		return nil, err
	}
	if o.Weights, err = cuda.Alloc[float32](dev, t*k); err != nil {
		o.Free()
		return nil, err
	}
	if withChoice {
		if o.Choice, err = cuda.Alloc[float32](dev, t*spec.NumExperts); err != nil {
			o.Free()
			return nil, err
		}
	}
	if spec.SharedLogits > 0 {
		if o.Shared, err = cuda.Alloc[float32](dev, t*spec.SharedLogits); err != nil {
			o.Free()
			return nil, err
		}
	}
	return o, nil
}

// Free releases the outputs.
func (o *GateOut) Free() {
	o.IDs.Free()
	o.Weights.Free()
	o.Choice.Free()
	o.Shared.Free()
}

// Gate queues the fused gate on stream: logits [T,E] f32 ([T,E+S] with
// shared router rows), bias [E] f32 or nil, outputs into out (see
// NewGateOut; out.HashIDs, when set, the experts of a hash-routed layer).
func Gate(stream cuda.Stream, spec GateSpec, t int, logits, bias *cuda.Buffer[float32], out *GateOut) error {
	if logits == nil {
		return fmt.Errorf("gate: nil logits")
	}
	return logits.Device().Do(func(c *cuda.Ctx) error { return GateCtx(c, stream, spec, t, logits, bias, out) })
}

// GateCtx is Gate from inside a Do closure (to queue a whole pipeline in one
// trip to the device's thread). It runs the register kernel (GateReg), or
// the block kernel (GateBlock) for more than GateMaxExperts experts, which
// only it takes.
func GateCtx(c *cuda.Ctx, stream cuda.Stream, spec GateSpec, t int, logits, bias *cuda.Buffer[float32], out *GateOut) error {
	return GateKernelCtx(c, GateKernelFor(spec), stream, spec, t, logits, bias, out)
}

// GateKernelFor is the kernel GateCtx runs for spec.
func GateKernelFor(spec GateSpec) string {
	if spec.NumExperts > GateMaxExperts {
		return GateBlock
	}
	return GateReg
}

// GateKernelCtx is GateCtx with an explicit kernel variant (GateReg,
// GateWarp or GateBlock).
func GateKernelCtx(c *cuda.Ctx, kernel string, stream cuda.Stream, spec GateSpec, t int, logits, bias *cuda.Buffer[float32], out *GateOut) error {
	variant := kernel
	grid, block := Grid(t), Block(gateThreads)
	switch kernel {
	case GateBlock:
	case GateWarp:
		grid, block = Grid(CeilDiv(t, gateWarpTokens)), Block(32*gateWarpTokens)
	case GateReg:
		grid, block = Grid(CeilDiv(t, gateWarpTokens)), Block(32*gateWarpTokens)
		kernel = gateRegKernel(spec.NumExperts)
	default:
		return fmt.Errorf("gate: unknown kernel %q", kernel)
	}
	if err := spec.Check(); err != nil {
		return err
	}
	e, k := spec.NumExperts, spec.SlotsPerToken()
	switch {
	case variant != GateBlock && e > GateMaxExperts:
		return fmt.Errorf("gate: %d experts: the %s kernel takes 1..%d (%s up to %d)", e, variant, GateMaxExperts, GateBlock, GateBlockMaxExperts)
	case logits == nil || out == nil || out.IDs == nil || out.Weights == nil:
		return fmt.Errorf("gate: nil buffer")
	case t <= 0 || t != out.T || k != out.K:
		return fmt.Errorf("gate: %d tokens x %d slots into outputs for %d x %d", t, k, out.T, out.K)
	case int64(t)*int64(spec.Rows()) > int64(logits.Len()):
		return fmt.Errorf("gate: logits hold %d values, want %d tokens x %d router rows", logits.Len(), t, spec.Rows())
	case variant != GateReg && !slices.Contains(gateBlockScorings, spec.Scoring):
		return fmt.Errorf("gate: %s scores need the %s kernel", spec.Scoring, GateReg)
	case variant != GateReg && (spec.SharedLogits > 0 || spec.scale() != 1 || out.HashIDs != nil):
		return fmt.Errorf("gate: shared router rows, a weight scale or hash ids need the %s kernel", GateReg)
	case spec.SharedLogits > 0 && (out.Shared == nil || out.Shared.Len() < t*spec.SharedLogits):
		return fmt.Errorf("gate: no room for %d tokens x %d shared weights", t, spec.SharedLogits)
	case out.HashIDs != nil && (!spec.Scoring.PerExpert() || spec.SharedLogits > 0):
		// moe.RouteHashed's rule: the given experts are weighted by their
		// own scores, which only a per-expert scoring without shared rows has.
		return fmt.Errorf("gate: hash routing with %s scores and %d shared router rows is not supported", spec.Scoring, spec.SharedLogits)
	case out.HashIDs != nil && out.HashIDs.Len() < t*spec.TopK:
		return fmt.Errorf("gate: hash ids hold %d values, want %d tokens x top-%d", out.HashIDs.Len(), t, spec.TopK)
	case bias != nil && bias.Len() < e:
		return fmt.Errorf("gate: correction bias holds %d values for %d experts", bias.Len(), e)
	case bias != nil && spec.Scoring == moe.Softmax && variant != GateReg:
		return fmt.Errorf("gate: a correction bias with softmax scoring (ERNIE 4.5) needs the %s kernel", GateReg)
	case out.IDs.Len() < t*k || out.Weights.Len() < t*k:
		return fmt.Errorf("gate: outputs hold %d ids and %d weights, want %d", out.IDs.Len(), out.Weights.Len(), t*k)
	case out.Choice != nil && out.Choice.Len() < t*e:
		return fmt.Errorf("gate: choice output holds %d values, want %d", out.Choice.Len(), t*e)
	}
	scoring, err := spec.Scoring.Code()
	if err != nil {
		return fmt.Errorf("gate: %w", err)
	}
	family := "gate"
	if kernel != GateBlock && kernel != GateWarp {
		family = "gate_reg" // gate_reg.cu
	}
	m, err := LoadCtx(c, family)
	if err != nil {
		return err
	}
	ngroup, topkGroup := spec.NGroup, spec.TopKGroup
	if ngroup < 1 {
		ngroup, topkGroup = 1, 1
	}
	replicas := max(spec.Shared.Replicas, 1)
	args := []any{logits, bias, out.IDs, out.Weights, out.Choice,
		int32(t), int32(e), int32(spec.TopK), int32(ngroup), int32(topkGroup),
		scoring, b2i(spec.GroupByMax), b2i(spec.NormTopKProb),
		int32(spec.Shared.PerToken), int32(replicas), spec.Shared.Weight}
	if variant == GateReg {
		args = append(args, out.HashIDs, out.Shared, int32(spec.SharedLogits), spec.scale(), float32(spec.JitterEps))
	}
	return m.LaunchCtx(c, kernel, grid, block, 0, stream, args...)
}

func b2i(b bool) int32 {
	if b {
		return 1
	}
	return 0
}
