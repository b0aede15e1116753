package gpurun

import (
	"fmt"

	"github.com/moeprep/moeprep/internal/cuda"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/weightfmt"
)

// LoadFusedBank queues the upload of a converted layer's stacked expert
// tensors (stacked, gate-up or up-gate, bf16/f32 or FP8 with block scales)
// through s and waits for it.
func LoadFusedBank(s *Stager, src cpuref.TensorSource, fl *cpuref.FusedLayer) (*Bank, error) {
	h, inter, err := fl.StackDims(src)
	if err != nil {
		return nil, err
	}
	c, n := fl.Contract, fl.Names
	e := int64(c.BankSize())
	wf, err := c.Format()
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	_, scaled := wf.Scale()
	if scaled && !kernelsTake(wf) {
		return nil, fmt.Errorf("layer %d: FP8 blocks %v: the GPU kernels take %dx%d", fl.Index, c.WeightBlockSize, kernels.FP8ScaleBlock, kernels.FP8ScaleBlock)
	}
	H, I := int64(h), int64(inter)
	shapes := layout.StackShapesFor(n.Layout, e, I, H, wf)
	b := &Bank{}
	b.NumExperts, b.H, b.I = int(e), h, inter
	fail := func(err error) (*Bank, error) {
		s.wait()
		b.Free()
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	if n.Layout.Fused() {
		if b.GateUp, err = b.weight(s, src, n.GateUp, shapes.GateUp); err != nil {
			return fail(err)
		}
		b.UpFirst = n.Layout == layout.UpGate
		if scaled {
			if b.GateUpScale, err = b.scale(s, src, n.GateUpScale, shapes.GateUpScale); err != nil {
				return fail(err)
			}
		}
	} else {
		if b.Gate, err = b.weight(s, src, n.Gate, shapes.Gate); err != nil {
			return fail(err)
		}
		if b.Up, err = b.weight(s, src, n.Up, shapes.Up); err != nil {
			return fail(err)
		}
		if scaled {
			if b.GateScale, err = b.scale(s, src, n.GateScale, shapes.GateScale); err != nil {
				return fail(err)
			}
			if b.UpScale, err = b.scale(s, src, n.UpScale, shapes.UpScale); err != nil {
				return fail(err)
			}
		}
	}
	if b.Down, err = b.weight(s, src, n.Down, shapes.Down); err != nil {
		return fail(err)
	}
	if scaled {
		if b.DownScale, err = b.scale(s, src, n.DownScale, shapes.DownScale); err != nil {
			return fail(err)
		}
	}
	// The kernels read scales exactly for FP8 weights.
	if scaled != (b.DType == kernels.MatFP8) {
		return fail(fmt.Errorf("the contract says quantization %q, the expert weights are %v", c.Quantization, b.DType))
	}
	b.Act = c.Act()
	if fl.Biases != nil {
		var gb, ub, db []float32
		for x := range int(e) {
			g, u, d, err := fl.ExpertBiases(src, x, h, inter)
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
		b.Free()
		return nil, err
	}
	return b, nil
}

// setBiases uploads a bank's f32 biases (gate, up [E*I], down [E*H]).
func (b *Bank) setBiases(dev *cuda.Device, gb, ub, db []float32) error {
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

// loadMLPBank is loadMLPBankOf for the runner's call sites, which still
// hand a block edge: FP8 blocks of that edge, or (0) unquantised in whatever
// float dtype the tensors hold. They move to loadMLPBankOf with the plan's
// or contract's Format as the runner is reworked.
func loadMLPBank(s *Stager, src cpuref.TensorSource, m family.MLP, h, inter, block int, act layout.Activation) (*Bank, error) {
	var wf weightfmt.Format
	if block != 0 {
		wf = weightfmt.FP8Block(int64(block), int64(block), false)
	}
	return loadMLPBankOf(s, src, m, h, inter, wf, act)
}

// loadMLPBankOf queues the upload of one hub-layout MLP (a routed expert or
// a shared expert, gate/up [inter,H], down [H,inter]) as a bank of one
// expert, with its biases where it has them and the activation act. wf is
// how its weights are stored; one with no scale (or nil) means unquantised
// in whatever float dtype the tensors hold. The caller waits on s's stream
// (kernels queued on the same stream run after the copies).
func loadMLPBankOf(s *Stager, src cpuref.TensorSource, m family.MLP, h, inter int, wf weightfmt.Format, act layout.Activation) (*Bank, error) {
	scaled := false
	var gr, gc, dr, dc int64
	if wf != nil {
		var sc weightfmt.Scale
		if sc, scaled = wf.Scale(); scaled {
			if !kernelsTake(wf) {
				return nil, fmt.Errorf("%s block %s: the GPU kernels take %d", wf, blockEdge(sc.Block), kernels.FP8ScaleBlock)
			}
			gr, gc = weightfmt.Matrix{Format: wf, Rows: int64(inter), Cols: int64(h)}.ScaleShape()
			dr, dc = weightfmt.Matrix{Format: wf, Rows: int64(h), Cols: int64(inter)}.ScaleShape()
		}
	}
	H, I := int64(h), int64(inter)
	b := &Bank{}
	b.NumExperts, b.H, b.I = 1, h, inter
	var err error
	fail := func(err error) (*Bank, error) {
		s.wait()
		b.Free()
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
	if scaled != (b.DType == kernels.MatFP8) {
		return fail(fmt.Errorf("tensor %s is %v, the checkpoint's quantisation says fp8=%v", m.Gate, b.DType, scaled))
	}
	if scaled {
		if b.GateScale, err = b.scale(s, src, m.GateScale, []int64{gr, gc}); err != nil {
			return fail(err)
		}
		if b.UpScale, err = b.scale(s, src, m.UpScale, []int64{gr, gc}); err != nil {
			return fail(err)
		}
		if b.DownScale, err = b.scale(s, src, m.DownScale, []int64{dr, dc}); err != nil {
			return fail(err)
		}
	}
	b.Act = act
	if m.GateBias != "" {
		gb, err := cpuref.LoadVector(src, m.GateBias, inter)
		if err != nil {
			return fail(err)
		}
		ub, err := cpuref.LoadVector(src, m.UpBias, inter)
		if err != nil {
			return fail(err)
		}
		db, err := cpuref.LoadVector(src, m.DownBias, h)
		if err != nil {
			return fail(err)
		}
		if err := b.setBiases(s.dev, gb, ub, db); err != nil {
			return fail(err)
		}
	}
	return b, nil
}

// blockEdge writes a scale block as its edge when square ("128"), rows x
// cols otherwise.
func blockEdge(b [2]int64) string {
	if b[0] == b[1] {
		return fmt.Sprint(b[0])
	}
	return fmt.Sprintf("%dx%d", b[0], b[1])
}

// kernelsTake reports whether the GPU kernels run weights of format f as
// they are stored: unscaled, or F8_E4M3 in FP8ScaleBlock-square blocks of
// F32 scales. Other dtypes of unscaled weights are decoded to f32 on the
// way (matType).
func kernelsTake(f weightfmt.Format) bool {
	sc, scaled := f.Scale()
	if !scaled {
		return true
	}
	return f.DType() == safetensors.F8E4M3 && sc.DType == safetensors.F32 &&
		sc.Block == [2]int64{kernels.FP8ScaleBlock, kernels.FP8ScaleBlock}
}
