// Options and their normalisation: defaults filled and flag values checked before anything is opened.

package validate

import (
	"errors"
	"fmt"
	"strings"

	"github.com/moeprep/moeprep/validate/gpurun"
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
	Device Device
	// GPUPrecision is the activation type of the GPU grouped GEMM: "bf16"
	// (default, as serving engines run), "f32" (high precision) or "fp8"
	// (w8a8: e4m3 activations, fp8 weights, Hopper; the CPU reference of a
	// GPU run then quantises the same way).
	GPUPrecision Precision
	// BlockSize is moe_align_block_size's block (0: DefaultBlockSize); on
	// the GPU it must be a multiple of GPUBlockMultiple.
	BlockSize int
	// CPUCheck is which layers of a GPU run the CPU reference also checks:
	// CPUCheckAuto ("" too: the first and last layer, or all when there
	// are at most 4), CPUCheckNone (GPU only: the run goes at I/O speed) or
	// CPUCheckAll. A CPU run always runs the reference.
	CPUCheck CPUCheckMode
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
	Bytes    BytesMode
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
		switch Device(strings.ToLower(strings.TrimSpace(string(o.Device)))) {
		case "", "auto", DeviceCPU, DeviceCUDA, "gpu":
			return nil, nil
		}
		return nil, fmt.Errorf("validate: unknown --device %q (want auto, cpu or cuda)", o.Device)
	}
	return o.selectDevice(cudaAvailable)
}

// Resolve fills o's defaults, checks it and resolves its device as Run
// does, for a caller that runs the layers itself (the per-rank
// recomposition); the returned notes (the auto fallback) belong in its
// report.
func (o *Options) Resolve() ([]string, error) { return o.norm() }

// GPURefused applies the GPU's refusal of a run's expert weights (why) to
// o, a run on DeviceCUDA the user asked for as asked (the --device flag
// as given): under "cuda" it is the run's error; under "auto" (or "") the
// run goes to the CPU, with a notice and the returned note for the report.
func (o *Options) GPURefused(asked, why string) (string, error) {
	asked = strings.ToLower(strings.TrimSpace(asked))
	if asked != "" && asked != "auto" {
		return "", fmt.Errorf("validate --device cuda: %s; use --device cpu or auto", why)
	}
	msg := "validate: " + why + "; running on the CPU"
	o.notice(msg)
	o.Device = DeviceCPU
	return strings.TrimPrefix(msg, "validate: ") + " (--device auto)", nil
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
	switch CPUCheckMode(strings.ToLower(strings.TrimSpace(string(o.CPUCheck)))) {
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

// BytesMode is whether a run proves DST's bytes (Options.Bytes).
type BytesMode string

// The structural proof's modes (Options.Bytes).
const (
	BytesAuto BytesMode = "auto" // after the layer checks, when SRC and DST are given
	BytesOnly BytesMode = "only" // validate --bytes: the structural proof alone
	BytesOff  BytesMode = "off"  // --skip-bytes
)
