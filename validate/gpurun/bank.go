package gpurun

import (
	"context"
	"fmt"

	"github.com/moeprep/moeprep/internal/cuda"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/tensorload"
	"github.com/moeprep/moeprep/weightfmt"
)

// LoadFusedBank queues the upload of a converted layer's stacked expert
// tensors (stacked, gate-up or up-gate, bf16/f32 or FP8 with block scales,
// or a format decoded to bf16 on the device: DecodesOnDevice) through s and
// waits for it; it stops at the next expert once ctx ends.
func LoadFusedBank(ctx context.Context, s *Stager, src tensorload.TensorSource, fl *moelayer.FusedLayer) (*Bank, error) {
	// One loader for both runs: expert by expert, in-out stacks transposed
	// on the way, formats the kernels do not take decoded on the device.
	return LoadFusedBankInOrder(ctx, s, src, fl, identityOrder(fl.Contract.BankSize()), nil)
}

// bankProjs are the projections of a bank of layout l in the order it
// loads them: gate and up (or the fused gate-up), then down.
func bankProjs(l layout.Layout) []layout.Proj {
	if l.Fused() {
		return []layout.Proj{layout.ProjGateUp, layout.ProjDown}
	}
	return []layout.Proj{layout.ProjGate, layout.ProjUp, layout.ProjDown}
}

// matOf is where projection p's weight goes in b.
func (b *Bank) matOf(p layout.Proj) *kernels.Mat {
	return [layout.NumProj]*kernels.Mat{&b.Gate, &b.Up, &b.GateUp, &b.Down}[p]
}

// scaleOf is where projection p's scales go in b.
func (b *Bank) scaleOf(p layout.Proj) **cuda.Buffer[float32] {
	return [layout.NumProj]**cuda.Buffer[float32]{&b.GateScale, &b.UpScale, &b.GateUpScale, &b.DownScale}[p]
}

// projCols is the columns of projection p's weight: I for down, H for the
// others.
func projCols(p layout.Proj, H, I int64) int64 {
	if p == layout.ProjDown {
		return I
	}
	return H
}

// bankParts are a fused bank's parts, one for each of bankProjs: its
// weight, scale and global scale stacks, named by n and shaped by shapes,
// loading into b.
func bankParts(n layout.ExpertTensors, shapes layout.Shapes, b *Bank, H, I int64) []bankPart {
	var out []bankPart
	for _, p := range bankProjs(n.Layout) {
		out = append(out, bankPart{name: n.Weight(p), shape: shapes.Of(p, layout.RoleWeight), cols: projCols(p, H, I), mat: b.matOf(p),
			scaleName: n.Get(p, layout.RoleScale), scaleShape: shapes.Of(p, layout.RoleScale), scale: b.scaleOf(p),
			global: n.Get(p, layout.RoleGlobal), globalShape: shapes.Of(p, layout.RoleGlobal)})
	}
	return out
}

// identityOrder is 0, 1, ..., n-1.
func identityOrder(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
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

// loadMLPBankOf queues the upload of one hub-layout MLP (a routed expert or
// a shared expert, gate/up [inter,H], down [H,inter]) as a bank of one
// expert, with its biases where it has them and the activation act. wf is
// how its weights are stored; one with no scale (or nil), or an MLP that
// names no scales (a shared expert left unquantised beside quantised
// routed experts, read as the CPU reference reads it), means unquantised in whatever
// float dtype the tensors hold; a format DecodesOnDevice takes is decoded
// to bf16 on the device. The caller waits on s's stream (kernels queued on
// the same stream run after the copies).
func loadMLPBankOf(s *Stager, src tensorload.TensorSource, m family.MLP, h, inter int, wf weightfmt.Format, act layout.Activation) (*Bank, error) {
	if len(m.NamesOf(layout.RoleScale)) == 0 {
		wf = nil
	}
	scaled := false
	var sc weightfmt.Scale
	if wf != nil {
		if sc, scaled = wf.Scale(); scaled && !kernelsTake(wf) {
			return nil, fmt.Errorf("%s block %s: the GPU kernels take %d", wf, blockEdge(sc.Block), kernels.FP8ScaleBlock)
		}
	}
	H, I := int64(h), int64(inter)
	b := &Bank{}
	b.NumExperts, b.H, b.I = 1, h, inter
	fail := func(err error) (*Bank, error) {
		s.wait()
		b.Free()
		return nil, err
	}
	// A global scale (NVFP4's weight_scale_2) is one element, whatever its
	// shape (globalShape nil).
	var parts []bankPart
	for _, p := range layout.MLPProjs {
		rows, cols := I, H
		if p == layout.ProjDown {
			rows, cols = H, I
		}
		part := bankPart{name: m.Weight(p), shape: []int64{rows, cols}, cols: cols, mat: b.matOf(p),
			scaleName: m.Get(p, layout.RoleScale), scaleShape: []int64{0, 0}, scaleDType: sc.DType, scale: b.scaleOf(p), global: m.Get(p, layout.RoleGlobal)}
		if wf != nil {
			mx := weightfmt.Matrix{Format: wf, Rows: rows, Cols: cols}
			part.shape = mx.Shape() // as stored: fewer columns where elements pack
			if scaled {
				r, c := mx.ScaleShape()
				part.scaleShape = []int64{r, c}
			}
		}
		parts = append(parts, part)
	}
	if scaled && DecodesOnDevice(wf) {
		if err := b.uploadDecoded(s, src, parts, wf); err != nil {
			return fail(err)
		}
	} else if err := b.upload(s, src, parts, false); err != nil {
		return fail(err)
	} else if scaled != (b.DType == kernels.MatFP8) {
		return fail(fmt.Errorf("tensor %s is %v, the checkpoint's quantisation says fp8=%v", m.First(), b.DType, scaled))
	}
	if scaled && !DecodesOnDevice(wf) {
		if err := b.upload(s, src, parts, true); err != nil {
			return fail(err)
		}
	}
	b.Act = act
	if err := b.loadBiases(s, src, m, h, inter); err != nil {
		return fail(err)
	}
	return b, nil
}

// loadBiases uploads m's biases (gate and up [inter], down [h]) where m
// names a gate bias.
func (b *Bank) loadBiases(s *Stager, src tensorload.TensorSource, m family.MLP, h, inter int) error {
	if m.Get(layout.ProjGate, layout.RoleBias) == "" {
		return nil
	}
	var bias [layout.NumProj][]float32
	for _, p := range layout.MLPProjs {
		n := inter // a bias has its weight's rows
		if p == layout.ProjDown {
			n = h
		}
		var err error
		if bias[p], err = tensorload.LoadVector(src, m.Get(p, layout.RoleBias), n); err != nil {
			return err
		}
	}
	return b.setBiases(s.dev, bias[layout.ProjGate], bias[layout.ProjUp], bias[layout.ProjDown])
}

// bankPart is one weight of a bank, its scale and its global scale: the
// tensors' names, the shapes they must have (shape as stored: packed
// formats hold fewer columns than cols, the weight's), and where the
// uploads go. globalShape nil means one element of any shape.
type bankPart struct {
	name        string
	shape       []int64
	cols        int64
	mat         *kernels.Mat
	scaleName   string
	scaleShape  []int64
	scaleDType  safetensors.DType // the format's scale dtype; "" : F32
	scale       **cuda.Buffer[float32]
	global      string
	globalShape []int64
}

// upload queues the uploads of the parts' weights, or (scales) of their
// scales, in order.
func (b *Bank) upload(s *Stager, src tensorload.TensorSource, parts []bankPart, scales bool) error {
	for _, p := range parts {
		if p.name == "" {
			continue // an ungated bank's gate (Contract.Names, family.MLP)
		}
		var err error
		if scales {
			*p.scale, err = b.scale(s, src, p.scaleName, p.scaleShape, p.scaleDType)
		} else {
			*p.mat, err = b.weight(s, src, p.name, p.shape)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// blockEdge writes a scale block as its edge when square ("128"), rows x
// cols otherwise.
func blockEdge(b [2]int64) string {
	if b[0] == b[1] {
		return fmt.Sprint(b[0])
	}
	return fmt.Sprintf("%dx%d", b[0], b[1])
}

// kernelsTake reports whether the GPU kernels run weights of format f: as
// they are stored, unscaled or F8_E4M3 in FP8ScaleBlock-square blocks of
// F32 scales (other dtypes of unscaled weights are decoded to f32 on the
// way, matType), or decoded to bf16 on the device (DecodesOnDevice).
func kernelsTake(f weightfmt.Format) bool { return KernelsTake(f) }

// KernelsTake is kernelsTake for validate, which refuses (or, with
// --device auto, leaves to the CPU) a format the kernels cannot take
// before any layer runs. FP8 blocks scaled by E8M0 entries (DeepSeek-V4's
// official x.scale) are taken too: their scales are widened to the F32
// the kernels read, exactly, as they are uploaded (Bank.scale).
func KernelsTake(f weightfmt.Format) bool {
	sc, scaled := f.Scale()
	if !scaled || DecodesOnDevice(f) {
		return true
	}
	return f.DType() == safetensors.F8E4M3 && scaleWidens(sc.DType) &&
		sc.Block == [2]int64{kernels.FP8ScaleBlock, kernels.FP8ScaleBlock}
}

// scaleWidens reports whether FP8 block scales of dtype d reach the
// kernels as F32 exactly: F32 as stored, E8M0 (F8_E8M0, or its U8 bytes)
// widened on the host, 2^(e-127) being a float32.
func scaleWidens(d safetensors.DType) bool {
	return d == safetensors.F32 || d == safetensors.F8E8M0 || d == safetensors.U8
}
