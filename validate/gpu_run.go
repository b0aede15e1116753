package validate

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/gpurun"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/stream"
	"github.com/moeprep/moeprep/weightfmt"
)

// LayerTiming is where one layer's time went in a GPU run (gpurun.LayerTiming).
type LayerTiming = gpurun.LayerTiming

// CPUCheckMode is which layers of a GPU run the CPU reference also checks
// (Options.CPUCheck, --cpu-check).
type CPUCheckMode string

// The CPU reference sampling of a GPU run (Options.CPUCheck).
const (
	CPUCheckAuto CPUCheckMode = "auto" // first and last layer, or all when there are at most 4
	CPUCheckNone CPUCheckMode = "none" // GPU paths only
	CPUCheckAll  CPUCheckMode = "all"  // every layer
)

// refSampled picks the layers the CPU reference runs on in a GPU run, per
// mode (CPUCheckAuto when empty).
func refSampled(targets []target, mode CPUCheckMode) map[int]bool {
	layers := make([]int, len(targets))
	for i, tg := range targets {
		layers[i] = tg.index
	}
	return CPUChecked(layers, mode)
}

// CPUChecked picks, of the layers a GPU run checks (in order), those the
// CPU also checks, per mode (CPUCheckAuto when empty): none, all, or the
// first and the last (all when there are at most 4). The per-rank
// recomposition picks its CPU twin's layers with it.
func CPUChecked(layers []int, mode CPUCheckMode) map[int]bool {
	out := map[int]bool{}
	for i, l := range layers {
		switch mode {
		case CPUCheckNone:
		case CPUCheckAll:
			out[l] = true
		default:
			if len(layers) <= 4 || i == 0 || i == len(layers)-1 {
				out[l] = true
			}
		}
	}
	return out
}

// openGPU opens the GPU runner of a run of targets, names the device in
// rep, and says which layers the CPU reference samples.
func (s *session) openGPU(targets []target, rep *Report) (*gpurun.Runner, map[int]bool, error) {
	g, err := gpurun.Open(string(s.o.GPUPrecision))
	if err != nil {
		return nil, nil, err
	}
	rep.DeviceName = g.Device().String()
	rep.GPUPrecision = s.o.GPUPrecision
	return g, refSampled(targets, s.o.CPUCheck), nil
}

// bankLoad is one layer's fused bank streaming to the device, with the
// I/O it took.
type bankLoad struct {
	bank *gpurun.Bank
	err  error
	rec  gpurun.StageRecord
}

// runGPU checks every target on the GPU. The fused bank of the next layer
// streams in on the copy stream while this layer computes, so at most two
// layers' banks are on the device. Each layer's timing goes into
// rep.Timings; with Options.IOBaseline the same bytes are then read and
// uploaded again without compute, for the ratio.
func (s *session) runGPU(ctx context.Context, targets []target, rep *Report) error {
	g, sampled, err := s.openGPU(targets, rep)
	if err != nil {
		return err
	}
	defer g.Close()
	// A layer that fails ends the run: the next layer's bank, loading
	// meanwhile, stops at its next expert rather than loading whole first.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := func(tg target) chan bankLoad {
		ch := make(chan bankLoad, 1)
		if tg.fused == nil || s.dst == nil {
			ch <- bankLoad{}
			return ch
		}
		go func() {
			var ld bankLoad
			ld.err = gpurun.Recording(g.Prefetch, &ld.rec, func() error {
				var err error
				ld.bank, err = gpurun.LoadFusedBank(ctx, g.Prefetch, s.dst, tg.fused)
				return err
			})
			ch <- ld
		}()
		return ch
	}
	pending := start(targets[0])
	defer func() {
		if pending != nil {
			cancel()
			(<-pending).bank.Free()
		}
	}()
	layerStart := time.Now()
	for i, tg := range targets {
		if err := ctx.Err(); err != nil {
			return err
		}
		s.o.progress("validate: layer %s (%d of %d) on %s", tg.label(), i+1, len(targets), rep.DeviceName)
		t0 := time.Now()
		ld := <-pending
		pending = nil
		if ld.err != nil {
			rows, err := nonFiniteRows(tg, s.o.Tokens, fmt.Errorf("%s: %w", s.o.Dst, ld.err))
			if err != nil {
				return err
			}
			rep.Rows = append(rep.Rows, rows...)
			if i+1 < len(targets) {
				pending = start(targets[i+1])
			}
			continue
		}
		tm := LayerTiming{Layer: tg.index, DstBytes: ld.rec.Bytes, DstIOSeconds: ld.rec.Busy.Seconds(),
			BankWaitSeconds: time.Since(t0).Seconds(), Staged: ld.rec.Staged}
		if i+1 < len(targets) {
			pending = start(targets[i+1])
		}
		rows, err := s.checkLayerGPU(ctx, g, tg, ld.bank, nil, sampled[tg.index], &tm)
		ld.bank.Free()
		if err != nil {
			return err
		}
		tm.WallSeconds = time.Since(layerStart).Seconds()
		layerStart = time.Now()
		s.o.progress("validate: %s", tm.Line())
		rep.Rows = append(rep.Rows, rows...)
		rep.Timings = append(rep.Timings, tm)
	}
	s.ioBaseline(g, rep)
	return nil
}

// ioBaseline, with Options.IOBaseline, reads and uploads each timed
// layer's bytes again without compute, for the timings' ratio.
func (s *session) ioBaseline(g *gpurun.Runner, rep *Report) {
	if !s.o.IOBaseline {
		return
	}
	s.o.progress("validate: io baseline: reading and uploading each layer's bytes again, no compute")
	if err := g.IOBaseline(rep.Timings); err != nil {
		rep.Notes = append(rep.Notes, err.Error())
		return
	}
	for i := range rep.Timings {
		s.o.progress("validate: %s", rep.Timings[i].Line())
	}
}

// gpuStreams reports whether a GPU run of targets goes over one streamed
// pass (runGPUStreamed): SRC and DST are both given, every target has
// both sides, and every fused bank loads expert by expert. Other runs
// load each bank whole, the next one while a layer computes (runGPU).
func (s *session) gpuStreams(targets []target) bool {
	if s.src == nil || s.dst == nil {
		return false
	}
	for _, tg := range targets {
		if tg.fused == nil || tg.src == nil || !gpurun.LoadsInOrder(tg.fused) {
			return false
		}
	}
	return true
}

// runGPUStreamed checks every target on the GPU over one streamed pass
// (pass.go), which with withBytes also feeds the byte proof: each byte of
// SRC and DST is read once. Per layer, the fused bank's upload, the GPU
// unfused path and the CPU reference (on sampled layers) read each
// expert's step as the pass brings it in; the fused path runs once its
// bank is complete. At most one bank is on the device. The device opens
// (its context, kernels and pinned buffers: tenths of a second) while the
// pass's first reads come in, not before them.
func (s *session) runGPUStreamed(ctx context.Context, targets []target, rep *Report, withBytes bool) error {
	dev := s.openGPUAsync(rep)
	defer dev.close()
	sampled := refSampled(targets, s.o.CPUCheck)
	layerStart := time.Now()
	on := func() string {
		if _, err := dev.wait(); err != nil {
			return ""
		}
		return " on " + rep.DeviceName
	}
	err := s.streamPass(ctx, targets, rep, withBytes, on, stream.Options{Depth: gpuPassDepth}, gpuPassSteps, func(ctx context.Context, tg target, lp layerPass) ([]LayerResult, error) {
		g, err := dev.wait()
		if err != nil {
			return nil, err
		}
		tm := LayerTiming{Layer: tg.index}
		rows, err := s.checkLayerGPU(ctx, g, tg, nil, &lp, sampled[tg.index], &tm)
		if err != nil {
			return nil, err
		}
		tm.WallSeconds = time.Since(layerStart).Seconds()
		layerStart = time.Now()
		s.o.progress("validate: %s", tm.Line())
		rep.Timings = append(rep.Timings, tm)
		return rows, nil
	})
	if err != nil {
		return err
	}
	g, err := dev.wait()
	if err != nil {
		return err
	}
	s.ioBaseline(g, rep)
	return nil
}

// asyncGPU is a GPU runner being opened in the background (openGPUAsync).
type asyncGPU struct {
	ch   chan struct{} // closed once the open returned
	g    *gpurun.Runner
	err  error
	rep  *Report
	once sync.Once
}

// openGPUAsync starts opening the GPU runner of s's run; wait returns it
// (and names the device in rep, once), close closes it.
func (s *session) openGPUAsync(rep *Report) *asyncGPU {
	a := &asyncGPU{ch: make(chan struct{}), rep: rep}
	go func() {
		defer close(a.ch)
		a.g, a.err = gpurun.Open(string(s.o.GPUPrecision))
	}()
	a.rep.GPUPrecision = s.o.GPUPrecision
	return a
}

// wait returns the runner once it is open, or why it did not open.
func (a *asyncGPU) wait() (*gpurun.Runner, error) {
	<-a.ch
	a.once.Do(func() {
		if a.err == nil {
			a.rep.DeviceName = a.g.Device().String()
		}
	})
	return a.g, a.err
}

// close closes the runner, once it is open.
func (a *asyncGPU) close() {
	if g, err := a.wait(); err == nil {
		g.Close()
	}
}

// gpuPassSteps is the read-ahead of a GPU run's streamed pass: each
// layer's head and this many of its expert steps (layerBudget), up to
// stream's MaxBudget. More than stream's default of four: three readers
// (the bank's upload, the GPU unfused path, the CPU reference) and the
// byte proof each hold a layer's steps a while, and with room for four,
// one reader's pause stopped the disk. paceWindow grows with it.
const gpuPassSteps = 6

// gpuPassDepth is the reads a GPU run's pass keeps in flight (stream's
// default: 4).
const gpuPassDepth = stream.DefaultDepth

// paceWindow is how many bank steps a reader of a streamed GPU layer may
// run ahead of the slowest: what the pass's budget holds beside the
// layer's head, and at least 4, so that the CPU reference keeps 4 experts
// in flight. With the head left out (budget/step), a Kimi-K2 INT4 layer's
// readers spread over one step more than the budget held beside its 88 MB
// head, and the pass held 96 MB past its budget for them.
func paceWindow(lp *layerPass) int {
	if lp.step <= 0 {
		return 4
	}
	return max(4, int((lp.budget-lp.head)/lp.step))
}

// gpuNumerics is how the GPU paths compute (Options.GPUPrecision), which
// picks their checks' tolerances.
func (s *session) gpuNumerics() judge.Numerics {
	switch s.o.GPUPrecision {
	case PrecisionBF16:
		return judge.GPUBF16
	case PrecisionFP8:
		return judge.GPUW8A8
	}
	return judge.GPUF32
}

// checkLayerGPU runs one layer's GPU fused and unfused paths (and the CPU
// reference on sampled layers, concurrently) and compares them. The fused
// bank is loaded before (bank), or, in a streamed pass (lp set), loaded
// expert by expert beside the unfused path and the reference, the three
// reading each expert's step of the pass once between them (layerPace).
func (s *session) checkLayerGPU(ctx context.Context, g *gpurun.Runner, tg target, bank *gpurun.Bank, lp *layerPass, withRef bool, tm *LayerTiming) ([]LayerResult, error) {
	x, t, h, g0, tokens, cov, err := s.layerStart(tg)
	if err != nil {
		return nil, err
	}
	// A GPU path's error ends the layer: the CPU reference and the bank's
	// upload, which run beside it, stop at their next expert (their paces
	// and the bank's loader check ctx) instead of running the layer out.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	xAll := x
	latent := s.dstPlanOrSrc().Latent != nil
	if cov != nil && !latent {
		// A latent MoE's forced rows are latent, the bank's input, which
		// the GPU paths make from x (gpurun's latentIn) and append them to.
		xAll = append(append([]float32(nil), x...), cov.X...)
	}
	withRef = withRef && tg.src != nil && s.src != nil
	withUnf := tg.src != nil && s.src != nil
	// A shared expert DST's contract says was requantised runs so
	// requantised on the GPU's unfused path and, beside it as stored, in
	// the reference, as in a CPU run (checkLayerWith).
	var requant weightfmt.Format
	if tg.fused != nil {
		if requant, err = s.requantFormat(); err != nil {
			return nil, err
		}
	}
	var pace *layerPace
	paced := func(r int) moelayer.Pace { return nil }
	if lp != nil {
		readers := [numReaders]bool{readerBank: tg.fused != nil, readerUnfused: withUnf, readerRef: withRef}
		pace = newLayerPace(lp.order, len(tg.src.Experts), readers, paceWindow(lp), lp.release, lp.proofPast)
		paced = func(r int) moelayer.Pace { return pace.reader(r) }
		defer func() {
			for r := range numReaders {
				pace.finish(r)
			}
		}()
	}
	type refOut struct {
		r   *moelayer.RefResult
		err error
		sec float64
	}
	var refCh chan refOut
	if withRef {
		refCh = make(chan refOut, 1)
		go func() {
			t0 := time.Now()
			// In w8a8 mode the reference runs the same numerics as the GPU.
			r, err := s.gpuReference(ctx, tg, x, t, cpuref.RefOptions{Tokens: tokens, Coverage: cov, Workers: s.o.Workers,
				W8A8: s.o.GPUPrecision == PrecisionFP8, Pace: paced(readerRef), RequantShared: requant})
			if pace != nil {
				pace.finish(readerRef)
			}
			refCh <- refOut{r, err, time.Since(t0).Seconds()}
		}()
	}
	// A streamed pass's bank loads beside the unfused path.
	var bankCh chan bankLoad
	if pace != nil && tg.fused != nil {
		bankCh = make(chan bankLoad, 1)
		go func() {
			var ld bankLoad
			ld.err = gpurun.Recording(g.Prefetch, &ld.rec, func() (err error) {
				ld.bank, err = gpurun.LoadFusedBankInOrder(ctx, g.Prefetch, s.dst, tg.fused, lp.order, pace.reader(readerBank))
				return err
			})
			pace.finish(readerBank)
			if ld.err != nil {
				cancel() // the unfused path and the reference stop at their next expert
			}
			bankCh <- ld
		}()
		defer func() {
			if bankCh != nil {
				(<-bankCh).bank.Free()
			}
		}()
	}
	// The stager's I/O during each path: DST's unfused shared expert, SRC's
	// experts and shared expert.
	var dstRec, srcRec gpurun.StageRecord
	gpu := func() (fused *moelayer.FusedResult, unf *moelayer.RefResult, fusedSec, unfSec float64, err error) {
		var fr gpurun.Frees
		defer fr.Release(g)
		in, err := g.Input(xAll, len(xAll)/h, h, &fr)
		if err != nil {
			return nil, nil, 0, 0, err
		}
		in.Tokens = tokens
		runUnfused := func() error {
			t0 := time.Now()
			err := gpurun.Recording(g.Stage, &srcRec, func() (err error) {
				unf, err = g.UnfusedLayer(ctx, s.src, s.srcPlan, tg.src, in, cov, paced(readerUnfused), requant)
				return err
			})
			if pace != nil {
				pace.finish(readerUnfused)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", s.o.Src, err)
			}
			unfSec = time.Since(t0).Seconds()
			return nil
		}
		if bankCh != nil {
			// Streamed: the unfused path first, while the bank fills. Where
			// the bank's upload failed, it cancelled the layer, and its
			// error, not the unfused path's cancellation, is the layer's.
			if withUnf {
				if err := runUnfused(); err != nil && ctx.Err() == nil {
					return nil, nil, 0, 0, err
				}
			}
			t0 := time.Now()
			ld := <-bankCh
			bankCh = nil
			tm.BankWaitSeconds = time.Since(t0).Seconds()
			tm.DstBytes, tm.DstIOSeconds, tm.Staged = ld.rec.Bytes, ld.rec.Busy.Seconds(), ld.rec.Staged
			if ld.err != nil {
				return nil, nil, 0, 0, fmt.Errorf("%s: %w", s.o.Dst, ld.err)
			}
			bank = ld.bank
			fr.AddBank(bank)
		}
		if tg.fused != nil && bank != nil {
			t0 := time.Now()
			err := gpurun.Recording(g.Stage, &dstRec, func() (err error) {
				fused, err = g.FusedLayer(s.dst, tg.fused, bank, in, cov, s.o.BlockSize)
				return err
			})
			if err != nil {
				return nil, nil, 0, 0, fmt.Errorf("%s: %w", s.o.Dst, err)
			}
			fusedSec = time.Since(t0).Seconds()
		}
		if withUnf && unf == nil {
			if err := runUnfused(); err != nil {
				return nil, nil, 0, 0, err
			}
		}
		return
	}
	fused, unf, fusedSec, unfSec, gpuErr := gpu()
	if gpuErr != nil {
		cancel() // before waiting for the reference and the bank below
	}
	var ref *moelayer.RefResult
	var refSec float64
	if refCh != nil {
		ro := <-refCh
		if ro.err != nil && gpuErr == nil {
			return nonFiniteRows(tg, t, fmt.Errorf("%s: %w", s.o.Src, ro.err))
		}
		ref, refSec = ro.r, ro.sec
	}
	if gpuErr != nil {
		return nonFiniteRows(tg, t, gpuErr)
	}
	refNote := "no cpu reference"
	if refCh != nil {
		refNote = fmt.Sprintf("cpu reference %.1fs", refSec)
	}
	s.o.progress("validate: layer %s: %d tokens, gpu fused %.3fs, gpu unfused %.2fs, %s", tg.label(), t, fusedSec, unfSec, refNote)
	tm.DstBytes += dstRec.Bytes
	tm.DstIOSeconds += dstRec.Busy.Seconds()
	tm.SrcBytes, tm.SrcIOSeconds = srcRec.Bytes, srcRec.Busy.Seconds()
	tm.ComputeSeconds = max(0, fusedSec+unfSec-(dstRec.Busy+srcRec.Busy).Seconds())
	tm.ReferenceSeconds = refSec
	tm.Staged = append(append(tm.Staged, dstRec.Staged...), srcRec.Staged...)
	rj := rowJudge{s: s, base: LayerResult{Layer: tg.index, MTP: tg.mtp, Bank: tg.bank.String(), Tokens: t}, numerics: s.gpuNumerics(), t: t, h: h, cov: cov, g: g0}
	if rj.point, err = s.goldenPoint(ctx, tg, g0, x, t, h); err != nil {
		return nil, err
	}
	rows := rj.gpuRows(gpuPaths{fused: fused, unf: unf, ref: ref, fusedSec: fusedSec, unfSec: unfSec, refSec: refSec})
	if len(rows) == 0 {
		return nil, fmt.Errorf("layer %d: nothing to compare on the GPU (give SRC and DST, or a golden)", tg.index)
	}
	return rows, nil
}

// gpuReference is a GPU layer's CPU reference on SRC: the layer as it is,
// or a latent MoE's taken apart as a CPU run takes it (latentStart: the
// bank on SRC's down projection of x, routed on x; the sums through SRC's
// norm and up projection, then SRC's shared experts on x added).
func (s *session) gpuReference(ctx context.Context, tg target, x []float32, t int, o cpuref.RefOptions) (*moelayer.RefResult, error) {
	lr, err := s.latentStart(tg, x, t)
	if err != nil {
		return nil, err
	}
	if lr == nil {
		return cpuref.ReferenceLayer(ctx, s.src, s.srcPlan, tg.src, x, t, o)
	}
	o.RouterInput = x
	r, err := cpuref.ReferenceLayer(ctx, s.src, s.srcPlan, lr.src, lr.xl, t, o)
	if err != nil {
		return nil, err
	}
	if r.Y, err = lr.finish(ctx, r.Y, s.src, s.srcPlan, tg.src, tg.src.Shared, o.Workers); err != nil {
		return nil, err
	}
	return r, nil
}

// gpuPaths is what one GPU layer's paths computed (nil: the path did not
// run) and the seconds each took.
type gpuPaths struct {
	fused                    *moelayer.FusedResult
	unf, ref                 *moelayer.RefResult
	fusedSec, unfSec, refSec float64
}

// gpuRows makes a GPU layer's report rows from what its paths computed
// (none: nothing to compare). Where the reference ran a requantised shared
// expert both ways (RefResult.YRequant), the fused path is judged against
// the requantised output, as a CPU run judges it (checkLayerWith), and
// requantRow reports what requantising added.
func (rj rowJudge) gpuRows(p gpuPaths) []LayerResult {
	if p.ref != nil && p.ref.YRequant != nil {
		rj.requant = judge.RequantStats{WeightErr: p.ref.RequantWeightErr, Share: p.ref.SharedShare}
	}
	var rows []LayerResult
	if p.fused != nil && p.unf != nil {
		// With a requantised shared expert both GPU paths ran it requantised.
		rows = append(rows, rj.fusedVs(judge.GPUFusedVsGPUUnfused, judge.GPUCoverage, p.fusedSec+p.unfSec, p.fused, p.unf.Y, p.unf.Routing)...)
	}
	if p.fused != nil && p.ref != nil {
		want := p.ref.Y
		if p.ref.YRequant != nil { // against the same requantised shared expert
			want = p.ref.YRequant
		}
		rows = append(rows, rj.fusedVs(judge.GPUFusedVsReference, judge.GPUCoverageVsReference, p.fusedSec+p.refSec, p.fused, want, p.ref.Routing)...)
		if p.ref.YRequant != nil {
			// What requantising added, against SRC's own shared expert:
			// measured by the reference, which ran it both ways in the
			// same float64 arithmetic, so the GPU's bf16 rounding is not
			// counted in it (gpu-fused-vs-reference holds the GPU to the
			// requantised reference).
			rows = append(rows, rj.requantRow(p.refSec, p.ref))
		}
	}
	if rj.g != nil {
		switch {
		case p.fused != nil:
			rows = append(rows, rj.fusedVsGolden(judge.GPUFusedVsGolden, p.fusedSec, p.fused))
		case p.unf != nil:
			rows = append(rows, rj.srcVsGolden(judge.GPUUnfusedVsGolden, p.unfSec, p.unf.Y, p.unf.Routing))
		}
		if p.ref != nil {
			// In w8a8 the reference ran in the GPU's numerics, and its rule says so.
			rows = append(rows, rj.srcVsGolden(judge.ReferenceVsGolden, p.refSec, p.ref.Y, p.ref.Routing))
		}
	}
	return rows
}

// requantRow is a GPU layer's requantized-vs-reference row: the error a
// requantised shared expert adds, as the CPU reference measured it (ref's
// YRequant, the shared expert requantised as DST's contract says, against
// its Y, the shared expert as SRC stores it) over the routed tokens, at the
// bound the same measurement derives (rj.requant). Both outputs share one
// routing, so there are no ids to compare (top-k NaN).
func (rj rowJudge) requantRow(sec float64, ref *moelayer.RefResult) LayerResult {
	h, t := rj.h, rj.t
	r := rj.base
	r.Check, r.Seconds = judge.RequantVsReference, sec
	r.Experts, r.ExpertsUsed = rj.s.srcPlan.NumExperts, distinct(ref.Routing.IDs, rj.s.srcPlan.NumExperts)
	judgeRow(&r, judge.Compare(tokenRows(ref.YRequant, h, 0, t), tokenRows(ref.Y, h, 0, t)), rj.tolerance(judge.RequantVsReference), nil, nil, nil, nil, ref.Routing)
	return r
}

// gpuRefusal says why the GPU cannot run this run's expert weights ("" when
// it can): the policy is gpurun's (Refusal, beside the kernels it speaks
// for), asked of SRC's plan and DST's contract at the run's precision.
func (s *session) gpuRefusal() string {
	return gpurun.Refusal(s.srcPlan, s.contract, string(s.o.GPUPrecision))
}
