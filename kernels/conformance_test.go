package kernels_test

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/moe/moetest"
)

// The GPU kernels run moe's conformance suite (moe/moetest) through the
// adapters below, each case's buffers made and freed per call. The suite
// compares with its own float64 references; the kernels' bit-for-bit
// agreement with the CPU twins, where they have it, is checked beside
// (TestFinalizeMatchesTwin, TestGroupedGEMMFP8Decode).

// devBufs frees the device buffers one adapter call made.
type devBufs []interface{ Free() error }

func (d devBufs) free() {
	for _, b := range d {
		b.Free()
	}
}

func upload[T cuda.Elem](dev *cuda.Device, bufs *devBufs, v []T) (*cuda.Buffer[T], error) {
	b, err := cuda.FromHost(dev, v)
	if err == nil {
		*bufs = append(*bufs, b)
	}
	return b, err
}

// poisonedF32 is n float32 NaNs on the device, so an element a kernel
// forgot to write fails the comparison.
func poisonedF32(dev *cuda.Device, bufs *devBufs, n int) (*cuda.Buffer[float32], error) {
	b, err := cuda.Alloc[float32](dev, n)
	if err != nil {
		return nil, err
	}
	*bufs = append(*bufs, b)
	return b, b.Fill(float32(math.NaN()))
}

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), moetest.ErrUnsupported)
}

// gateRouter runs the suite's route cases through one gate kernel variant.
type gateRouter struct {
	dev    *cuda.Device
	kernel string
}

func (g gateRouter) Route(c *moetest.RouteCase) (*moetest.RouteResult, error) {
	spec := kernels.GateSpec{RouteSpec: c.Spec, Shared: c.Shared, WeightScale: c.Scale}
	if err := c.Spec.Check(); err == nil && g.kernel != kernels.GateBlock && c.Spec.NumExperts > kernels.GateMaxExperts {
		return nil, unsupported("%d experts (%s takes %d)", c.Spec.NumExperts, g.kernel, kernels.GateMaxExperts)
	}
	if err := spec.Check(); err != nil {
		return nil, err
	}
	hashOK := c.HashIDs == nil || c.Spec.Scoring.PerExpert() && c.Spec.SharedLogits == 0
	if g.kernel != kernels.GateReg && hashOK && (c.HashIDs != nil || c.Spec.SharedLogits > 0 || c.Scale != 1 ||
		!slices.Contains(kernels.GateBlockScorings(), c.Spec.Scoring) || c.Bias != nil && c.Spec.Scoring == moe.Softmax) {
		return nil, unsupported("hash ids, shared router rows, a weight scale, softmax + bias and %s scores are %s's alone", c.Spec.Scoring, kernels.GateReg)
	}
	var bufs devBufs
	defer bufs.free()
	logits, err := upload(g.dev, &bufs, c.Logits)
	if err != nil {
		return nil, err
	}
	var bias *cuda.Buffer[float32]
	if c.Bias != nil {
		if bias, err = upload(g.dev, &bufs, c.Bias); err != nil {
			return nil, err
		}
	}
	out, err := kernels.NewGateOut(g.dev, spec, c.T, true)
	if err != nil {
		return nil, err
	}
	defer out.Free()
	if c.HashIDs != nil {
		if out.HashIDs, err = upload(g.dev, &bufs, c.HashIDs); err != nil {
			return nil, err
		}
	}
	// Poison the outputs so that an unwritten slot cannot pass.
	for _, err := range []error{out.IDs.Fill(-7), out.Weights.Fill(float32(math.NaN())), out.Choice.Fill(float32(math.NaN()))} {
		if err != nil {
			return nil, err
		}
	}
	if err := g.dev.Do(func(cx *cuda.Ctx) error {
		return kernels.GateKernelCtx(cx, g.kernel, 0, spec, c.T, logits, bias, out)
	}); err != nil {
		return nil, err
	}
	r := &moetest.RouteResult{}
	if r.IDs, err = out.IDs.ToHost(-1); err != nil {
		return nil, err
	}
	if r.Weights, err = out.Weights.ToHost(-1); err != nil {
		return nil, err
	}
	if r.Choice, err = out.Choice.ToHost(-1); err != nil {
		return nil, err
	}
	if out.Shared != nil {
		if r.Shared, err = out.Shared.ToHost(-1); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// TestGateConforms: every gate kernel variant against moe's routing suite
// (GateWarp and GateBlock skip what only GateReg implements).
func TestGateConforms(t *testing.T) {
	dev := testDevice(t)
	for _, kernel := range gateVariants() {
		t.Run(kernel, func(t *testing.T) { moetest.TestRoute(t, gateRouter{dev, kernel}) })
	}
}

// alignRunner runs the suite's alignments through one align variant.
type alignRunner struct {
	dev     *cuda.Device
	variant string
}

func (a alignRunner) Align(ids []int32, e, block int) (*moe.Alignment, error) {
	if len(ids) == 0 && e > 0 && block > 0 {
		return nil, unsupported("no slots (the device arrays need one)")
	}
	al, err := kernels.NewAlignment(a.dev, len(ids), e, block)
	if err != nil {
		return nil, err
	}
	defer al.Free()
	if a.variant == kernels.AlignSingle && !kernels.AlignSingleFits(len(ids), e) {
		return nil, unsupported("%d slots over %d experts do not fit the single-launch kernel", len(ids), e)
	}
	for _, b := range []*cuda.Buffer[int32]{al.SortedTokenIDs, al.ExpertIDs, al.Counts, al.Cumsum, al.Total} {
		if err := b.Fill(-5); err != nil {
			return nil, err
		}
	}
	var bufs devBufs
	defer bufs.free()
	d, err := upload(a.dev, &bufs, ids)
	if err != nil {
		return nil, err
	}
	if err := a.dev.Do(func(cx *cuda.Ctx) error { return kernels.AlignVariantCtx(cx, a.variant, 0, d, al) }); err != nil {
		return nil, err
	}
	return al.Host()
}

// TestAlignConforms: both align variants against moe's alignment suite,
// every array exactly (the order of slots within an expert included).
func TestAlignConforms(t *testing.T) {
	dev := testDevice(t)
	for _, v := range []string{kernels.AlignSingle, kernels.AlignMulti} {
		t.Run(v, func(t *testing.T) { moetest.TestAlign(t, alignRunner{dev, v}) })
	}
}

// gemmRunner runs the suite's grouped GEMMs with weights held as w (f32 or
// bf16: the suite's values are bf16, so either holds them exactly) and the
// given options.
type gemmRunner struct {
	dev    *cuda.Device
	w      kernels.MatDType
	opt    kernels.GEMMOptions
	hopper bool
}

// refuses says why the kernels refuse a case (the paths' shape and dtype
// rules; GroupedGEMM returns an error for each), "" when they take it.
func (g gemmRunner) refuses(c *moetest.GEMMCase) string {
	tensor := g.opt.Act == kernels.MatBF16 && g.w == kernels.MatBF16
	dims8 := c.H%8 == 0 && c.I%8 == 0
	switch p := g.opt.Path; {
	case c.Align.BlockSize%16 != 0:
		return fmt.Sprintf("block size %d (the kernels take multiples of 16)", c.Align.BlockSize)
	case p != kernels.PathAuto && p != kernels.PathSIMT && !tensor:
		return "tensor-core paths need bf16 activations and weights"
	case (p == kernels.PathMMAVec || p == kernels.PathMMATall || p == kernels.PathMMA3 || p == kernels.PathWGMMA) && !dims8:
		return fmt.Sprintf("H %d, I %d: 16-byte loads need multiples of 8", c.H, c.I)
	case p == kernels.PathWGMMA && !g.hopper:
		return "wgmma needs compute capability 9.0"
	}
	return ""
}

func (g gemmRunner) GroupedGEMM(c *moetest.GEMMCase) ([]float32, error) {
	if why := g.refuses(c); why != "" {
		return nil, unsupported("%s", why)
	}
	e, numel := len(c.Experts), c.T*c.K
	act := layout.Activation{}
	switch a := c.Experts[0].Act.(type) {
	case nil:
	case moetest.ClampedSwiGLU:
		act = layout.Activation{Alpha: a.Alpha, Limit: a.Limit, UpOffset: a.UpOffset, ClampAfter: a.ClampAfter}
	default:
		return nil, unsupported("activation %T", a)
	}
	var bufs devBufs
	defer bufs.free()
	// every expert's values of one weight (or bias), back to back
	concat := func(pick func(m *moe.ExpertMats) []float32) []float32 {
		var all []float32
		for x := range c.Experts {
			all = append(all, pick(&c.Experts[x])...)
		}
		return all
	}
	bank := &kernels.ExpertBank{NumExperts: e, H: c.H, I: c.I, DType: g.w, Act: act}
	var err error
	for _, w := range []struct {
		to   *kernels.Mat
		pick func(m *moe.ExpertMats) []float32
	}{
		{&bank.Gate, func(m *moe.ExpertMats) []float32 { return m.Gate }},
		{&bank.Up, func(m *moe.ExpertMats) []float32 { return m.Up }},
		{&bank.Down, func(m *moe.ExpertMats) []float32 { return m.Down }},
	} {
		if *w.to, err = deviceValues(g.dev, &bufs, g.w, concat(w.pick)); err != nil {
			return nil, err
		}
	}
	if c.Experts[0].GateBias != nil {
		for _, b := range []struct {
			to   **cuda.Buffer[float32]
			pick func(m *moe.ExpertMats) []float32
		}{
			{&bank.GateBias, func(m *moe.ExpertMats) []float32 { return m.GateBias }},
			{&bank.UpBias, func(m *moe.ExpertMats) []float32 { return m.UpBias }},
			{&bank.DownBias, func(m *moe.ExpertMats) []float32 { return m.DownBias }},
		} {
			if *b.to, err = upload(g.dev, &bufs, concat(b.pick)); err != nil {
				return nil, err
			}
		}
	}
	sorted, err := sortedWithTail(g.dev, c.Align, e)
	if err != nil {
		return nil, err
	}
	defer sorted.Free()
	x, err := deviceValues(g.dev, &bufs, g.opt.Act, c.X)
	if err != nil {
		return nil, err
	}
	nan := make([]float32, numel*c.I)
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	inter, err := deviceValues(g.dev, &bufs, g.opt.Act, nan)
	if err != nil {
		return nil, err
	}
	out, err := poisonedF32(g.dev, &bufs, numel*c.H)
	if err != nil {
		return nil, err
	}
	opt := g.opt
	if bank.UnfusedAct() {
		if opt.Scratch, err = poisonedF32(g.dev, &bufs, 2*numel*c.I); err != nil {
			return nil, err
		}
	}
	if err := kernels.GroupedGEMM(g.dev, 0, bank, sorted, x, c.T, c.K, inter, out, opt); err != nil {
		return nil, err
	}
	return out.ToHost(-1)
}

// deviceValues uploads float32 values as d (f32, or bf16 rounded to nearest
// even: exact for the suite's values).
func deviceValues(dev *cuda.Device, bufs *devBufs, d kernels.MatDType, v []float32) (kernels.Mat, error) {
	if d == kernels.MatBF16 {
		b := make([]uint16, len(v))
		for i, f := range v {
			b[i] = numfmt.F32ToBF16(f)
		}
		buf, err := upload(dev, bufs, b)
		if err != nil {
			return kernels.Mat{}, err
		}
		return kernels.BF16Mat(buf), nil
	}
	buf, err := upload(dev, bufs, v)
	if err != nil {
		return kernels.Mat{}, err
	}
	return kernels.F32Mat(buf), nil
}

// sortedWithTail puts a host alignment on the device in worst-case-sized
// buffers whose tail past TotalPadded holds a real slot (0) and an expert
// other than slot 0's: a kernel that ignored the total would overwrite
// slot 0's row with a wrong expert's result.
func sortedWithTail(dev *cuda.Device, al *moe.Alignment, e int) (*kernels.Sorted, error) {
	maxPad := moe.MaxPaddedTokens(int(al.Numel), e, al.BlockSize)
	sorted := make([]int32, maxPad)
	copy(sorted, al.SortedTokenIDs)
	experts := make([]int32, kernels.CeilDiv(maxPad, al.BlockSize))
	copy(experts, al.ExpertIDs)
	other := int32(0)
	if i := slices.Index(al.SortedTokenIDs, 0); i >= 0 {
		other = (al.ExpertIDs[i/al.BlockSize] + 1) % int32(e)
	}
	for i := len(al.ExpertIDs); i < len(experts); i++ {
		experts[i] = other
	}
	return kernels.NewSorted(dev, sorted, experts, int(al.TotalPadded), al.BlockSize, int(al.Numel))
}

// TestGroupedGEMMConforms runs moe's grouped GEMM suite on every path.
// Tolerances per output row (relative L2 to the float64 reference):
//   - f32 activations: f32-accumulated dot products of the same numbers in
//     another order, a few ulps of the row sums: 1e-5.
//   - bf16 activations: the intermediate is rounded to bf16 before the down
//     GEMM (2^-9 relative an element, ~1e-3 in L2 for random signs): 1e-2.
func TestGroupedGEMMConforms(t *testing.T) {
	dev := testDevice(t)
	hopper := dev.Major == 9 && dev.Minor == 0
	for _, m := range []struct {
		name string
		w    kernels.MatDType
		opt  kernels.GEMMOptions
		tol  float64
	}{
		{"f32 weights f32", kernels.MatF32, kernels.GEMMOptions{Act: kernels.MatF32}, 1e-5},
		{"bf16 weights f32", kernels.MatBF16, kernels.GEMMOptions{Act: kernels.MatF32}, 1e-5},
		{"bf16 simt", kernels.MatBF16, kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathSIMT}, 1e-2},
		{"bf16 mma", kernels.MatBF16, kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathMMA}, 1e-2},
		{"bf16 mma2", kernels.MatBF16, kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathMMAVec}, 1e-2},
		{"bf16 auto", kernels.MatBF16, kernels.GEMMOptions{Act: kernels.MatBF16}, 1e-2},
		{"bf16 tall", kernels.MatBF16, kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathMMATall}, 1e-2},
		{"bf16 wgmma", kernels.MatBF16, kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathWGMMA}, 1e-2},
		{"bf16 mma3", kernels.MatBF16, kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathMMA3}, 1e-2},
	} {
		t.Run(m.name, func(t *testing.T) {
			moetest.TestGroupedGEMM(t, gemmRunner{dev: dev, w: m.w, opt: m.opt, hopper: hopper}, m.tol)
		})
	}
}

// finalizer runs the suite's finalize cases through the kernel.
type finalizer struct{ dev *cuda.Device }

func (f finalizer) Finalize(out []float32, t, k, h int, w []float32, scale float32) ([]float32, error) {
	var bufs devBufs
	defer bufs.free()
	do, err := upload(f.dev, &bufs, out)
	if err != nil {
		return nil, err
	}
	dw, err := upload(f.dev, &bufs, w)
	if err != nil {
		return nil, err
	}
	y, err := poisonedF32(f.dev, &bufs, max(t*h, 1))
	if err != nil {
		return nil, err
	}
	if err := kernels.Finalize(f.dev, 0, do, dw, y, t, k, h, scale); err != nil {
		return nil, err
	}
	return y.ToHost(t * h)
}

func TestFinalizeConforms(t *testing.T) {
	moetest.TestFinalize(t, finalizer{testDevice(t)})
}
