package validate

import (
	"fmt"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/layout"
)

// loadFusedBank queues the upload of a converted layer's stacked expert
// tensors (stacked, gate-up or up-gate, bf16/f32 or FP8 with block scales)
// through s and waits for it.
func loadFusedBank(s *stager, src TensorSource, fl *FusedLayer) (*devBank, error) {
	h, inter, err := fl.stackDims(src)
	if err != nil {
		return nil, err
	}
	c, n := fl.Contract, fl.Names
	e := int64(c.BankSize())
	fp8 := c.Quantized()
	if fp8 && (len(c.WeightBlockSize) != 2 || c.WeightBlockSize[0] != kernels.FP8ScaleBlock || c.WeightBlockSize[1] != kernels.FP8ScaleBlock) {
		return nil, fmt.Errorf("layer %d: FP8 blocks %v: the GPU kernels take %dx%d", fl.Index, c.WeightBlockSize, kernels.FP8ScaleBlock, kernels.FP8ScaleBlock)
	}
	sr, sc := int64(kernels.CeilDiv(inter, kernels.FP8ScaleBlock)), int64(kernels.CeilDiv(h, kernels.FP8ScaleBlock))
	H, I := int64(h), int64(inter)
	b := &devBank{}
	b.NumExperts, b.H, b.I = int(e), h, inter
	fail := func(err error) (*devBank, error) {
		s.wait()
		b.free()
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	if n.Layout.Fused() {
		if b.GateUp, err = b.weight(s, src, n.GateUp, []int64{e, 2 * I, H}); err != nil {
			return fail(err)
		}
		b.UpFirst = n.Layout == layout.UpGate
		if fp8 {
			if b.GateUpScale, err = b.scale(s, src, n.GateUpScale, []int64{e, 2 * sr, sc}); err != nil {
				return fail(err)
			}
		}
	} else {
		if b.Gate, err = b.weight(s, src, n.Gate, []int64{e, I, H}); err != nil {
			return fail(err)
		}
		if b.Up, err = b.weight(s, src, n.Up, []int64{e, I, H}); err != nil {
			return fail(err)
		}
		if fp8 {
			if b.GateScale, err = b.scale(s, src, n.GateScale, []int64{e, sr, sc}); err != nil {
				return fail(err)
			}
			if b.UpScale, err = b.scale(s, src, n.UpScale, []int64{e, sr, sc}); err != nil {
				return fail(err)
			}
		}
	}
	if b.Down, err = b.weight(s, src, n.Down, []int64{e, H, I}); err != nil {
		return fail(err)
	}
	if fp8 {
		if b.DownScale, err = b.scale(s, src, n.DownScale, []int64{e, sc, sr}); err != nil {
			return fail(err)
		}
	}
	if fp8 != (b.DType == kernels.MatFP8) {
		return fail(fmt.Errorf("the contract says quantization %q, the expert weights are %v", c.Quantization, b.DType))
	}
	if err := s.wait(); err != nil {
		b.free()
		return nil, err
	}
	return b, nil
}

// loadMLPBank queues the upload of one hub-layout MLP (a routed expert or a
// shared expert, gate/up [inter,H], down [H,inter]) as a bank of one expert.
// block is the FP8 block edge (0: not quantised). The caller waits on s's
// stream (kernels queued on the same stream run after the copies).
func loadMLPBank(s *stager, src TensorSource, m family.MLP, h, inter, block int) (*devBank, error) {
	fp8 := block != 0
	if fp8 && block != kernels.FP8ScaleBlock {
		return nil, fmt.Errorf("FP8 block %d: the GPU kernels take %d", block, kernels.FP8ScaleBlock)
	}
	H, I := int64(h), int64(inter)
	sr, sc := int64(kernels.CeilDiv(inter, kernels.FP8ScaleBlock)), int64(kernels.CeilDiv(h, kernels.FP8ScaleBlock))
	b := &devBank{}
	b.NumExperts, b.H, b.I = 1, h, inter
	var err error
	fail := func(err error) (*devBank, error) {
		s.wait()
		b.free()
		return nil, err
	}
	if b.Gate, err = b.weight(s, src, m.Gate, []int64{I, H}); err != nil {
		return fail(err)
	}
	if b.Up, err = b.weight(s, src, m.Up, []int64{I, H}); err != nil {
		return fail(err)
	}
	if b.Down, err = b.weight(s, src, m.Down, []int64{H, I}); err != nil {
		return fail(err)
	}
	if fp8 != (b.DType == kernels.MatFP8) {
		return fail(fmt.Errorf("tensor %s is %v, the checkpoint's quantisation says fp8=%v", m.Gate, b.DType, fp8))
	}
	if fp8 {
		if b.GateScale, err = b.scale(s, src, m.GateScale, []int64{sr, sc}); err != nil {
			return fail(err)
		}
		if b.UpScale, err = b.scale(s, src, m.UpScale, []int64{sr, sc}); err != nil {
			return fail(err)
		}
		if b.DownScale, err = b.scale(s, src, m.DownScale, []int64{sc, sr}); err != nil {
			return fail(err)
		}
	}
	return b, nil
}
