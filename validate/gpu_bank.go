package validate

import (
	"fmt"

	"github.com/moeprep/moeprep/internal/cuda"

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
	b.Act = c.Act()
	if fl.Biases != nil {
		var gb, ub, db []float32
		for x := range int(e) {
			g, u, d, err := fl.expertBiases(src, x, h, inter)
			if err != nil {
				return fail(fmt.Errorf("expert %d: %w", x, err))
			}
			gb, ub, db = append(gb, g...), append(ub, u...), append(db, d...)
		}
		if err := b.setBiases(s.dev, gb, ub, db); err != nil {
			return fail(err)
		}
	}
	if err := s.wait(); err != nil {
		b.free()
		return nil, err
	}
	return b, nil
}

// setBiases uploads a bank's f32 biases (gate, up [E*I], down [E*H]).
func (b *devBank) setBiases(dev *cuda.Device, gb, ub, db []float32) error {
	for _, v := range []struct {
		host []float32
		dst  **cuda.Buffer[float32]
	}{{gb, &b.GateBias}, {ub, &b.UpBias}, {db, &b.DownBias}} {
		d, err := cuda.FromHost(dev, v.host)
		if err != nil {
			return err
		}
		b.f32 = append(b.f32, d)
		*v.dst = d
	}
	return nil
}

// loadMLPBank queues the upload of one hub-layout MLP (a routed expert or a
// shared expert, gate/up [inter,H], down [H,inter]) as a bank of one expert,
// with its biases where it has them and the activation act. block is the
// FP8 block edge (0: not quantised). The caller waits on s's stream
// (kernels queued on the same stream run after the copies).
func loadMLPBank(s *stager, src TensorSource, m family.MLP, h, inter, block int, act layout.Activation) (*devBank, error) {
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
	b.Act = act
	if m.GateBias != "" {
		gb, err := loadVector(src, m.GateBias, inter)
		if err != nil {
			return fail(err)
		}
		ub, err := loadVector(src, m.UpBias, inter)
		if err != nil {
			return fail(err)
		}
		db, err := loadVector(src, m.DownBias, h)
		if err != nil {
			return fail(err)
		}
		if err := b.setBiases(s.dev, gb, ub, db); err != nil {
			return fail(err)
		}
	}
	return b, nil
}
