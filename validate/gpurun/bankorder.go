package gpurun

import (
	"context"
	"fmt"
	"time"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// LoadsInOrder reports whether LoadFusedBankInOrder can load fl's bank:
// any format the kernels take (as stored, or decoded to bf16 on the
// device), in either orientation, except a format decoded on the device
// stored in-out (the device decodes out-in rows).
func LoadsInOrder(fl *moelayer.FusedLayer) bool {
	wf, err := fl.Contract.Format()
	if err != nil {
		return false
	}
	return kernelsTake(wf) && !(DecodesOnDevice(wf) && fl.Contract.Oriented() == layout.InOut)
}

// orderedPart is one stack of a bank loaded expert by expert: the stored
// tensor, where its device copy starts, one expert's elements in and
// bytes out, and, for an in-out stack, one expert's stored rows and
// columns (its transpose goes to the device).
type orderedPart struct {
	t          *checkpoint.Tensor
	dst        cuda.DevicePtr
	per        int64 // elements of one expert
	outPer     int64 // device bytes of one expert
	decode     bool
	rows, cols int64 // in-out: the stored [rows, cols] of one expert; 0: out-in
}

// copyExpert queues expert x's slice of p to the device, transposed to
// out-in when p is stored in-out.
func (p orderedPart) copyExpert(s *Stager, x int64) error {
	dst := p.dst.Add(int(x * p.outPer))
	if p.rows > 0 {
		return s.copyTransposed(dst, p.t, x, p.rows, p.cols, p.decode)
	}
	return s.copyElems(dst, p.t, x*p.per, (x+1)*p.per, p.decode)
}

// LoadFusedBankInOrder loads the bank of a layer LoadsInOrder takes expert
// by expert in order (bank indices, each once): each expert's slices of
// every stack (and its biases) together, in the order a streamed pass
// reads them, let go at once (pace: Take before an expert's slices are
// read, Done after; nil: none). In-out stacks reach the device as their
// out-in transpose, the layout the kernels take, so the bank is the same
// either way.
func LoadFusedBankInOrder(ctx context.Context, s *Stager, src tensorload.TensorSource, fl *moelayer.FusedLayer, order []int, pace moelayer.Pace) (*Bank, error) {
	if wf, err := fl.Contract.Format(); err == nil && !LoadsInOrder(fl) {
		if sc, _ := wf.Scale(); !kernelsTake(wf) {
			return nil, fmt.Errorf("layer %d: %s blocks %s: the GPU kernels take %dx%d", fl.Index, wf, blockEdge(sc.Block), kernels.FP8ScaleBlock, kernels.FP8ScaleBlock)
		}
		return nil, fmt.Errorf("layer %d: orientation %s: the GPU decodes out-in stacks only", fl.Index, fl.Contract.Oriented())
	}
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
	decode := DecodesOnDevice(wf)
	H, I := int64(h), int64(inter)
	inOut := c.Oriented() == layout.InOut
	shapes := layout.StackShapesFor(n.Layout, e, I, H, wf).Oriented(c.Oriented())
	b := &Bank{}
	b.NumExperts, b.H, b.I = int(e), h, inter
	fail := func(err error) (*Bank, error) {
		s.wait()
		b.Free()
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	// Formats decoded on the device: each weight's bf16 copy, its scales
	// and global scales filled expert by expert too.
	var decoded []*decodedPart
	if decode {
		b.UpFirst = n.Layout == layout.UpGate
		for _, p := range bankParts(n, shapes, b, H, I) {
			d, err := b.decodeSetup(s, src, p, wf, true)
			if err != nil {
				return fail(err)
			}
			if d.rows%e != 0 {
				return fail(fmt.Errorf("%s: tensor %s: %d rows for %d experts", d.t.File, d.t.Name, d.rows, e))
			}
			*p.mat = d.mat
			decoded = append(decoded, d)
		}
	}
	type stackOf struct {
		name       string
		shape      []int64
		mat        *kernels.Mat
		scaleName  string
		scaleShape []int64
		scale      **cuda.Buffer[float32]
	}
	stacks := []stackOf{{n.Weight(layout.ProjGate), shapes.Gate, &b.Gate, n.Get(layout.ProjGate, layout.RoleScale), shapes.GateScale, &b.GateScale},
		{n.Weight(layout.ProjUp), shapes.Up, &b.Up, n.Get(layout.ProjUp, layout.RoleScale), shapes.UpScale, &b.UpScale}}
	if n.Layout.Fused() {
		stacks = []stackOf{{n.Weight(layout.ProjGateUp), shapes.GateUp, &b.GateUp, n.Get(layout.ProjGateUp, layout.RoleScale), shapes.GateUpScale, &b.GateUpScale}}
		b.UpFirst = n.Layout == layout.UpGate
	}
	stacks = append(stacks, stackOf{n.Weight(layout.ProjDown), shapes.Down, &b.Down, n.Get(layout.ProjDown, layout.RoleScale), shapes.DownScale, &b.DownScale})
	if decode {
		stacks = nil
	}
	// Allocate every stack first, then fill them.
	var parts []orderedPart
	for _, st := range stacks {
		if st.name == "" {
			continue // an ungated bank's gate (Contract.Names)
		}
		t, err := tensorShaped(src, st.name, st.shape)
		if err != nil {
			return fail(err)
		}
		dt, decode, err := matType(t)
		if err != nil {
			return fail(err)
		}
		if b.DType == 0 {
			b.DType = dt
		} else if b.DType != dt {
			return fail(fmt.Errorf("%s: tensor %s is %s, the bank's other weights %v", t.File, st.name, t.DType, b.DType))
		}
		buf, err := b.alloc(s.dev, t, dt)
		if err != nil {
			return fail(err)
		}
		*st.mat = kernels.Mat{DType: dt, Ptr: buf.Ptr(), Len: int(t.NumElements())}
		parts = append(parts, orderedPart{t: t, dst: buf.Ptr(), per: t.NumElements() / e, outPer: int64(buf.Bytes()) / e, decode: decode}.oriented(inOut))
		if scaled {
			ts, err := tensorShaped(src, st.scaleName, st.scaleShape)
			if err != nil {
				return fail(err)
			}
			sb, err := b.scaleBuffer(s.dev, ts)
			if err != nil {
				return fail(err)
			}
			*st.scale = sb
			parts = append(parts, orderedPart{t: ts, dst: sb.Ptr(), per: ts.NumElements() / e, outPer: int64(sb.Bytes()) / e}.oriented(inOut))
		}
	}
	if scaled && !decode != (b.DType == kernels.MatFP8) {
		return fail(fmt.Errorf("the contract says quantization %q, the expert weights are %v", c.Quantization, b.DType))
	}
	busy := make([]time.Duration, len(parts)+len(decoded))
	done := map[int]bool{}
	var gb, ub, db []float32 // biases, [E*I], [E*I], [E*H]
	if fl.Biases != nil {
		gb, ub, db = make([]float32, e*I), make([]float32, e*I), make([]float32, e*H)
	}
	for _, x := range order {
		if x < 0 || int64(x) >= e || done[x] {
			return fail(fmt.Errorf("bank order names expert %d of %d twice or out of range", x, e))
		}
		done[x] = true
		if pace != nil {
			if err := pace.Take(ctx, x); err != nil {
				return fail(err)
			}
		}
		for i, p := range parts {
			t0 := time.Now()
			err := p.copyExpert(s, int64(x))
			busy[i] += time.Since(t0)
			if err != nil {
				if pace != nil {
					pace.Done(x)
				}
				return fail(err)
			}
		}
		for i, d := range decoded {
			t0 := time.Now()
			r := d.rows / e
			err := d.expertScales(s, int64(x), e)
			if err == nil {
				err = d.decodeRows(s, int64(x)*r, int64(x+1)*r)
			}
			busy[len(parts)+i] += time.Since(t0)
			if err != nil {
				if pace != nil {
					pace.Done(x)
				}
				return fail(err)
			}
		}
		if fl.Biases != nil {
			g, u, d, err := fl.ExpertBiases(src, x, h, inter)
			if err != nil {
				if pace != nil {
					pace.Done(x)
				}
				return fail(fmt.Errorf("expert %d: %w", x, err))
			}
			copy(gb[x*inter:], g)
			copy(ub[x*inter:], u)
			copy(db[x*h:], d)
		}
		// copyElems copied the bytes into a staging buffer: the source
		// may go.
		if pace != nil {
			pace.Done(x)
		}
	}
	if int64(len(done)) != e {
		return fail(fmt.Errorf("bank order names %d of %d experts", len(done), e))
	}
	if s.rec != nil {
		for i, p := range parts {
			s.rec.addTimed(p.t, p.decode, e*p.per*int64(p.t.DType.Size()), busy[i])
		}
		for i, d := range decoded {
			s.rec.addTimed(d.t, false, d.t.NumElements()*int64(d.t.DType.Size()), busy[len(parts)+i])
			if !d.fp8 { // a 4-bit grid's bytes come with its weight's
				s.rec.addTimed(d.ts, false, d.ts.NumElements()*int64(d.ts.DType.Size()), 0)
			}
		}
	}
	if fl.Biases != nil {
		if err := b.setBiases(s.dev, gb, ub, db); err != nil {
			return fail(err)
		}
	}
	b.Act = fl.Act()
	if err := s.wait(); err != nil {
		b.Free()
		return nil, err
	}
	return b, nil
}

// oriented is p for a stack stored in-out: one expert's slice is stored
// transposed, [rows, cols] = the last two dimensions of the tensor.
func (p orderedPart) oriented(inOut bool) orderedPart {
	if inOut && len(p.t.Shape) == 3 {
		p.rows, p.cols = p.t.Shape[1], p.t.Shape[2]
	}
	return p
}
