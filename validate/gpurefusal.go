// The GPU refusal policy: which expert weights the GPU kernels cannot run, said before a GPU run
// starts.

package validate

import (
	"fmt"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/gpurun"
	"github.com/moeprep/moeprep/weightfmt"
)

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
