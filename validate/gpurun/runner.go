package gpurun

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/tensorload"
	"github.com/moeprep/moeprep/weightfmt"
)

// Runner runs MoE layers on one GPU: a compute stream for the kernels
// (and the unfused path's per-expert uploads, which must order before their
// GEMMs), a copy stream on which the next layer's bank streams in while this
// layer computes, and a stager for each.
type Runner struct {
	dev           *cuda.Device
	compute, copy cuda.Stream
	// Stage uploads on the compute stream, Prefetch on the copy stream.
	Stage, Prefetch *Stager
	act             kernels.MatDType     // activation type of the grouped GEMM
	w8a8            bool                 // --precision fp8: e4m3 activations (kernels.GEMMOptions.W8A8)
	lr              *kernels.LayerRunner // queues the layer's kernels on compute
}

// GPU precisions: the activation type of the grouped GEMM, or w8a8.
const (
	PrecisionBF16 = "bf16"
	PrecisionF32  = "f32"
	// PrecisionFP8 is the w8a8 serving numerics (moe.GEMMOptions.W8A8): the
	// GPU quantises each expert GEMM's activations to e4m3 per token per
	// 128 channels and multiplies e4m3 x e4m3 (fp8 weights, compute
	// capability 9.0); the CPU reference quantises the same way.
	PrecisionFP8 = "fp8"
)

// BlockMultiple is what the alignment block size must be a multiple of:
// the grouped GEMM's row tile, so that a tile never spans two experts.
const BlockMultiple = 16

// ErrDeviceUnavailable is wrapped by the error of --device cuda on a
// machine without a usable GPU.
var ErrDeviceUnavailable = errors.New("validate --device cuda: no usable GPU")

// The process keeps one device open: its kernels stay loaded across runs.
var (
	gpuOnce sync.Once
	gpuDev  *cuda.Device
	gpuErr  error
)

// Open returns a runner on the process's GPU (device 0, opened once) for
// precision (PrecisionBF16, PrecisionF32 or PrecisionFP8); Close releases
// its streams and stagers.
func Open(precision string) (*Runner, error) {
	gpuOnce.Do(func() { gpuDev, gpuErr = cuda.Open(0) })
	if gpuErr != nil {
		return nil, fmt.Errorf("%w: %w", ErrDeviceUnavailable, gpuErr)
	}
	g := &Runner{dev: gpuDev, act: kernels.MatBF16}
	if precision == PrecisionF32 {
		g.act = kernels.MatF32
	}
	g.w8a8 = precision == PrecisionFP8
	err := g.dev.Do(func(c *cuda.Ctx) error {
		preloadKernels(c)
		var err error
		if g.compute, err = c.NewStream(); err != nil {
			return err
		}
		g.copy, err = c.NewStream()
		return err
	})
	if err == nil {
		// validate routes in f32 (x and the router weight f32, whatever the
		// GEMM's precision) and runs the grouped GEMM in the run's precision.
		g.lr, err = kernels.NewLayerRunner(g.dev, g.compute, kernels.LayerOptions{Route: kernels.RouteF32,
			GEMM: kernels.GEMMOptions{Act: g.act, W8A8: g.w8a8}})
	}
	if err == nil {
		if g.Stage, err = newStager(g.dev, g.compute); err == nil {
			g.Prefetch, err = newStager(g.dev, g.copy)
		}
	}
	if err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

// kernelNames are the kernels a GPU run may launch, by family.
var kernelNames = map[string][]string{
	"router_gemm": {"router_gemm_f32_f32", "router_gemm_bf16_bf16", "router_gemm_f32_bf16", "router_gemm_bf16_f32"},
	"gate":        {kernels.GateBlock, kernels.GateWarp},
	"align":       {"moe_align_count", "moe_align_scan", "moe_align_fill"},
	"finalize":    {"moe_finalize"},
	"unfused":     {"moe_add_rows"},
	"grouped_gemm": {
		"moe_gate_up_mma3_bf16_bf16", "moe_gate_up_mma2_bf16_bf16", "moe_gate_up_mma2_bf16_fp8", "moe_gate_up_mma_bf16_bf16", "moe_gate_up_mma_bf16_fp8",
		"moe_gate_up_bf16_bf16", "moe_gate_up_bf16_f32", "moe_gate_up_bf16_fp8", "moe_gate_up_f32_bf16", "moe_gate_up_f32_f32", "moe_gate_up_f32_fp8",
		"moe_down_mma3_bf16_bf16", "moe_down_mma2_bf16_bf16", "moe_down_mma2_bf16_fp8", "moe_down_mma_bf16_bf16", "moe_down_mma_bf16_fp8",
		"moe_down_bf16_bf16", "moe_down_bf16_f32", "moe_down_bf16_fp8", "moe_down_f32_bf16", "moe_down_f32_f32", "moe_down_f32_fp8",
	},
}

// preloadKernels loads every module and resolves every kernel right away,
// in one trip to the device thread. With the driver's lazy module loading
// (the default since CUDA 12.2) a kernel resolved long after its module was
// loaded from a Go byte slice failed with CUDA_ERROR_INVALID_HANDLE on an
// H200 (the image is likely read lazily after the slice was collected).
// Errors are left to the launches, which report them with context.
func preloadKernels(c *cuda.Ctx) {
	for fam, names := range kernelNames {
		m, err := kernels.LoadCtx(c, fam)
		if err != nil {
			continue
		}
		for _, n := range names {
			m.Function(c, n)
		}
	}
}

// Device is the GPU the runner runs on.
func (g *Runner) Device() *cuda.Device { return g.dev }

// Close releases the runner's stagers and streams (the device stays open).
func (g *Runner) Close() {
	if g.Stage != nil {
		g.Stage.free()
	}
	if g.Prefetch != nil {
		g.Prefetch.free()
	}
	g.dev.Do(func(c *cuda.Ctx) error {
		c.DestroyStream(g.compute)
		c.DestroyStream(g.copy)
		return nil
	})
}

// sync waits for the compute stream.
func (g *Runner) sync() error {
	return g.dev.Do(func(c *cuda.Ctx) error { return c.SyncStream(g.compute) })
}

// Frees collects device buffers released once the compute stream is idle.
type Frees []interface{ Free() error }

func (f *Frees) add(b interface{ Free() error }) { *f = append(*f, b) }

// toDevice copies host into a new device buffer, freed with the rest of fr.
func toDevice[T cuda.Elem](g *Runner, host []T, fr *Frees) (*cuda.Buffer[T], error) {
	b, err := cuda.FromHost(g.dev, host)
	if err != nil {
		return nil, err
	}
	fr.add(b)
	return b, nil
}

// Release waits for the compute stream and frees every buffer in f,
// leaving it empty. Its receiver is a pointer so that the usual
// `var fr Frees; defer fr.Release(g)` frees what is added after the defer:
// a deferred call evaluates its receiver at the defer, and with a value
// receiver it held the list as it was then, empty, so nothing was ever
// freed and a GPU run kept every buffer it made to the end of the process
// (the unfused path one expert's weights and scratch per chosen expert:
// Kimi K3's 896 experts ran out of an H200's memory at expert 650).
func (f *Frees) Release(g *Runner) { f.release(g.sync) }

// release calls sync (waiting for the work that reads the buffers), then
// frees every buffer in f and empties it.
func (f *Frees) release(sync func() error) {
	sync()
	for _, b := range *f {
		b.Free()
	}
	*f = nil
}

// Input is one layer's tokens on the device: x in f32 (for the routers)
// and in the GEMM's activation type.
type Input struct {
	t, h int
	x    []float32 // the host copy, for input-scaled slot rows
	// Tokens are the routed tokens' ids, for a hash-routed layer (nil otherwise).
	Tokens []int32
	x32    *cuda.Buffer[float32]
	act    kernels.Mat
	// r32 is the router's own input where it is not x (Gemma 4: Prepared;
	// a latent MoE: the block's input, rh wide where the bank's is h);
	// nil: x32.
	r32 *cuda.Buffer[float32]
	rh  int // r32's width; 0: h
}

// routerX is what the router reads: its own input, or x.
func (in *Input) routerX() *cuda.Buffer[float32] {
	if in.r32 != nil {
		return in.r32
	}
	return in.x32
}

// routerH is the width of what the router reads.
func (in *Input) routerH() int {
	if in.r32 != nil && in.rh > 0 {
		return in.rh
	}
	return in.h
}

// Prepared is in as a layer with two inputs reads it (Gemma 4: the
// experts' input and the router's, derived on the host from in's x, the
// residual stream, by prep with src's norm tensors, moelayer.InputPrep's
// float32 arithmetic); in itself for a layer with one. Each path prepares
// its own from its own checkpoint.
func (g *Runner) Prepared(src tensorload.TensorSource, prep moelayer.InputPrep, in *Input, fr *Frees) (*Input, error) {
	if prep.None() {
		return in, nil
	}
	xe, xr, err := prep.Inputs(src, in.x, in.t, in.h)
	if err != nil {
		return nil, err
	}
	out, err := g.Input(xe, in.t, in.h, fr)
	if err != nil {
		return nil, err
	}
	out.Tokens = in.Tokens
	if out.r32, err = toDevice(g, xr, fr); err != nil {
		return nil, err
	}
	return out, nil
}

// Input uploads t tokens of x (t x h) as f32 and in the GEMM's activation
// type; the buffers are released with fr.
func (g *Runner) Input(x []float32, t, h int, fr *Frees) (*Input, error) {
	in := &Input{t: t, h: h, x: x}
	var err error
	if in.x32, err = toDevice(g, x, fr); err != nil {
		return nil, err
	}
	in.act = kernels.F32Mat(in.x32)
	if g.act == kernels.MatBF16 {
		xb := make([]uint16, len(x))
		for i, v := range x {
			xb[i] = numfmt.F32ToBF16(v)
		}
		b, err := toDevice(g, xb, fr)
		if err != nil {
			return nil, err
		}
		in.act = kernels.BF16Mat(b)
	}
	return in, nil
}

type alignFree struct{ a *kernels.Alignment }

func (f alignFree) Free() error { f.a.Free(); return nil }

type sortedFree struct{ s *kernels.Sorted }

func (f sortedFree) Free() error { f.s.Free(); return nil }

// actBuffer allocates n activations of the GEMM's type.
func (g *Runner) actBuffer(n int, fr *Frees) (kernels.Mat, error) {
	if g.act == kernels.MatBF16 {
		b, err := cuda.Alloc[uint16](g.dev, n)
		if err != nil {
			return kernels.Mat{}, err
		}
		fr.add(b)
		return kernels.BF16Mat(b), nil
	}
	b, err := cuda.Alloc[float32](g.dev, n)
	if err != nil {
		return kernels.Mat{}, err
	}
	fr.add(b)
	return kernels.F32Mat(b), nil
}

// gemmBuffers allocates the grouped GEMM's outputs for numel slots, freed
// with fr: the intermediate [numel, inter] in the activation type and the
// f32 output [numel, h].
func (g *Runner) gemmBuffers(numel, inter, h int, fr *Frees) (kernels.Mat, *cuda.Buffer[float32], error) {
	mid, err := g.actBuffer(numel*inter, fr)
	if err != nil {
		return kernels.Mat{}, nil, err
	}
	out, err := g.f32Buffer(numel*h, fr)
	if err != nil {
		return kernels.Mat{}, nil, err
	}
	return mid, out, nil
}

func (g *Runner) f32Buffer(n int, fr *Frees) (*cuda.Buffer[float32], error) {
	b, err := cuda.Alloc[float32](g.dev, n)
	if err == nil {
		fr.add(b)
	}
	return b, err
}

// FusedLayer runs the serving path of a converted layer on the GPU: router
// GEMM, gate with the contract's shared slots, moe_align_block_size, the
// grouped GEMM over the bank already on the device, finalize (x runtime
// rsf), plus an unfused shared expert where the contract left one.
//
// cov's forced tokens (nil: none) follow the routed ones in in; their slots
// go through the same align, GEMM and finalize. A latent MoE layer
// (fl.Latent) takes in as the block's input x, its routed tokens alone:
// the bank runs on DST's down projection of x with cov's latent rows after
// it (latent.go), and its sums leave through DST's norm and up projection.
func (g *Runner) FusedLayer(src tensorload.TensorSource, fl *moelayer.FusedLayer, bank *Bank, in *Input, cov *moelayer.Coverage, blockSize int) (*moelayer.FusedResult, error) {
	var fr Frees
	defer fr.Release(g)
	c := fl.Contract
	if fl.Spec.NumExperts != c.NumExperts {
		return nil, fmt.Errorf("layer %d: config routes over %d experts, the contract says %d", fl.Index, fl.Spec.NumExperts, c.NumExperts)
	}
	// A latent MoE's bank reads its latent, its router and shared experts
	// the block's input x (block: the routed tokens alone).
	block := in
	var err error
	if fl.Latent != nil {
		if in, err = g.latentIn(src, fl.Latent, block, cov, &fr); err != nil {
			return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
		}
	}
	if bank.H != in.h {
		return nil, fmt.Errorf("layer %d: experts have H %d, x has %d", fl.Index, bank.H, in.h)
	}
	if in, err = g.Prepared(src, fl.Prep, in, &fr); err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	t, h := in.t, in.h
	routing, slots, slotIDs, slotW, err := g.gate(src, fl.Spec, fl.RouterRef(), in, cov, c, &fr)
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	k := slots.K
	numel := t * k
	al, err := kernels.NewAlignment(g.dev, numel, c.AlignExperts(), blockSize)
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	fr.add(alignFree{al})
	if err := g.lr.Align(slotIDs, al); err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	sorted := al.Sorted()
	inter, out, err := g.gemmBuffers(numel, bank.I, h, &fr)
	if err != nil {
		return nil, err
	}
	gin, gk := in, k
	if c.RoutedInputScaled {
		if gin, slotW, err = g.inputScaled(in, slots, &fr); err != nil {
			return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
		}
		gk = 1
	}
	if err := g.groupedGEMM(&bank.ExpertBank, sorted, gin.act, gin.t, gk, inter, out, &fr); err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	if z := c.ZeroExperts; z > 0 { // the GEMM left the zero-compute experts' blocks alone: their rows are the inputs
		if err := kernels.IdentityRows(g.dev, g.compute, sorted, gin.x32, out, gk, h, c.BankSize(), c.BankSize()+z); err != nil {
			return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
		}
	}
	y, err := g.f32Buffer(t*h, &fr)
	if err != nil {
		return nil, err
	}
	if err := g.lr.Finalize(out, slotW, y, t, k, h, slots.FinalScale); err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	if fl.Latent != nil { // the sums leave the latent; the shared experts read x
		if y, err = g.latentOut(src, fl.Latent, y, t, &fr); err != nil {
			return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
		}
		in, h = block, fl.Latent.H
	}
	if fl.Shared != nil {
		if c.NumFusedSharedExperts > 0 {
			return nil, fmt.Errorf("layer %d: the contract fuses %d shared experts but shared expert tensors (%s) remain", fl.Index, c.NumFusedSharedExperts, fl.Shared.First())
		}
		// Stored as the CPU twin reads it (moelayer.FusedLayer.denseMLP);
		// loadMLPBankOf refuses what the kernels cannot take.
		wf, err := c.SharedFormat()
		if err != nil {
			return nil, fmt.Errorf("layer %d shared expert: %w", fl.Index, err)
		}
		if err := g.addDense(src, *fl.Shared, fl.SharedGate, wf, fl.SharedAct(), in, y); err != nil {
			return nil, fmt.Errorf("layer %d shared expert: %w", fl.Index, err)
		}
	}
	if len(fl.SharedExperts) > 0 {
		if err := g.addRoutedShared(src, fl.SharedExperts, routing, cov, slots.FinalScale, nil, fl.SharedAct(), in, y); err != nil {
			return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
		}
	}
	ha, err := al.Host()
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	yh, err := y.ToHost(t * h)
	if err != nil {
		return nil, err
	}
	moelayer.ScaleOutput(yh, c.Output())
	return &moelayer.FusedResult{Y: yh, Routing: routing, Slots: slots, Align: ha}, nil
}

// oneExpertSorted builds the alignment of a bank of one expert over the
// given slots (padded with the sentinel numel to a multiple of the GEMM's
// row tile, every block expert 0).
func (g *Runner) oneExpertSorted(slots []int32, numel int, fr *Frees) (*kernels.Sorted, error) {
	n := kernels.CeilDiv(len(slots), BlockMultiple) * BlockMultiple
	ids := make([]int32, n)
	copy(ids, slots)
	for i := len(slots); i < n; i++ {
		ids[i] = int32(numel)
	}
	s, err := kernels.NewSorted(g.dev, ids, make([]int32, n/BlockMultiple), n, BlockMultiple, numel)
	if err != nil {
		return nil, err
	}
	fr.add(sortedFree{s})
	return s, nil
}

// addDense runs one hub-layout MLP over every token (a shared expert) and
// adds it to y, gated by sigmoid(x . w_gate) where gate names Qwen2-MoE's
// shared_expert_gate.
func (g *Runner) addDense(src tensorload.TensorSource, m family.MLP, gate string, wf weightfmt.Format, act layout.Activation, in *Input, y *cuda.Buffer[float32]) error {
	var fr Frees
	defer fr.Release(g)
	d, err := g.denseOut(src, m, gate, wf, act, in, &fr)
	if err != nil {
		return err
	}
	return d.addTo(g, y, in)
}

// denseRows is a dense MLP's output over every token, with its gate's
// logits (nil: ungated), on the device: what addDense adds to a layer's y.
type denseRows struct{ o, logit *cuda.Buffer[float32] }

// addTo adds the rows to y [t,h], each gated by sigmoid of its logit where
// there is one.
func (d denseRows) addTo(g *Runner, y *cuda.Buffer[float32], in *Input) error {
	return kernels.AddRows(g.dev, g.compute, y, d.o, d.logit, in.t, in.h)
}

// denseOut queues the dense MLP m (and its gate) over every token of in;
// its output buffers are freed with keep, its weights once it has run.
func (g *Runner) denseOut(src tensorload.TensorSource, m family.MLP, gate string, wf weightfmt.Format, act layout.Activation, in *Input, keep *Frees) (denseRows, error) {
	var fr Frees
	defer fr.Release(g)
	gt, ok := src.Tensor(m.First())
	if !ok {
		return denseRows{}, fmt.Errorf("tensor %s is missing", m.First())
	}
	if len(gt.Shape) != 2 || gt.Shape[0] <= 0 || gt.Shape[0] > 1<<30 {
		return denseRows{}, fmt.Errorf("%s: tensor %s has shape %v, want [I,%d]", gt.File, m.First(), gt.Shape, in.h)
	}
	inter := int(gt.Shape[0])
	bank, err := loadMLPBankOf(g.Stage, src, m, in.h, inter, wf, act)
	if err != nil {
		return denseRows{}, err
	}
	fr.add(bankFree{bank})
	// Waiting for the upload here costs one launch latency and keeps the
	// stager's I/O time apart from the GEMM's (LayerTiming).
	if err := g.Stage.wait(); err != nil {
		return denseRows{}, err
	}
	t, h := in.t, in.h
	slots := make([]int32, t)
	for i := range slots {
		slots[i] = int32(i)
	}
	sorted, err := g.oneExpertSorted(slots, t, &fr)
	if err != nil {
		return denseRows{}, err
	}
	mid, err := g.actBuffer(t*inter, &fr)
	if err != nil {
		return denseRows{}, err
	}
	var d denseRows
	if d.o, err = g.f32Buffer(t*h, keep); err != nil {
		return denseRows{}, err
	}
	if err := g.groupedGEMM(&bank.ExpertBank, sorted, in.act, t, 1, mid, d.o, &fr); err != nil {
		return denseRows{}, err
	}
	if gate != "" {
		gw, err := tensorload.LoadVector(src, gate, h)
		if err != nil {
			return denseRows{}, err
		}
		w, err := toDevice(g, gw, &fr)
		if err != nil {
			return denseRows{}, err
		}
		if d.logit, err = g.f32Buffer(t, keep); err != nil {
			return denseRows{}, err
		}
		if err := g.lr.Router(kernels.F32Mat(in.x32), kernels.F32Mat(w), d.logit, t, h, 1); err != nil {
			return denseRows{}, err
		}
	}
	return d, nil
}

// addRoutedShared adds shared experts the router weights per token
// (Inkling) to y: each shared expert s runs as a bank of one expert over
// slots t*S+s of every token (routed and cov's forced ones), then finalize
// weights each token's S slots by the routing's shared weights times scale
// (the routed sum's final scale) and the sum is added to y, all on the device.
func (g *Runner) addRoutedShared(src tensorload.TensorSource, mlps []family.MLP, routing *moe.Routing, cov *moelayer.Coverage, scale float32, wf weightfmt.Format, act layout.Activation, in *Input, y *cuda.Buffer[float32]) error {
	var fr Frees
	defer fr.Release(g)
	t, h, ns := in.t, in.h, len(mlps)
	weights := moelayer.SharedWeights(routing, cov)
	if routing.S != ns || len(weights) != t*ns {
		return fmt.Errorf("the routing weights %d shared experts (%d values for %d tokens), the checkpoint has %d", routing.S, len(weights), t, ns)
	}
	gt, ok := src.Tensor(mlps[0].First())
	if !ok || len(gt.Shape) != 2 || gt.Shape[0] <= 0 || gt.Shape[0] > 1<<30 {
		return fmt.Errorf("shared expert 0: tensor %s is missing or not [I,%d]", mlps[0].First(), h)
	}
	inter := int(gt.Shape[0])
	numel := t * ns
	mid, out, err := g.gemmBuffers(numel, inter, h, &fr)
	if err != nil {
		return err
	}
	for s, m := range mlps {
		bank, err := loadMLPBankOf(g.Stage, src, m, h, inter, wf, act)
		if err != nil {
			return fmt.Errorf("shared expert %d: %w", s, err)
		}
		fr.add(bankFree{bank})
		if err := g.Stage.wait(); err != nil { // see addDense
			return err
		}
		slots := make([]int32, t)
		for i := range slots {
			slots[i] = int32(i*ns + s)
		}
		sorted, err := g.oneExpertSorted(slots, numel, &fr)
		if err != nil {
			return err
		}
		if err := g.groupedGEMM(&bank.ExpertBank, sorted, in.act, t, ns, mid, out, &fr); err != nil {
			return fmt.Errorf("shared expert %d: %w", s, err)
		}
	}
	w, err := toDevice(g, weights, &fr)
	if err != nil {
		return err
	}
	ys, err := g.f32Buffer(t*h, &fr)
	if err != nil {
		return err
	}
	if err := g.lr.Finalize(out, w, ys, t, ns, h, scale); err != nil {
		return err
	}
	return kernels.AddRows(g.dev, g.compute, y, ys, nil, t, h)
}

type bankFree struct{ b *Bank }

func (f bankFree) Free() error { f.b.Free(); return nil }

// AddBank frees bank b with f, once the compute stream is done with it.
func (f *Frees) AddBank(b *Bank) { f.add(bankFree{b}) }

// UnfusedLayer runs a hub-layout (SRC) layer on the GPU the way an engine
// without fusion does: router and gate, then per expert the tokens routed to
// it through the grouped GEMM with a bank of that one expert (weights from
// the per-expert tensors), the weighted sum x rsf, plus the shared expert as
// a dense MLP.
//
// cov's forced tokens (nil: none) follow the routed ones in in and run in
// the same pass over the experts. pace (nil: none) paces the experts'
// reads in a streamed run. requant (nil: none) is the format DST's
// contract says fuse-shared requantised the plain shared expert into
// (shared_requantized): the shared expert then runs so requantised
// (RequantisedShared), as DST's fused replicas hold it, so that the fused
// path compares with this one at the GPU's usual tolerance. A latent MoE
// layer takes in as FusedLayer does, with SRC's latent tensors.
func (g *Runner) UnfusedLayer(ctx context.Context, src tensorload.TensorSource, plan *family.Plan, layer *family.Layer, in *Input, cov *moelayer.Coverage, pace moelayer.Pace, requant weightfmt.Format) (*moelayer.RefResult, error) {
	var fr Frees
	defer fr.Release(g)
	lt, err := moelayer.LatentOf(plan, layer)
	if err != nil {
		return nil, err
	}
	// A latent MoE's bank reads its latent (SRC's down projection of x),
	// its router and shared experts the block's input x.
	block := in
	if lt != nil {
		if in, err = g.latentIn(src, lt, block, cov, &fr); err != nil {
			return nil, fmt.Errorf("layer %d: %w", layer.Key(), err)
		}
	}
	h, inter, e, t := plan.HiddenSize, plan.IntermediateOf(*layer), plan.NumExperts, in.t
	if h != in.h {
		return nil, fmt.Errorf("layer %d: H %d, x has %d", layer.Key(), h, in.h)
	}
	if len(layer.Experts) != e {
		return nil, fmt.Errorf("layer %d: plan lists %d experts, config says %d", layer.Key(), len(layer.Experts), e)
	}
	if in, err = g.Prepared(src, moelayer.PrepOf(plan, layer), in, &fr); err != nil {
		return nil, fmt.Errorf("layer %d: %w", layer.Key(), err)
	}
	spec := plan.RouteSpec()
	routing, slots, _, slotW, err := g.gate(src, spec, moelayer.RouterOf(layer), in, cov, nil, &fr)
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", layer.Key(), err)
	}
	k := slots.K
	numel := t * k
	users := make([][]int32, e)
	var identity []int32 // slots on LongCat-Flash's zero-compute experts
	for s, id := range slots.IDs {
		if int(id) >= e && int(id) < e+plan.ZeroExperts {
			identity = append(identity, int32(s))
			continue
		}
		if id < 0 || int(id) >= e {
			return nil, fmt.Errorf("layer %d: the gate chose expert %d of %d", layer.Key(), id, e)
		}
		users[id] = append(users[id], int32(s))
	}
	mid, out, err := g.gemmBuffers(numel, inter, h, &fr)
	if err != nil {
		return nil, err
	}
	wf, _ := plan.Format() // nil (unquantised) for a quantization it does not know
	gin, gk := in, k
	if plan.RoutedInputScaled {
		if gin, slotW, err = g.inputScaled(in, slots, &fr); err != nil {
			return nil, fmt.Errorf("layer %d: %w", layer.Key(), err)
		}
		gk = 1
	}
	// The shared expert runs first: its bytes are the layer's head, which a
	// streamed pass reads before the routed experts. A requantised one is
	// quantised on the host meanwhile, beside the routed experts (about a
	// second of a core for Kimi-K2's, which before them, or after them,
	// was the path's tail), and runs after the first routed expert queued
	// once it is ready (or after the last), so that its quantised bytes
	// are read while the requantiser's cache still holds them, and, where
	// they are too large for it and held apart (tensorload.Computed), let
	// go early in the layer rather than at its end.
	// Its rows are added to y where they always were, so y does not
	// change, nor does which error is reported (its own, after the routed
	// experts').
	var shared sharedRows
	var requantised *hostRequant
	sharedIn := in // the shared experts read x: a latent MoE's too
	if lt != nil {
		sharedIn = block
	}
	switch {
	case layer.Shared != nil && requant != nil:
		requantised = startHostRequant(src, *layer.Shared, requant)
		defer requantised.wait()
	case layer.Shared != nil:
		shared = g.sharedRows(src, plan, layer, nil, sharedIn, &fr)
	}
	for id := range e {
		if len(users[id]) == 0 {
			if pace != nil {
				pace.Done(id)
			}
			continue
		}
		if pace != nil {
			if err := pace.Take(ctx, id); err != nil {
				return nil, err
			}
		}
		err := g.oneExpert(src, layer.Experts[id], h, inter, wf, plan.RoutedAct(*layer), users[id], numel, gk, gin, mid, out)
		if pace != nil {
			pace.Done(id) // oneExpert waited for its copies
		}
		if err != nil {
			return nil, fmt.Errorf("layer %d expert %d: %w", layer.Key(), id, err)
		}
		if requantised != nil && requantised.ready() {
			shared = g.requantisedRows(requantised, plan, layer, sharedIn, &fr)
			requantised = nil
		}
	}
	if len(identity) > 0 { // their rows are the tokens' inputs, in one launch
		sorted, err := g.oneExpertSorted(identity, numel, &fr)
		if err != nil {
			return nil, err
		}
		if err := kernels.IdentityRows(g.dev, g.compute, sorted, in.x32, out, k, h, 0, 1); err != nil {
			return nil, fmt.Errorf("layer %d: %w", layer.Key(), err)
		}
	}
	y, err := g.f32Buffer(t*h, &fr)
	if err != nil {
		return nil, err
	}
	if err := g.lr.Finalize(out, slotW, y, t, k, h, slots.FinalScale); err != nil {
		return nil, err
	}
	if requantised != nil {
		shared = g.requantisedRows(requantised, plan, layer, sharedIn, &fr)
	}
	if lt != nil { // the sums leave the latent; the shared experts read x
		if y, err = g.latentOut(src, lt, y, t, &fr); err != nil {
			return nil, fmt.Errorf("layer %d: %w", layer.Key(), err)
		}
		in, h = block, lt.H
	}
	if layer.Shared != nil {
		if shared.err != nil {
			return nil, shared.err
		}
		if err := shared.rows.addTo(g, y, in); err != nil {
			return nil, fmt.Errorf("layer %d shared expert: %w", layer.Key(), err)
		}
	}
	if len(layer.SharedExperts) > 0 {
		if err := g.addRoutedShared(src, layer.SharedExperts, routing, cov, float32(spec.RoutedScalingFactor), wf, plan.SharedActOf(*layer), in, y); err != nil {
			return nil, fmt.Errorf("layer %d: %w", layer.Key(), err)
		}
	}
	yh, err := y.ToHost(t * h)
	if err != nil {
		return nil, err
	}
	moelayer.ScaleOutput(yh, plan.Output())
	return &moelayer.RefResult{Y: yh, Routing: routing}, nil
}

// sharedRows is the unfused path's plain shared expert over every token
// (its rows, or why it could not run).
type sharedRows struct {
	rows denseRows
	err  error
}

// sharedRows queues layer's plain shared expert over every token of in, in
// the format it is stored in (apart from the routed experts' where the
// plan says so: DeepSeek-V4's FP8 blocks beside FP4, Kimi's BF16 beside
// INT4), as the CPU reference reads it, or requantised into requant (nil:
// not) as rq holds it; its rows are freed with fr.
func (g *Runner) sharedRows(src tensorload.TensorSource, plan *family.Plan, layer *family.Layer, rq *hostRequant, in *Input, fr *Frees) sharedRows {
	swf, err := plan.SharedFormat()
	if err != nil {
		return sharedRows{err: fmt.Errorf("layer %d shared expert: %w", layer.Key(), err)}
	}
	ssrc, sm := src, *layer.Shared
	if rq != nil {
		if rq.err != nil {
			return sharedRows{err: fmt.Errorf("layer %d: %w", layer.Key(), rq.err)}
		}
		sm, ssrc, swf = rq.m, rq.src, rq.f
	}
	rows, err := g.denseOut(ssrc, sm, layer.SharedGate, swf, plan.SharedActOf(*layer), in, fr)
	if err != nil {
		return sharedRows{err: fmt.Errorf("layer %d shared expert: %w", layer.Key(), err)}
	}
	return sharedRows{rows: rows}
}

// requantisedRows is sharedRows of the requantised shared expert rq
// computes, once it has. rq lets its quantised bytes go once they are
// uploaded.
func (g *Runner) requantisedRows(rq *hostRequant, plan *family.Plan, layer *family.Layer, in *Input, fr *Frees) sharedRows {
	rq.wait()
	rows := g.sharedRows(nil, plan, layer, rq, in, fr)
	rq.src = nil
	return rows
}

// hostRequant is a plain shared expert quantised on the host into f
// (RequantisedShared), computed in the background: m names its tensors in
// src, which holds the quantised ones in memory once computed (or, where
// computing them failed, as computed on each read, so that loading them
// fails as it always did, naming the tensor and element), err why it could
// not be quantised at all.
type hostRequant struct {
	done chan struct{}
	f    weightfmt.Format
	m    family.MLP
	src  tensorload.TensorSource
	err  error
}

// startHostRequant starts quantising shared (of src) into f.
func startHostRequant(src tensorload.TensorSource, shared family.MLP, f weightfmt.Format) *hostRequant {
	rq := &hostRequant{done: make(chan struct{}), f: f}
	go func() {
		defer close(rq.done)
		if rq.m, rq.src, rq.err = RequantisedShared(src, shared, f); rq.err == nil {
			rq.src = tensorload.Computed(rq.src, rq.m.Names())
		}
	}()
	return rq
}

// wait returns once the quantisation is done (again: at once).
func (rq *hostRequant) wait() { <-rq.done }

// ready reports whether the quantisation is done.
func (rq *hostRequant) ready() bool {
	select {
	case <-rq.done:
		return true
	default:
		return false
	}
}

// oneExpert uploads one expert and queues its SwiGLU over its slots, writing
// those slots' rows of out; its device memory is released once the compute
// stream has run it.
func (g *Runner) oneExpert(src tensorload.TensorSource, m family.MLP, h, inter int, wf weightfmt.Format, act layout.Activation, slots []int32, numel, k int, in *Input, mid kernels.Mat, out *cuda.Buffer[float32]) error {
	var fr Frees
	defer fr.Release(g)
	bank, err := loadMLPBankOf(g.Stage, src, m, h, inter, wf, act)
	if err != nil {
		return err
	}
	fr.add(bankFree{bank})
	if err := g.Stage.wait(); err != nil { // see addDense
		return err
	}
	sorted, err := g.oneExpertSorted(slots, numel, &fr)
	if err != nil {
		return err
	}
	return g.groupedGEMM(&bank.ExpertBank, sorted, in.act, in.t, k, mid, out, &fr)
}

// groupedGEMM queues both stages of the grouped GEMM in the run's
// precision, with the f32 scratch that experts with biases or another
// activation than SwiGLU need (kernels/act.go), freed with fr.
func (g *Runner) groupedGEMM(bank *kernels.ExpertBank, sorted *kernels.Sorted, x kernels.Mat, t, k int, inter kernels.Mat, out *cuda.Buffer[float32], fr *Frees) error {
	var quant *kernels.QuantScratch
	if g.w8a8 {
		q, err := kernels.NewQuantScratch(g.dev, t, k, bank.H, bank.I)
		if err != nil {
			return err
		}
		fr.add(q)
		quant = q
	}
	var scratch *cuda.Buffer[float32]
	if bank.UnfusedAct() {
		var err error
		if scratch, err = g.f32Buffer(2*sorted.Numel*bank.I, fr); err != nil {
			return err
		}
	}
	return g.lr.GroupedGEMM(bank, sorted, x, t, k, inter, out, quant, scratch)
}

// inputScaled is the documented GPU fallback for a router weight that
// scales the expert input (Llama 4): the gate's slots come back to the host
// (they already do, for the report), each slot's row w * x is built there
// and uploaded as the grouped GEMM's input with one slot per row, and
// finalize sums each token's slots with weight 1. Engines do the same
// multiply on the device before the GEMM (vLLM's
// apply_router_weight_on_input); the GEMM and finalize are unchanged.
func (g *Runner) inputScaled(in *Input, slots *moe.Slots, fr *Frees) (*Input, *cuda.Buffer[float32], error) {
	if len(in.x) != in.t*in.h || len(slots.Weights) != in.t*slots.K {
		return nil, nil, fmt.Errorf("input-scaled slots: %d host values for %d tokens x %d, %d slot weights", len(in.x), in.t, in.h, len(slots.Weights))
	}
	rows, err := g.Input(moelayer.SlotRows(in.x, in.h, slots.K, slots.Weights), in.t*slots.K, in.h, fr)
	if err != nil {
		return nil, nil, err
	}
	w, err := cuda.FromHost(g.dev, moelayer.Ones(len(slots.Weights)))
	if err != nil {
		return nil, nil, err
	}
	fr.add(w)
	return rows, w, nil
}

// routedTokens is how many of in's tokens the router sees: all but cov's.
func routedTokens(in *Input, cov *moelayer.Coverage) int {
	if cov == nil {
		return in.t
	}
	return in.t - cov.T
}
