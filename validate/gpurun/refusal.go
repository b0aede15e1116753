// The GPU refusal policy, beside KernelsTake and DecodesOnDevice which it
// rests on: which expert weights the GPU run cannot take, said before a run
// starts (validate falls back to the CPU under --device auto, and refuses
// under --device cuda).

package gpurun

import (
	"fmt"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/weightfmt"
)

// Refusal says why the GPU kernels cannot run the expert weights of SRC
// (plan, nil: no SRC) or DST (contract c, nil: no DST) at precision ("" when
// they can): the kernels take unquantised weights and FP8
// 128x128 blocks (F32 or E8M0 scales) as stored, and FP8 in blocks of other
// sizes, FP8 per channel or per tensor, MXFP8, pack-quantized INT4, MXFP4 and NVFP4 decoded to bf16 on the
// device (DecodesOnDevice), which only the bf16 precision compares
// (the decode rounds every weight to bf16 once, which the gpu-f32
// tolerance would rightly fail and the w8a8 mode does not model). No
// format may run as if it were one they take.
func Refusal(plan *family.Plan, c *layout.Contract, precision string) string {
	// A latent MoE (Kimi K3) runs: its bank on the latent, the
	// projections around it on the router GEMM's kernel, the norm on the
	// host (latent.go); SiTU is one of act.cu's activations.
	if c != nil && c.Layout == layout.AsStored {
		return fmt.Sprintf("DST's experts are stored as SRC stores them (layout %s, --layout transformers), so there are no stacks for the GPU's fused kernels; the CPU reference runs both sides, and the byte proof holds every expert tensor to SRC's bytes", layout.AsStored)
	}
	var fs []weightfmt.Format
	if plan != nil {
		f, err := plan.Format()
		if err != nil {
			return err.Error()
		}
		fs = append(fs, f)
	}
	if c != nil {
		f, err := c.Format()
		if err != nil {
			return err.Error()
		}
		fs = append(fs, f)
	}
	for _, f := range fs {
		if c != nil && c.Oriented() == layout.InOut && DecodesOnDevice(f) {
			// In-out stacks are transposed on the host as they upload;
			// the device decode takes out-in rows.
			return fmt.Sprintf("the stacks are in-out ([E,H,I]: orientation in-out) and %s expert weights (quantization %s) are decoded on the GPU, which decodes out-in stacks only", f, f.Quantization())
		}
		if DecodesOnDevice(f) && precision != PrecisionBF16 {
			sc, _ := f.Scale()
			return fmt.Sprintf("%s expert weights (quantization %s, %s scales) are decoded to bf16 on the GPU, which runs them with --precision bf16 only (not %s)",
				f, f.Quantization(), sc.DType, precision)
		}
		if KernelsTake(f) {
			continue
		}
		sc, _ := f.Scale()
		return fmt.Sprintf("%s expert weights (quantization %s, %s scales) have no GPU path: the GPU runs unquantised weights, FP8 128x128 blocks as stored, and FP8 in other blocks, FP8 per-channel or per-tensor, MXFP8, INT4, MXFP4 and NVFP4 weights (decoded to bf16)",
			f, f.Quantization(), sc.DType)
	}
	// A shared expert stored unlike the routed experts loads with its own
	// format (a plain one as the plain MLP it is, DeepSeek-V4's FP8
	// blocks beside FP4 through the FP8 kernels): it must be one the
	// kernels take, at this precision.
	if sq := sharedQuantization(plan, c); sq != "" && sq != string(family.QuantNone) {
		if why := sharedRefusal(plan, c, precision, sq); why != "" {
			return why
		}
	}
	// A shared expert DST's contract says was requantised
	// (shared_requantized) is in the routed experts' format, held to the
	// kernels and the precision above: the fused bank holds its replicas,
	// the GPU's unfused path runs SRC's shared expert requantised the same
	// way (RequantisedShared) and the CPU reference runs it both
	// ways on the layers it checks (validate's checkLayerGPU).
	return ""
}

// sharedRefusal says why the GPU cannot run a shared expert stored as
// sq beside the routed experts ("" when it can).
func sharedRefusal(plan *family.Plan, c *layout.Contract, precision, sq string) string {
	var fs []weightfmt.Format
	if plan != nil && plan.SharedQuantization != "" {
		f, err := plan.SharedFormat()
		if err != nil {
			return err.Error()
		}
		fs = append(fs, f)
	}
	if c != nil && c.SharedQuantization != "" {
		f, err := c.SharedFormat()
		if err != nil {
			return err.Error()
		}
		fs = append(fs, f)
	}
	for _, f := range fs {
		sc, _ := f.Scale()
		switch {
		case !KernelsTake(f):
			return fmt.Sprintf("the shared expert is stored as %s (%s scales) beside %s routed experts, which the GPU kernels do not take", sq, sc.DType, routedQuantization(plan, c))
		case DecodesOnDevice(f) && precision != PrecisionBF16:
			return fmt.Sprintf("the shared expert (%s) is decoded to bf16 on the GPU, which runs it with --precision bf16 only (not %s)", sq, precision)
		}
	}
	return ""
}

// sharedQuantization is how the shared expert is stored where it is stored
// unlike the routed experts (SRC's plan, else DST's contract), "" where it
// is not.
func sharedQuantization(plan *family.Plan, c *layout.Contract) string {
	if plan != nil && plan.SharedQuantization != "" {
		return string(plan.SharedQuantization)
	}
	if c != nil {
		return c.SharedQuantization
	}
	return ""
}

// routedQuantization names the routed experts' format (SRC's plan, else
// DST's contract).
func routedQuantization(plan *family.Plan, c *layout.Contract) string {
	if plan != nil {
		return string(plan.Quantization)
	}
	if c != nil {
		return c.Quantization
	}
	return ""
}
