package validate

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/byteproof"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/gpurun"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/weightfmt"
)

// Defaults of the validate flags.
const (
	DefaultTokens    = 128
	DefaultBlockSize = 64
)

// Options are one validate run. Src and Dst are checkpoint directories; at
// least two sides must be given: Src and Dst, or a Golden directory with
// either or both.
type Options struct {
	Src, Dst string
	Golden   string // directory of moe-layer-L.safetensors (or one holding reference/)
	Layers   string // "all" (default), "1,2,5" or "sample:N"
	Tokens   int    // tokens drawn per layer when there is no golden (0: DefaultTokens)
	Seed     uint64
	// Device is "auto" (default: CUDA when a GPU is usable, else the CPU
	// with a one-line notice), "cpu" or "cuda" (an error without a GPU).
	Device string
	// GPUPrecision is the activation type of the GPU grouped GEMM: "bf16"
	// (default, as serving engines run), "f32" (high precision) or "fp8"
	// (w8a8: e4m3 activations, fp8 weights, Hopper; the CPU reference of a
	// GPU run then quantises the same way).
	GPUPrecision string
	// BlockSize is moe_align_block_size's block (0: DefaultBlockSize); on
	// the GPU it must be a multiple of GPUBlockMultiple.
	BlockSize int
	// CPUCheck is which layers of a GPU run the CPU reference also checks:
	// CPUCheckAuto ("" too: the first and last layer, or all when there
	// are at most 4), CPUCheckNone (GPU only: the run goes at I/O speed) or
	// CPUCheckAll. A CPU run always runs the reference.
	CPUCheck string
	// IOBaseline (GPU runs) times, after the run, how long reading each
	// layer's expert bytes from the page cache and copying them to the GPU
	// takes through the same staging buffers with no compute, and reports
	// each layer's time against it (LayerTiming.Ratio).
	IOBaseline bool
	// SampleExperts (0: all) limits the forced coverage tokens to that many
	// routed experts per layer, drawn from the seed; the report says so and
	// a layer may then pass with experts unexercised.
	SampleExperts int
	// Bytes is the structural proof (CheckBytes) of a SRC+DST run:
	// BytesAuto ("" too) runs it after the layer checks, BytesOnly runs
	// nothing else, BytesOff skips it.
	Bytes    string
	Workers  int              // experts in flight (0: moe.Workers())
	Progress func(msg string) // one line per step, for stderr; nil: quiet
	// ByteProgress (nil: none) receives the bytes the run reads against
	// their planned total, and what it is doing now: the layer and the
	// side being read, or the byte proof. With it, the byte proof's one
	// line per shard stays off Progress: the reporter says more.
	ByteProgress Reporter
	// Notice receives lines the user should see even when quiet (the
	// --device auto fallback); nil: they go to Progress.
	Notice func(msg string)
}

// ErrDeviceUnavailable is wrapped by the error of --device cuda on a
// machine without a usable GPU.
var ErrDeviceUnavailable = gpurun.ErrDeviceUnavailable

// XDraw documents how token vectors are made when no golden provides them.
const XDraw = "x[t,h] ~ N(0,1) from PCG(seed, layer index) (math/rand/v2 NormFloat64), rounded to nearest-even bf16 so bf16 and fp32 engines see the same input"

// DrawX returns the token vectors for one layer: t x h standard normal
// values (unit variance, the scale of a post-RMSNorm hidden state) from a PCG
// stream seeded by (seed, layer), each rounded to the nearest bf16 so that a
// bf16 engine sees exactly the same x. Both paths get the same x.
func DrawX(seed uint64, layer, t, h int) []float32 {
	r := rand.New(rand.NewPCG(seed, uint64(layer)))
	x := make([]float32, t*h)
	for i := range x {
		x[i] = numfmt.RoundBF16(float32(r.NormFloat64()))
	}
	return x
}

// norm fills defaults, checks the options and resolves the device; the
// returned notes (the auto fallback) go into the report.
func (o *Options) norm() ([]string, error) {
	if o.Tokens == 0 {
		o.Tokens = DefaultTokens
	}
	if o.BlockSize == 0 {
		o.BlockSize = DefaultBlockSize
	}
	if err := o.checkRest(); err != nil {
		return nil, err
	}
	if o.Bytes == BytesOnly {
		// The byte proof needs no GPU: no device to look for, no fallback
		// to announce, and --device cuda is no reason to refuse it.
		switch strings.ToLower(strings.TrimSpace(o.Device)) {
		case "", "auto", DeviceCPU, DeviceCUDA, "gpu":
			return nil, nil
		}
		return nil, fmt.Errorf("validate: unknown --device %q (want auto, cpu or cuda)", o.Device)
	}
	return o.selectDevice(cudaAvailable)
}

func (o *Options) checkRest() error {
	switch {
	case o.Tokens < 0 || o.Tokens > 1<<16:
		return fmt.Errorf("validate: --tokens %d (want 1..65536)", o.Tokens)
	case o.BlockSize < 0 || o.BlockSize > 1<<12:
		return fmt.Errorf("validate: --block-size %d (want 1..4096)", o.BlockSize)
	case o.Src == "" && o.Dst == "":
		return errors.New("validate: give SRC and DST, or DST with --golden")
	case o.Golden == "" && (o.Src == "" || o.Dst == ""):
		return errors.New("validate: with one checkpoint, --golden DIR is needed to compare against")
	}
	if o.Layers == "" {
		o.Layers = "all"
	}
	switch o.Bytes {
	case "":
		o.Bytes = BytesAuto
	case BytesAuto, BytesOff:
	case BytesOnly:
		if o.Src == "" || o.Dst == "" {
			return errors.New("validate --bytes: give SRC and DST (the prediction of DST's bytes comes from SRC)")
		}
	default:
		return fmt.Errorf("validate: bytes mode %q (want auto, only or off)", o.Bytes)
	}
	if o.SampleExperts < 0 {
		return fmt.Errorf("validate: --sample-experts %d (want 0 for every expert, or N > 0)", o.SampleExperts)
	}
	switch strings.ToLower(strings.TrimSpace(o.CPUCheck)) {
	case "", CPUCheckAuto:
		o.CPUCheck = CPUCheckAuto
	case CPUCheckNone:
		o.CPUCheck = CPUCheckNone
	case CPUCheckAll:
		o.CPUCheck = CPUCheckAll
	default:
		return fmt.Errorf("validate: --cpu-check %q (want auto, none or all)", o.CPUCheck)
	}
	return nil
}

func (o *Options) progress(format string, args ...any) {
	if o.Progress != nil {
		o.Progress(fmt.Sprintf(format, args...))
	}
}

// target is one layer to check, on whichever sides exist.
type target struct {
	index  int
	mtp    bool
	bank   string // family.Layer.Bank: which of a decoder layer's two routed banks, "" if it has one
	src    *family.Layer
	fused  *cpuref.FusedLayer
	golden string // path, "" if none
}

// session holds the opened inputs of a run.
type session struct {
	o        Options
	src, dst *checkpoint.Checkpoint
	srcPlan  *family.Plan
	dstPlan  *family.Plan
	contract *layout.Contract
	golden   string
	meter    *meter // nil: no byte progress
	// moeLayers are every MoE layer index of the checkpoints, sorted;
	// allLayers each of them on both sides (SRC and DST runs).
	moeLayers []int
	notices   []string // planNotices
	allLayers []target
	// goldenUnchecked are the targets --golden gave no golden tokens to
	// (no golden file, or a bank none of the golden's tokens took), which
	// the layer checks still run against SRC.
	goldenUnchecked []int
	// A streamed pass's tensor reads that no step held, and the shards
	// its byte proof read again in file order (pass.go; tests read them).
	streamMisses int64
	rechecked    int
	reread       int
}

func (s *session) close() {
	if s.src != nil {
		s.src.Close()
	}
	if s.dst != nil {
		s.dst.Close()
	}
}

// Run validates the layers of o and returns the report. An error means the
// input could not be checked (exit 2); a completed run whose checks fail
// returns a report with Failed() true and no error (Report.Err gives the
// exit-1 error).
func Run(ctx context.Context, o Options) (*Report, error) {
	start := time.Now()
	asked := strings.ToLower(strings.TrimSpace(o.Device))
	devNotes, err := o.norm()
	if err != nil {
		return nil, err
	}
	s := &session{o: o, meter: newMeter(o.ByteProgress)}
	defer s.close()
	if err := s.open(); err != nil {
		return nil, err
	}
	devNotes = append(devNotes, s.planNotices()...)
	if o.Device == DeviceCUDA && o.Bytes != BytesOnly {
		if why := s.gpuRefusal(); why != "" {
			if asked != "" && asked != "auto" {
				return nil, fmt.Errorf("validate --device cuda: %s; use --device cpu or auto", why)
			}
			msg := "validate: " + why + "; running on the CPU"
			o.notice(msg)
			devNotes = append(devNotes, strings.TrimPrefix(msg, "validate: ")+" (--device auto)")
			o.Device, s.o.Device = DeviceCPU, DeviceCPU
		}
	}
	if s.srcPlan != nil && s.dstPlan != nil {
		if err := s.sameModel(); err != nil {
			return s.notFromSrc(ctx, err, start)
		}
	}
	if o.Bytes == BytesOnly {
		rep := s.bytesReport()
		s.planBytesOnly()
		if err := s.checkBytes(ctx, rep); err != nil {
			return nil, err
		}
		rep.Seconds = time.Since(start).Seconds()
		return rep, nil
	}
	targets, notes, err := s.targets()
	if err != nil {
		if exitcode.IsCheckFailure(err) && s.srcPlan != nil && s.dstPlan != nil {
			// DST's contract does not fit DST or SRC: the proof names
			// the file and key where it can, as for sameModel
			return s.notFromSrc(ctx, err, start)
		}
		return nil, err
	}
	if err := s.stacksFit(targets); err != nil {
		if s.srcPlan != nil {
			return s.notFromSrc(ctx, err, start)
		}
		return nil, err
	}
	withBytes := o.Bytes == BytesAuto && s.src != nil && s.dst != nil
	mode := ModeLayers
	if withBytes {
		mode = ModeLayersBytes
	}
	rep := &Report{Mode: mode, runSetup: runSetup{Src: o.Src, Dst: o.Dst, Golden: s.golden, Device: o.Device}, Tokens: o.Tokens, Seed: o.Seed,
		BlockSize: o.BlockSize, XDraw: XDraw, Notes: append(devNotes, notes...), LayerSelection: strings.TrimSpace(o.Layers),
		SampleExperts: o.SampleExperts, MoELayers: s.moeLayers}
	rep.LayersChecked, rep.LayersNotChecked = splitLayers(s.moeLayers, targets)
	rep.GoldenNotChecked = s.goldenUnchecked
	if n := s.capJobs(targets); n != "" { // jobs bounded by cores and memory (jobs.go)
		rep.Notes = append(rep.Notes, n)
		o.progress("validate: %s", n)
	}
	if d := s.dequantized(); d != nil {
		tol := judge.Lookup(judge.FusedVsReference).Tolerance(judge.Situation{Dequantised: d.DType})
		rep.Notes = append(rep.Notes, fmt.Sprintf("DST's quantised weights were dequantised to %s (%s): the layer checks allow one rounding of every weight (%s, rel_l2 %.3g); the byte proof holds every dequantised value to the one rounding of SRC's exact dequantisation, bit for bit",
			d.DType, d.Rounding, tol.Name, tol.MaxRelL2))
	}
	defer func() {
		if rep != nil {
			rep.finishCoverage(s.o.SampleExperts)
			rep.ExpertGaps = s.expertGaps(targets, rep)
		}
	}()
	if o.Device == DeviceCUDA {
		rep.CPUCheck = o.CPUCheck
	} else {
		if o.IOBaseline {
			rep.Notes = append(rep.Notes, "no I/O baseline: it times uploads to the GPU, and this run is on the CPU")
		}
		if o.GPUPrecision != PrecisionBF16 {
			// --device auto fell back to the CPU: the precision asked for
			// did not apply, and the report must not read as if it had.
			rep.Notes = append(rep.Notes, fmt.Sprintf("GPU precision %s not applied: it sets the GPU's activations, and this run is on the CPU", o.GPUPrecision))
		}
	}
	if o.Device == DeviceCUDA && s.gpuStreams(targets) {
		if err := s.runGPUStreamed(ctx, targets, rep, withBytes); err != nil {
			return nil, err
		}
		rep.Seconds = time.Since(start).Seconds()
		return rep, nil
	}
	if o.Device != DeviceCUDA && s.src != nil && s.dst != nil {
		if err := s.runStreamed(ctx, targets, rep, withBytes); err != nil {
			return nil, err
		}
		rep.Seconds = time.Since(start).Seconds()
		return rep, nil
	}
	s.planProgress(targets, withBytes)
	if o.Device == DeviceCUDA {
		if err := s.runGPU(ctx, targets, rep); err != nil {
			return nil, err
		}
	} else {
		for i, tg := range targets {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			o.progress("validate: layer %s (%d of %d)", family.LayerLabel(tg.index), i+1, len(targets))
			rows, err := s.checkLayer(ctx, tg)
			if err != nil {
				return nil, err
			}
			rep.Rows = append(rep.Rows, rows...)
		}
	}
	s.meter.finishLayers()
	if n := s.requantNote(rep.Rows); n != "" {
		rep.Notes = append(rep.Notes, n)
	}
	if withBytes {
		if err := s.checkBytes(ctx, rep); err != nil {
			return nil, err
		}
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep, nil
}

// The structural proof's modes (Options.Bytes).
const (
	BytesAuto = "auto" // after the layer checks, when SRC and DST are given
	BytesOnly = "only" // validate --bytes: the structural proof alone
	BytesOff  = "off"  // --skip-bytes
)

// notFromSrc answers a DST whose model differs from SRC's (sameModel's
// err), or whose contract does not fit its layers: the layer checks cannot
// pair its layers with SRC's, but the byte proof can say which file and key
// differ (a forged contract, a changed config), as the failed check it is
// (exit 1). Where the proof is skipped, cannot finish or finds nothing, err
// itself ends the run, as a failed check too: DST is not what SRC and its
// contract say, whatever else could be read.
func (s *session) notFromSrc(ctx context.Context, err error, start time.Time) (*Report, error) {
	if s.o.Bytes == BytesOff {
		return nil, misfit(err)
	}
	rep := s.bytesReport()
	s.planBytesOnly()
	if berr := s.checkBytes(ctx, rep); berr != nil {
		if ctx.Err() != nil {
			return nil, berr // interrupted: exit 130, not a verdict
		}
		return nil, misfit(err)
	}
	if rep.Bytes.Pass {
		return nil, misfit(err)
	}
	if s.o.Bytes != BytesOnly {
		rep.Notes = append(rep.Notes, "layer checks not run: "+err.Error())
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep, nil
}

// misfit marks err, a way DST fails to be what SRC and its contract say,
// as the failed check it is (exit 1), not input validate cannot read
// (exit 2): a CI gate must count such a DST as rejected.
func misfit(err error) error {
	if exitcode.IsCheckFailure(err) {
		return err
	}
	return exitcode.Check(err.Error())
}

// stacksFit checks, before any layer runs, that DST holds the stacks its
// contract names for each target, of the contract's bank size (their
// headers alone): a forged layout or shared replica count would otherwise
// stop the layer checks as if DST could not be read, before the byte proof
// could say what differs.
func (s *session) stacksFit(targets []target) error {
	for _, tg := range targets {
		if tg.fused == nil {
			continue
		}
		if _, _, err := tg.fused.StackDims(s.dst); err != nil {
			return misfit(fmt.Errorf("%s: %w", s.o.Dst, err))
		}
	}
	return nil
}

// bytesReport is the report of a run that is the byte proof alone: no
// device, tokens or block size, which only the layer checks have.
func (s *session) bytesReport() *Report {
	return &Report{Mode: ModeBytes, runSetup: runSetup{Src: s.o.Src, Dst: s.o.Dst, Golden: s.golden, Device: "none"}, Notes: s.notices}
}

// planNotices sends what SRC's and DST's plans noticed (family.Plan.Notices,
// each once: DST's config.json is SRC's) to Notice and keeps them for the
// report's notes.
func (s *session) planNotices() []string {
	for _, p := range []*family.Plan{s.srcPlan, s.dstPlan} {
		if p == nil {
			continue
		}
		for _, n := range p.Notices {
			if !slices.Contains(s.notices, n) {
				s.notices = append(s.notices, n)
				s.o.notice("validate: " + n)
			}
		}
	}
	return s.notices
}

func (s *session) checkBytes(ctx context.Context, rep *Report) error {
	s.meter.startBytes()
	s.o.progress("validate: --bytes: every DST file against SRC, the contract and the manifest, every tensor byte for byte")
	perShard := s.o.Progress
	if s.meter != nil {
		perShard = nil // the byte reporter shows the progress, with a rate and an ETA
	}
	res, err := byteproof.CheckBytes(ctx, s.src, s.dst, s.srcPlan, s.contract, perShard)
	if err != nil {
		return err
	}
	rep.Bytes = res
	return nil
}

func (s *session) open() error {
	var err error
	if s.o.Src != "" {
		if s.src, err = checkpoint.Open(s.o.Src); err != nil {
			return err
		}
		if s.srcPlan, err = s.src.Plan(); err != nil {
			return err
		}
	}
	if s.o.Dst != "" {
		if s.dst, err = checkpoint.Open(s.o.Dst); err != nil {
			return err
		}
		c, ok, err := layout.ReadContract(s.dst.Config)
		if err != nil {
			err = fmt.Errorf("%s: %w", filepath.Join(s.o.Dst, checkpoint.ConfigFileName), err)
			if bad := (*layout.InvalidContractError)(nil); errors.As(err, &bad) {
				// it decodes and contradicts itself or its format: DST
				// is wrong, not unreadable
				return misfit(err)
			}
			return err
		}
		if !ok {
			return fmt.Errorf("%s: config.json has no %q contract: not moeprep convert/fuse-shared output", s.o.Dst, layout.ContractKey)
		}
		s.contract = c
		if s.dstPlan, err = family.PlanConverted(s.dst.Config, s.dst); err != nil {
			return fmt.Errorf("%s: %w", s.o.Dst, err)
		}
	}
	if s.o.Golden != "" {
		s.golden = s.o.Golden
		if st, err := os.Stat(s.golden); err != nil || !st.IsDir() {
			return fmt.Errorf("%s: not a golden directory", s.golden)
		}
		// A fixture directory keeps its goldens under reference/.
		if m, _ := filepath.Glob(filepath.Join(s.golden, "moe-layer-*.safetensors")); len(m) == 0 {
			if m, _ := filepath.Glob(filepath.Join(s.golden, "reference", "moe-layer-*.safetensors")); len(m) > 0 {
				s.golden = filepath.Join(s.golden, "reference")
			} else {
				return fmt.Errorf("%s: no moe-layer-L.safetensors goldens", s.golden)
			}
		}
	}
	return nil
}

// sameModel checks that DST was converted from SRC: same routing and sizes.
func (s *session) sameModel() error {
	a, b := s.srcPlan.RouteSpec(), s.dstPlan.RouteSpec()
	if a != b {
		return fmt.Errorf("%s: routing differs from SRC %s's (%s): DST was not converted from SRC", s.o.Dst, s.o.Src, fieldDiff(b, a))
	}
	if s.srcPlan.HiddenSize != s.dstPlan.HiddenSize || s.srcPlan.MoEIntermediateSize != s.dstPlan.MoEIntermediateSize {
		return fmt.Errorf("%s: H %d I %d, SRC has H %d I %d", s.o.Dst, s.dstPlan.HiddenSize, s.dstPlan.MoEIntermediateSize, s.srcPlan.HiddenSize, s.srcPlan.MoEIntermediateSize)
	}
	if s.contract.NumExperts != s.srcPlan.NumExperts || s.contract.RoutedScalingFactor != s.srcPlan.RoutedScalingFactor {
		return fmt.Errorf("%s: contract has %d experts, rsf %v; SRC has %d, rsf %v", s.o.Dst, s.contract.NumExperts, s.contract.RoutedScalingFactor, s.srcPlan.NumExperts, s.srcPlan.RoutedScalingFactor)
	}
	if s.contract.ExpertBias != s.srcPlan.ExpertBias || s.contract.Act() != s.srcPlan.Act {
		return fmt.Errorf("%s: contract has expert_bias %v, activation %s; SRC's family (%s) has %v, %s", s.o.Dst, s.contract.ExpertBias, jsonText(s.contract.Act()), s.srcPlan.ModelType, s.srcPlan.ExpertBias, jsonText(s.srcPlan.Act))
	}
	if err := s.checkLayerActs(); err != nil {
		return err
	}
	if s.contract.ZeroExperts != s.srcPlan.ZeroExperts {
		return fmt.Errorf("%s: contract has zero_experts %d, SRC's config gives %d", s.o.Dst, s.contract.ZeroExperts, s.srcPlan.ZeroExperts)
	}
	if s.contract.RoutedInputScaled != s.srcPlan.RoutedInputScaled {
		return fmt.Errorf("%s: contract has routed_input_scaled %v, SRC's family (%s) %v", s.o.Dst, s.contract.RoutedInputScaled, s.srcPlan.ModelType, s.srcPlan.RoutedInputScaled)
	}
	if s.contract.Output() != s.srcPlan.Output() {
		return fmt.Errorf("%s: contract has output_scale %v, SRC's config gives %v", s.o.Dst, s.contract.Output(), s.srcPlan.Output())
	}
	return nil
}

// targets lists the layers to check, per the --layers spec.
func (s *session) targets() ([]target, []string, error) {
	byIndex := map[int]*target{}
	var order []int
	get := func(i int, mtp bool) *target {
		if t, ok := byIndex[i]; ok {
			return t
		}
		t := &target{index: i, mtp: mtp}
		byIndex[i] = t
		order = append(order, i)
		return t
	}
	if s.srcPlan != nil {
		for i := range s.srcPlan.Layers {
			l := &s.srcPlan.Layers[i]
			t := get(l.Index, l.MTP)
			t.src, t.bank = l, l.Bank
		}
	}
	if s.dstPlan != nil {
		info := map[int]layout.LayerInfo{}
		for _, li := range s.contract.Layers {
			info[li.Index] = li
		}
		for i := range s.dstPlan.Layers {
			l := &s.dstPlan.Layers[i]
			li, ok := info[l.Index]
			if !ok {
				return nil, nil, misfit(fmt.Errorf("%s: MoE layer %d is not in the moeprep contract", s.o.Dst, l.Index))
			}
			if li.Prefix != l.Prefix {
				return nil, nil, misfit(fmt.Errorf("%s: layer %d: contract prefix %q, checkpoint has %q", s.o.Dst, l.Index, li.Prefix, l.Prefix))
			}
			t := get(l.Index, l.MTP)
			t.bank = l.Bank
			t.fused = &cpuref.FusedLayer{Index: l.Index, Router: l.Router, RouterBias: l.RouterBias, RouterLogitBias: l.RouterLogitBias, HashTable: l.HashTable,
				Spec: s.dstPlan.RouteSpec(), Contract: s.contract, Names: s.contract.Names(li), Shared: l.Shared, SharedGate: l.SharedGate,
				SharedExperts: l.SharedExperts, RouterScale: l.RouterScale, ExpertScale: l.ExpertScale, Prep: cpuref.PrepOf(s.dstPlan, l), Info: li}
			if b, ok := s.contract.Biases(li); ok {
				t.fused.Biases = &b
			}
		}
		if len(s.contract.Layers) != len(s.dstPlan.Layers) {
			return nil, nil, misfit(fmt.Errorf("%s: the contract lists %d MoE layers, the checkpoint has %d", s.o.Dst, len(s.contract.Layers), len(s.dstPlan.Layers)))
		}
	}
	sortLayers(order)
	s.moeLayers = order
	if s.src != nil && s.dst != nil {
		for _, i := range order {
			if t := byIndex[i]; t.src == nil || t.fused == nil {
				return nil, nil, misfit(fmt.Errorf("layer %d is a MoE layer of only one of %s and %s", i, s.o.Src, s.o.Dst))
			}
			s.allLayers = append(s.allLayers, *byIndex[i])
		}
	}
	chosen, explicit, err := selectLayers(s.o.Layers, order)
	if err != nil {
		return nil, nil, err
	}
	var out []target
	var notes []string
	took := map[string]*Golden{} // a two-bank layer's golden, read once for both banks
	for _, i := range chosen {
		t := byIndex[i]
		if s.golden != "" {
			d := family.DecoderLayer(i)
			if p, ok := goldenPath(s.golden, d); ok {
				t.golden = p
				if t.bank != "" {
					g, ok := took[p]
					if !ok {
						if g, err = ReadGolden(p, s.dstPlanOrSrc().HiddenSize); err != nil {
							return nil, nil, err
						}
						took[p] = g
					}
					if !g.TookBank(t.bank) {
						// A text prompt's golden leaves the vision bank
						// (and an image's the text bank) to the rest of
						// the run: with SRC, its drawn and forced tokens.
						t.golden = ""
						label := fmt.Sprintf("layer %d (%s bank)", d, t.bank)
						if s.src == nil || s.dst == nil {
							notes = append(notes, fmt.Sprintf("%s not checked: no token of its golden %s took it (token_type_ids; a golden without them is text throughout), and without SRC and DST nothing else checks it", label, p))
							continue
						}
						notes = append(notes, fmt.Sprintf("%s not checked against the golden: no token of %s took it (token_type_ids; a golden without them is text throughout); its drawn and forced tokens checked it against SRC", label, p))
						s.goldenUnchecked = append(s.goldenUnchecked, i)
					}
				}
			} else if explicit {
				return nil, nil, fmt.Errorf("%s: no golden for layer %s", filepath.Join(s.golden, GoldenFileName(d)), family.LayerLabel(i))
			} else {
				notes = append(notes, fmt.Sprintf("layer %s has no golden in %s", family.LayerLabel(i), s.golden))
				if s.src == nil || s.dst == nil {
					continue
				}
				s.goldenUnchecked = append(s.goldenUnchecked, i)
			}
		}
		out = append(out, *t)
	}
	if len(out) == 0 {
		return nil, nil, fmt.Errorf("no layer to check (--layers %s)", s.o.Layers)
	}
	return out, notes, nil
}

// selectLayers applies a --layers spec to the sorted MoE layer indices;
// explicit is true for a list (every listed layer must exist).
func selectLayers(spec string, all []int) ([]int, bool, error) {
	spec = strings.TrimSpace(spec)
	switch {
	case spec == "all":
		return all, false, nil
	case strings.HasPrefix(spec, "sample:"):
		n, err := strconv.Atoi(strings.TrimPrefix(spec, "sample:"))
		if err != nil || n <= 0 {
			return nil, false, fmt.Errorf("--layers %q: want sample:N with N > 0", spec)
		}
		// N decoder layers: a layer of two routed banks (ERNIE-4.5-VL)
		// is sampled whole.
		decoders := slices.DeleteFunc(slices.Clone(all), func(i int) bool { return family.BankOf(i) != "" })
		if n >= len(decoders) {
			return all, false, nil
		}
		// Evenly spaced, first and last included, so a sample always covers
		// both ends of the stack (and an MTP layer when there is one).
		var out []int
		for i := range n {
			j := 0
			if n > 1 {
				j = int(math.Round(float64(i) * float64(len(decoders)-1) / float64(n-1)))
			}
			out = append(out, decoders[j])
		}
		out = slices.Compact(out)
		for _, i := range all {
			if family.BankOf(i) != "" && slices.Contains(out, family.DecoderLayer(i)) {
				out = append(out, i)
			}
		}
		sortLayers(out)
		return out, false, nil
	}
	var out []int
	for _, f := range strings.Split(spec, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 0 {
			return nil, false, fmt.Errorf("--layers %q: want all, sample:N or a comma-separated list of layer indices", spec)
		}
		// A decoder layer of two routed banks (ERNIE-4.5-VL) is both.
		found := false
		for _, i := range all {
			if family.DecoderLayer(i) == v {
				found = true
				if !slices.Contains(out, i) {
					out = append(out, i)
				}
			}
		}
		if !found {
			return nil, false, fmt.Errorf("--layers: layer %d is not a MoE layer (MoE layers: %s)", v, layerList(all))
		}
	}
	sortLayers(out)
	return out, true, nil
}

// sortLayers orders MoE layer indices by decoder layer, so that the two
// routed banks of one (ERNIE-4.5-VL: L and L+family.BankStride) are
// checked one after the other and a streamed pass holds what they share
// (the shared MLP, the correction bias) for both; otherwise by index.
func sortLayers(v []int) {
	slices.SortFunc(v, func(a, b int) int {
		return cmp.Or(cmp.Compare(family.DecoderLayer(a), family.DecoderLayer(b)), cmp.Compare(a, b))
	})
}

// layerList lists MoE layer indices as --layers takes them: a second
// routed bank is its decoder layer's, listed once.
func layerList(v []int) string {
	var s []int
	for _, x := range v {
		if family.BankOf(x) == "" {
			s = append(s, x)
		}
	}
	return intList(s)
}

func intList(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// checkLayer runs the available paths on one layer and compares them.
func (s *session) checkLayer(ctx context.Context, tg target) ([]LayerResult, error) {
	return s.checkLayerWith(ctx, tg, nil)
}

// checkLayerWith is checkLayer, telling release (when set) of each bank
// expert whose weights the paths are done with.
func (s *session) checkLayerWith(ctx context.Context, tg target, release func(bank int)) ([]LayerResult, error) {
	x, t, h, g, tokens, cov, err := s.layerStart(tg)
	if err != nil {
		return nil, err
	}
	var ref *cpuref.RefResult
	var fused *cpuref.FusedResult
	var refSec, fusedSec float64
	both := tg.src != nil && s.src != nil && tg.fused != nil && s.dst != nil
	if both {
		// One pass over the bank runs both paths, each expert's weights
		// read and decoded once while both need them.
		start := time.Now()
		po := cpuref.PairOptions{Tokens: tokens, Coverage: cov, BlockSize: s.o.BlockSize, Workers: s.o.Workers, Release: release}
		var err error
		if po.RequantShared, err = s.requantFormat(); err != nil {
			return nil, err
		}
		if ref, fused, err = cpuref.PairLayer(ctx, s.src, s.srcPlan, tg.src, s.dst, tg.fused, x, t, po); err != nil {
			side := s.o.Src
			if se := (*cpuref.SideError)(nil); errors.As(err, &se) {
				if se.DST {
					side = s.o.Dst
				}
				err = se.Err
			}
			return nonFiniteRows(tg, t, fmt.Errorf("%s: %w", side, err))
		}
		refSec = time.Since(start).Seconds()
		fusedSec = refSec
		s.o.progress("validate: layer %s: %d tokens, reference and fused %.1fs", family.LayerLabel(tg.index), t, refSec)
	}
	if !both && tg.src != nil && s.src != nil {
		start := time.Now()
		var err error
		ro := cpuref.RefOptions{Tokens: tokens, Coverage: cov, Workers: s.o.Workers}
		if tg.fused != nil {
			if ro.RequantShared, err = s.requantFormat(); err != nil {
				return nil, err
			}
		}
		if ref, err = cpuref.ReferenceLayer(ctx, s.src, s.srcPlan, tg.src, x, t, ro); err != nil {
			return nonFiniteRows(tg, t, fmt.Errorf("%s: %w", s.o.Src, err))
		}
		refSec = time.Since(start).Seconds()
	}
	if !both && tg.fused != nil && s.dst != nil {
		start := time.Now()
		var err error
		if fused, err = cpuref.FusedLayerRun(ctx, s.dst, tg.fused, x, t, cpuref.FusedOptions{Tokens: tokens, Coverage: cov, BlockSize: s.o.BlockSize, Workers: s.o.Workers}); err != nil {
			return nonFiniteRows(tg, t, fmt.Errorf("%s: %w", s.o.Dst, err))
		}
		fusedSec = time.Since(start).Seconds()
	}
	if !both {
		s.o.progress("validate: layer %s: %d tokens, reference %.1fs, fused %.1fs", family.LayerLabel(tg.index), t, refSec, fusedSec)
	}
	rj := rowJudge{s: s, base: LayerResult{Layer: tg.index, MTP: tg.mtp, Bank: tg.bank, Tokens: t}, numerics: judge.CPU, t: t, h: h, cov: cov, g: g}
	if ref != nil && ref.YRequant != nil {
		rj.requant = judge.RequantStats{WeightErr: ref.RequantWeightErr, Share: ref.SharedShare}
	}
	var rows []LayerResult
	if ref != nil && fused != nil {
		sec := refSec + fusedSec
		if both {
			sec = refSec // the paths ran side by side
		}
		want := ref.Y
		if ref.YRequant != nil { // exact against the same requantised shared expert
			want = ref.YRequant
		}
		rows = append(rows, rj.fusedVs(judge.FusedVsReference, judge.Coverage, sec, fused, want, ref.Routing)...)
		if ref.YRequant != nil { // and what requantising added, against SRC's own
			rows = append(rows, rj.fusedRow(judge.RequantVsReference, sec, fused, ref.Y, ref.Routing))
		}
	}
	if g != nil {
		if fused != nil {
			rows = append(rows, rj.fusedVsGolden(judge.FusedVsGolden, fusedSec, fused))
		}
		if ref != nil {
			rows = append(rows, rj.srcVsGolden(judge.ReferenceVsGolden, refSec, ref.Y, ref.Routing))
		}
	}
	return rows, nil
}

// rowJudge makes one layer's report rows: each judged in numerics against
// the check's tolerance, over the layer's t routed tokens of width h (and
// the forced coverage tokens cov, nil without) or the golden g.
type rowJudge struct {
	s        *session
	base     LayerResult
	numerics judge.Numerics
	t, h     int
	cov      *cpuref.Coverage
	g        *Golden
	// requant is what the reference measured of a requantised shared
	// expert (zero: nothing measured).
	requant judge.RequantStats
}

// tolerance is the threshold of check for this layer's rows.
func (rj rowJudge) tolerance(check string) judge.Tolerance {
	return rj.s.tolerance(check, rj.numerics, rj.requant)
}

// fusedVs compares the fused path with another path's output y and routing
// rt (the reference, or the GPU's unfused path): the check's row, and the
// cover check's for the coverage tokens; sec is the two paths' time.
func (rj rowJudge) fusedVs(check, cover string, sec float64, fused *cpuref.FusedResult, y []float32, rt *moe.Routing) []LayerResult {
	rows := []LayerResult{rj.fusedRow(check, sec, fused, y, rt)}
	if rj.cov != nil {
		r := rj.s.coverageRow(rj.base, cover, fused, y, rj.cov, rj.h, rj.tolerance(cover))
		r.Seconds = sec
		rows = append(rows, r)
	}
	return rows
}

// fusedRow is fusedVs's row of the routed tokens alone.
func (rj rowJudge) fusedRow(check string, sec float64, fused *cpuref.FusedResult, y []float32, rt *moe.Routing) LayerResult {
	h, t := rj.h, rj.t
	r := rj.base
	r.Check, r.Seconds = check, sec
	fusedUsage(&r, fused, rj.s.contract)
	judgeRow(&r, judge.Compare(tokenRows(fused.Y, h, 0, t), tokenRows(y, h, 0, t)), rj.tolerance(check),
		fused.Routing.IDs, fused.Routing.Weights, rt.IDs, rt.Weights, rt)
	return r
}

// fusedVsGolden compares the fused path (on DST) with the golden.
func (rj rowJudge) fusedVsGolden(check string, sec float64, fused *cpuref.FusedResult) LayerResult {
	r := rj.base
	r.Check, r.Seconds = check, sec
	fusedUsage(&r, fused, rj.s.contract)
	judgeGolden(&r, tokenRows(fused.Y, rj.h, 0, rj.t), fused.Routing, rj.s.contract.RoutedScalingFactor, rj.g, rj.tolerance(check))
	return r
}

// srcVsGolden compares a path on SRC (output y, routing rt) with the golden.
func (rj rowJudge) srcVsGolden(check string, sec float64, y []float32, rt *moe.Routing) LayerResult {
	s := rj.s
	r := rj.base
	r.Check, r.Seconds = check, sec
	r.Experts, r.ExpertsUsed = s.srcPlan.NumExperts, distinct(rt.IDs, s.srcPlan.NumExperts)
	judgeGolden(&r, tokenRows(y, rj.h, 0, rj.t), rt, s.srcPlan.RouteSpec().RoutedScalingFactor, rj.g, rj.tolerance(check))
	return r
}

// layerStart is how both loops start a layer: its tokens x [T,H] (the
// golden's, or drawn), h = H, the golden if any, a hash-routed layer's
// token ids and the forced coverage tokens (nil without).
func (s *session) layerStart(tg target) (x []float32, t, h int, g *Golden, tokens []int32, cov *cpuref.Coverage, err error) {
	if x, t, g, err = s.layerInput(tg); err != nil {
		return nil, 0, 0, nil, nil, nil, err
	}
	if tokens, err = s.layerTokens(tg, t, g); err != nil {
		return nil, 0, 0, nil, nil, nil, err
	}
	h = len(x) / t
	if cov, err = s.coverageFor(tg, h); err != nil {
		return nil, 0, 0, nil, nil, nil, err
	}
	return x, t, h, g, tokens, cov, nil
}

// layerInput returns a layer's tokens x [T,H]: the golden's, or drawn.
func (s *session) layerInput(tg target) (x []float32, t int, g *Golden, err error) {
	// Both the CPU and the GPU loop start each layer here, in run order:
	// the byte progress learns which layer is being checked.
	s.meter.startLayer(tg.index)
	h := s.dstPlanOrSrc().HiddenSize
	if tg.golden != "" {
		if g, err = ReadGolden(tg.golden, h); err != nil {
			return nil, 0, nil, err
		}
		if tg.bank != "" {
			if g, err = g.ForBank(tg.bank, family.LayerLabel(tg.index)); err != nil {
				return nil, 0, nil, err
			}
		}
		return g.X, g.T, g, nil
	}
	return DrawX(s.o.Seed, tg.index, s.o.Tokens, h), s.o.Tokens, nil, nil
}

// layerTokens returns the token ids of a hash-routed layer's inputs (nil
// for a routed layer): the golden's input_ids, or drawn over the table's
// vocabulary. SRC and DST must agree on which layers are hash-routed.
func (s *session) layerTokens(tg target, t int, g *Golden) ([]int32, error) {
	var table string
	var src cpuref.TensorSource
	if tg.src != nil && tg.src.HashTable != "" {
		table, src = tg.src.HashTable, s.src
	}
	if tg.fused != nil && tg.fused.HashTable != "" {
		table, src = tg.fused.HashTable, s.dst
	}
	if tg.src != nil && tg.fused != nil && (tg.src.HashTable == "") != (tg.fused.HashTable == "") {
		return nil, fmt.Errorf("layer %d: hash-routed in only one of %s and %s", tg.index, s.o.Src, s.o.Dst)
	}
	if table == "" {
		return nil, nil
	}
	if g != nil {
		if g.InputIDs == nil {
			return nil, fmt.Errorf("%s: layer %d routes by token id (%s) and the golden has no input_ids", g.Path, tg.index, table)
		}
		// Ids past the table are the golden's fault (another model's
		// vocabulary), not the table's: checked here, against the table
		// of the model the golden is the reference for (SRC's where
		// given), before a path looks them up and names the checkpoint.
		if tg.src != nil && tg.src.HashTable != "" {
			table, src = tg.src.HashTable, s.src
		}
		vocab, err := cpuref.HashVocab(src, table, s.dstPlanOrSrc().TopK)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", tg.index, err)
		}
		for i, id := range g.InputIDs {
			if int(id) >= vocab {
				return nil, fmt.Errorf("%s: tensor input_ids: token %d has id %d, past the %d rows of layer %s's hash routing table %s: a golden of another vocabulary",
					g.Path, i, id, vocab, family.LayerLabel(tg.index), table)
			}
		}
		return g.InputIDs, nil
	}
	vocab, err := cpuref.HashVocab(src, table, s.dstPlanOrSrc().TopK)
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", tg.index, err)
	}
	return cpuref.DrawTokens(s.o.Seed, tg.index, t, vocab), nil
}

func (s *session) dstPlanOrSrc() *family.Plan {
	if s.srcPlan != nil {
		return s.srcPlan
	}
	return s.dstPlan
}

// dequantized is the contract's record of a dequantised DST, nil when
// DST is not one.
func (s *session) dequantized() *layout.Dequantized {
	if s.contract == nil {
		return nil
	}
	return s.contract.Dequantized
}

// tolerance is the threshold of the check named check when its paths
// computed in numerics: its row in judge.Checks picks it, given whether the
// contract folded rsf into values it rounded coarser than float32: plain
// weights, or the BF16/F16 scales of FP8 per channel or per tensor (FP8
// block folding touches only the F32 scales and leaves the weights
// identical; a BF16 scale rounds like a bf16 weight, 2^-9 relative, so
// the output moves no more than a folded bf16 weight moves it).
func (s *session) tolerance(check string, numerics judge.Numerics, requant judge.RequantStats) judge.Tolerance {
	c := s.contract
	roundedScales := c != nil && c.ScaleDType != "" && c.ScaleDType != "F32"
	roundedFold := c != nil && c.RoutedScalingFactorFolded && (!c.Quantized() || roundedScales)
	sit := judge.Situation{Numerics: numerics, RoundedFold: roundedFold}
	if d := s.dequantized(); d != nil {
		sit.Dequantised = d.DType
	}
	if c != nil && c.SharedRequantized != nil {
		sit.Requant, sit.RequantStats = c.SharedRequantized.Quantization, requant
	}
	return judge.Lookup(check).Tolerance(sit)
}

// requantNote says, for a DST whose shared expert was requantised, what
// that did to the checked layers' outputs (the requantized-vs-reference
// rows, each judged at its own bound), so that a run that passes does not
// pass in silence; "" for any other DST.
func (s *session) requantNote(rows []LayerResult) string {
	if s.contract == nil || s.contract.SharedRequantized == nil {
		return ""
	}
	r := s.contract.SharedRequantized
	lo, hi, maxAbs, minCos, n := math.Inf(1), 0.0, 0.0, 1.0, 0
	for _, row := range rows {
		if row.Check != judge.RequantVsReference || math.IsNaN(row.RelL2) {
			continue
		}
		lo, hi, maxAbs, minCos, n = min(lo, row.RelL2), max(hi, row.RelL2), max(maxAbs, row.MaxAbs), min(minCos, row.Cosine), n+1
	}
	what := fmt.Sprintf("DST's shared expert is SRC's %s one requantised to %s (%s: scale = amax / %g, codes in [%g, %g], %s)",
		r.SourceDType, r.Quantization, r.Rule, r.ScaleDivisor, r.CodeRange[0], r.CodeRange[1], r.Rounding)
	gpu := s.o.Device == DeviceCUDA
	if n == 0 {
		if gpu && s.src != nil && s.o.CPUCheck == CPUCheckNone {
			return what + "; no layer measured the error it adds (no CPU reference ran: --cpu-check none)"
		}
		return what + "; no layer measured the error it adds (no SRC reference ran)"
	}
	exact := fmt.Sprintf("%s is exact against the same requantisation", judge.FusedVsReference)
	if gpu {
		// The GPU's unfused path and the reference run the shared expert
		// requantised too, so the GPU's checks compare like with like.
		exact = fmt.Sprintf("%s and %s compare against the same requantisation, at the GPU's tolerance", judge.GPUFusedVsGPUUnfused, judge.GPUFusedVsReference)
	}
	return fmt.Sprintf("%s: against SRC's %s shared expert it moves the layer output by rel_l2 %.3g..%.3g, max_abs up to %.3g, cos down to %.6f over %d layers (%s rows, each within 2 x the shared weights' relative error x the shared expert's share of the output); %s",
		what, r.SourceDType, lo, hi, maxAbs, minCos, n, judge.RequantVsReference, exact)
}

// requantFormat is the format DST's contract says its fused shared expert
// was requantised into (nil: it was not).
func (s *session) requantFormat() (weightfmt.Format, error) {
	if s.contract == nil || s.contract.SharedRequantized == nil {
		return nil, nil
	}
	f, err := s.contract.Format()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.o.Dst, err)
	}
	return f, nil
}

// fusedUsage counts the bank experts the routed tokens chose (the forced
// coverage tokens, if any, have rows of their own).
func fusedUsage(r *LayerResult, f *cpuref.FusedResult, c *layout.Contract) {
	r.Experts = c.BankSize()
	r.ExpertsUsed = distinct(f.Slots.IDs[:f.Routing.T*f.Slots.K], r.Experts)
}

// distinct counts the experts below n that ids name (ids past them are
// LongCat-Flash's zero-compute experts, which are no expert of the bank).
func distinct(ids []int32, n int) int {
	seen := map[int32]bool{}
	for _, id := range ids {
		if int(id) < n {
			seen[id] = true
		}
	}
	return len(seen)
}

// judgeRow fills a row's numbers and verdict: the output within tol, and
// the routing (ids tie-robustly against want's scores, weights on shared
// ids) equal. Weights are compared on the same scale (both with or both
// without rsf).
func judgeRow(r *LayerResult, d judge.Diff, tol judge.Tolerance, gotIDs []int32, gotW []float32, wantIDs []int32, wantW []float32, scores *moe.Routing) {
	r.Diff, r.Tolerance = d, tol
	r.TopK = math.NaN()
	reason := tol.Verdict(d)
	if wantIDs != nil {
		var routing string
		r.TopK, r.TopKWeightMaxErr, routing = judge.RoutingAgreement(gotIDs, gotW, wantIDs, wantW, scores)
		if routing != "" {
			reason = join(reason, routing)
		}
	}
	r.Reason = reason
	r.Pass = reason == ""
}

func join(a, b string) string { return judge.Join(a, b) }

// judgeGolden compares a path's output and routing with an HF golden. The
// golden weights include rsf, so the path's are scaled by it first; ids are
// compared tie-robustly against the path's own scores.
func judgeGolden(r *LayerResult, y []float32, rt *moe.Routing, rsf float64, g *Golden, tol judge.Tolerance) {
	d := judge.Compare(y, g.Y)
	if g.IDs == nil {
		judgeRow(r, d, tol, nil, nil, nil, nil, rt)
		return
	}
	if g.K != rt.K {
		judgeRow(r, d, tol, nil, nil, nil, nil, rt)
		r.Reason = join(r.Reason, fmt.Sprintf("golden has top-%d, the config top-%d", g.K, rt.K))
		r.Pass = false
		return
	}
	w := make([]float32, len(rt.Weights))
	for i, v := range rt.Weights {
		w[i] = v * float32(rsf)
	}
	judgeRow(r, d, tol, rt.IDs, w, g.IDs, g.Weights, rt)
}

// fieldDiff names the fields in which two values of one struct type differ,
// "scoring sigmoid (SRC softmax), top_k 4 (SRC 2)", for an error a person
// reads (a %+v dump of the whole struct hides the one field that matters).
func fieldDiff(dst, src any) string {
	dv, sv := reflect.ValueOf(dst), reflect.ValueOf(src)
	if dv.Kind() != reflect.Struct || dv.Type() != sv.Type() {
		return fmt.Sprintf("%v (SRC %v)", dst, src)
	}
	var out []string
	for i := range dv.NumField() {
		a, b := dv.Field(i), sv.Field(i)
		if !dv.Type().Field(i).IsExported() || reflect.DeepEqual(a.Interface(), b.Interface()) {
			continue
		}
		out = append(out, fmt.Sprintf("%s %v (SRC %v)", snakeCase(dv.Type().Field(i).Name), a.Interface(), b.Interface()))
	}
	return strings.Join(out, ", ")
}

// snakeCase turns a Go field name into the words of a config key:
// NumExperts -> num_experts, TopKGroup -> top_k_group.
func snakeCase(name string) string {
	var b strings.Builder
	for i, r := range name {
		if unicode.IsUpper(r) {
			if i > 0 && (!unicode.IsUpper(rune(name[i-1])) || i+1 < len(name) && unicode.IsLower(rune(name[i+1]))) {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// jsonText is v as compact JSON, for values with no better words.
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// gpuRefusal says why the GPU kernels cannot run SRC's or DST's expert
// weights ("" when they can): the kernels take unquantised weights and FP8
// 128x128 blocks with F32 scales as stored, and FP8 per channel or per
// tensor, pack-quantized INT4, MXFP4 and NVFP4 decoded to bf16 on the
// device (gpurun.DecodesOnDevice), which only the bf16 precision compares
// (the decode rounds every weight to bf16 once, which the gpu-f32
// tolerance would rightly fail and the w8a8 mode does not model). No
// format may run as if it were one they take.
func (s *session) gpuRefusal() string {
	var fs []weightfmt.Format
	if s.srcPlan != nil {
		f, err := s.srcPlan.Format()
		if err != nil {
			return err.Error()
		}
		fs = append(fs, f)
	}
	if s.contract != nil {
		f, err := s.contract.Format()
		if err != nil {
			return err.Error()
		}
		fs = append(fs, f)
	}
	for _, f := range fs {
		if s.contract != nil && s.contract.Oriented() == layout.InOut && gpurun.DecodesOnDevice(f) {
			// In-out stacks are transposed on the host as they upload;
			// the device decode takes out-in rows.
			return fmt.Sprintf("the stacks are in-out ([E,H,I]: orientation in-out) and %s expert weights (quantization %s) are decoded on the GPU, which decodes out-in stacks only", f, f.Quantization())
		}
		if gpurun.DecodesOnDevice(f) && s.o.GPUPrecision != PrecisionBF16 {
			sc, _ := f.Scale()
			return fmt.Sprintf("%s expert weights (quantization %s, %s scales) are decoded to bf16 on the GPU, which runs them with --precision bf16 only (not %s)",
				f, f.Quantization(), sc.DType, s.o.GPUPrecision)
		}
		if gpurun.KernelsTake(f) {
			continue
		}
		sc, _ := f.Scale()
		return fmt.Sprintf("%s expert weights (quantization %s, %s scales) have no GPU path: the GPU runs unquantised weights, FP8 128x128 blocks with F32 scales, and FP8 per-channel or per-tensor, INT4, MXFP4 and NVFP4 weights (decoded to bf16)",
			f, f.Quantization(), sc.DType)
	}
	// A shared expert stored unlike the routed experts loads with its own
	// format (gpurun: a plain one as the plain MLP it is, DeepSeek-V4's FP8
	// blocks beside FP4 through the FP8 kernels): it must be one the
	// kernels take, at this precision.
	if sq := s.sharedQuantization(); sq != "" && sq != string(family.QuantNone) {
		if why := s.sharedGPURefusal(sq); why != "" {
			return why
		}
	}
	// A shared expert DST's contract says was requantised
	// (shared_requantized) is in the routed experts' format, held to the
	// kernels and the precision above: the fused bank holds its replicas,
	// the GPU's unfused path runs SRC's shared expert requantised the same
	// way (gpurun.RequantisedShared) and the CPU reference runs it both
	// ways on the layers it checks (checkLayerGPU).
	return ""
}

// sharedGPURefusal says why the GPU cannot run a shared expert stored as
// sq beside the routed experts ("" when it can).
func (s *session) sharedGPURefusal(sq string) string {
	var fs []weightfmt.Format
	if s.srcPlan != nil && s.srcPlan.SharedQuantization != "" {
		f, err := s.srcPlan.SharedFormat()
		if err != nil {
			return err.Error()
		}
		fs = append(fs, f)
	}
	if s.contract != nil && s.contract.SharedQuantization != "" {
		f, err := s.contract.SharedFormat()
		if err != nil {
			return err.Error()
		}
		fs = append(fs, f)
	}
	for _, f := range fs {
		sc, _ := f.Scale()
		switch {
		case !gpurun.KernelsTake(f):
			return fmt.Sprintf("the shared expert is stored as %s (%s scales) beside %s routed experts, which the GPU kernels do not take", sq, sc.DType, s.routedQuantization())
		case gpurun.DecodesOnDevice(f) && s.o.GPUPrecision != PrecisionBF16:
			return fmt.Sprintf("the shared expert (%s) is decoded to bf16 on the GPU, which runs it with --precision bf16 only (not %s)", sq, s.o.GPUPrecision)
		}
	}
	return ""
}

// sharedQuantization is how the shared expert is stored where it is stored
// unlike the routed experts (SRC's plan, else DST's contract), "" where it
// is not.
func (s *session) sharedQuantization() string {
	if s.srcPlan != nil && s.srcPlan.SharedQuantization != "" {
		return string(s.srcPlan.SharedQuantization)
	}
	if s.contract != nil {
		return s.contract.SharedQuantization
	}
	return ""
}

// routedQuantization names the routed experts' format (SRC's plan, else
// DST's contract).
func (s *session) routedQuantization() string {
	if s.srcPlan != nil {
		return string(s.srcPlan.Quantization)
	}
	if s.contract != nil {
		return s.contract.Quantization
	}
	return ""
}

// checkLayerActs: every layer's routed and (unfused) shared activation in
// the contract is SRC's family's (Step-3.7's per-layer limits, HY-V4's
// plain shared MLP).
func (s *session) checkLayerActs() error {
	for _, li := range s.contract.Layers {
		for _, l := range s.srcPlan.Layers {
			if l.Index != li.Index {
				continue
			}
			if a, w := s.contract.RoutedAct(li), s.srcPlan.RoutedAct(l); a != w {
				return fmt.Errorf("%s: layer %d: contract has activation %s; SRC's family (%s) has %s", s.o.Dst, li.Index, jsonText(a), s.srcPlan.ModelType, jsonText(w))
			}
			if l.Shared == nil || s.contract.NumFusedSharedExperts > 0 {
				continue
			}
			if a, w := s.contract.SharedAct(li), s.srcPlan.SharedActOf(l); a != w {
				return fmt.Errorf("%s: layer %d: contract has shared_activation %s; SRC's family (%s) has %s", s.o.Dst, li.Index, jsonText(a), s.srcPlan.ModelType, jsonText(w))
			}
		}
	}
	return nil
}
