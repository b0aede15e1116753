package validate

import (
	"errors"
	"fmt"
	"strings"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/validate/gpurun"
)

// Device is where a run's layers compute (Options.Device, --device):
// DeviceCPU or DeviceCUDA once a run resolved it, and before that as the
// flag gave it ("auto" or "", "cpu", "cuda" or "gpu", in any case).
type Device string

// Precision is the activation type of a GPU run's grouped GEMM
// (Options.GPUPrecision, --precision).
type Precision string

// Devices and GPU precisions of Options.
const (
	DeviceCPU  Device = "cpu"
	DeviceCUDA Device = "cuda"

	PrecisionBF16 Precision = gpurun.PrecisionBF16
	PrecisionF32  Precision = gpurun.PrecisionF32
	// PrecisionFP8 is the w8a8 serving numerics (moe.GEMMOptions.W8A8): the
	// GPU quantises each expert GEMM's activations to e4m3 per token per
	// 128 channels and multiplies e4m3 x e4m3 (fp8 weights, compute
	// capability 9.0); the CPU reference quantises the same way.
	PrecisionFP8 Precision = gpurun.PrecisionFP8
)

// GPUBlockMultiple is what --block-size must be a multiple of on the GPU:
// the grouped GEMM's row tile, so that a tile never spans two experts.
const GPUBlockMultiple = gpurun.BlockMultiple

// cudaAvailable is cuda.Available; tests replace it to simulate a machine
// with or without a driver.
var cudaAvailable = cuda.Available

// selectDevice resolves o.Device to DeviceCPU or DeviceCUDA with avail
// (cuda.Available), checks the GPU-only options and returns the report
// notes of an auto fallback (also sent to Notice, or Progress).
func (o *Options) selectDevice(avail func() error) ([]string, error) {
	var notes []string
	switch strings.ToLower(strings.TrimSpace(string(o.Device))) {
	case "", "auto":
		if err := avail(); err != nil {
			msg := "validate: " + fallbackReason(err) + "; running on the CPU"
			o.notice(msg)
			notes = append(notes, strings.TrimPrefix(msg, "validate: ")+" (--device auto)")
			o.Device = DeviceCPU
		} else {
			o.Device = DeviceCUDA
		}
	case "cpu":
		o.Device = DeviceCPU
	case "cuda", "gpu":
		if err := avail(); err != nil {
			return nil, fmt.Errorf("%w: %w; use --device cpu or auto", ErrDeviceUnavailable, err)
		}
		o.Device = DeviceCUDA
	default:
		return nil, fmt.Errorf("validate: unknown --device %q (want auto, cpu or cuda)", o.Device)
	}
	switch Precision(strings.ToLower(string(o.GPUPrecision))) {
	case "", PrecisionBF16:
		o.GPUPrecision = PrecisionBF16
	case PrecisionF32, "fp32":
		o.GPUPrecision = PrecisionF32
	case PrecisionFP8, "w8a8":
		o.GPUPrecision = PrecisionFP8
	default:
		return nil, fmt.Errorf("validate: GPU precision %q (want bf16, f32 or fp8)", o.GPUPrecision)
	}
	if o.Device == DeviceCUDA && o.BlockSize%GPUBlockMultiple != 0 {
		return nil, fmt.Errorf("validate: --block-size %d: the GPU grouped GEMM needs a multiple of %d (use --device cpu for other block sizes)", o.BlockSize, GPUBlockMultiple)
	}
	return notes, nil
}

// fallbackReason says in a few words why the GPU cannot be used.
func fallbackReason(err error) string {
	switch {
	case errors.Is(err, cuda.ErrNoDriver):
		return "no CUDA driver (" + cuda.LibraryName + " not found)"
	case errors.Is(err, cuda.ErrNoDevice):
		return "no CUDA device (the driver reports none)"
	}
	return fmt.Sprintf("CUDA unusable (%v)", err)
}

func (o *Options) notice(msg string) {
	switch {
	case o.Notice != nil:
		o.Notice(msg)
	case o.Progress != nil:
		o.Progress(msg)
	}
}
