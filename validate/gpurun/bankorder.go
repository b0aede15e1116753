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
	"github.com/moeprep/moeprep/weightfmt"
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
	ld, err := newOrderedLoad(s, src, fl)
	if err != nil {
		return nil, err
	}
	b := ld.b
	fail := func(err error) (*Bank, error) {
		s.wait()
		b.Free()
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	if err := ld.allocate(); err != nil {
		return fail(err)
	}
	if err := ld.fill(ctx, order, pace); err != nil {
		return fail(err)
	}
	ld.record()
	if fl.Biases != nil {
		if err := b.setBiases(s.dev, ld.gb, ld.ub, ld.db); err != nil {
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

// orderedLoad is a bank being loaded expert by expert: its stacks
// allocated (parts) or, for a format decoded on the device, set up to
// decode (decoded), the time each one's copies took, and the biases
// gathered on the host.
type orderedLoad struct {
	s        *Stager
	src      tensorload.TensorSource
	fl       *moelayer.FusedLayer
	wf       weightfmt.Format // the contract's
	b        *Bank
	e        int64 // bank experts
	h, inter int
	parts    []orderedPart
	decoded  []*decodedPart
	busy     []time.Duration // by part, then by decoded part
	gb, ub   []float32       // biases [E*I]; nil when the layer has none
	db       []float32       // [E*H]
}

// newOrderedLoad reads fl's dimensions and format and makes its empty bank.
func newOrderedLoad(s *Stager, src tensorload.TensorSource, fl *moelayer.FusedLayer) (*orderedLoad, error) {
	h, inter, err := fl.StackDims(src)
	if err != nil {
		return nil, err
	}
	wf, err := fl.Contract.Format()
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	e := int64(fl.Contract.BankSize())
	ld := &orderedLoad{s: s, src: src, fl: fl, wf: wf, b: &Bank{}, e: e, h: h, inter: inter}
	ld.b.NumExperts, ld.b.H, ld.b.I = int(e), h, inter
	return ld, nil
}

// allocate allocates every stack of the bank (bankParts), or sets up the
// decode of each where the device decodes the format, before any expert
// is filled; and the host's room for the biases.
func (ld *orderedLoad) allocate() error {
	c, n, b, e := ld.fl.Contract, ld.fl.Names, ld.b, ld.e
	H, I := int64(ld.h), int64(ld.inter)
	shapes := layout.StackShapesFor(n.Layout, e, I, H, ld.wf).Oriented(c.Oriented())
	b.UpFirst = n.Layout == layout.UpGate
	parts := bankParts(n, shapes, b, H, I)
	_, scaled := ld.wf.Scale()
	decode := DecodesOnDevice(ld.wf)
	var err error
	if decode {
		err = ld.setUpDecodes(parts)
	} else {
		err = ld.allocStacks(parts, scaled)
	}
	if err != nil {
		return err
	}
	if scaled && !decode != (b.DType == kernels.MatFP8) {
		return fmt.Errorf("the contract says quantization %q, the expert weights are %v", c.Quantization, b.DType)
	}
	ld.busy = make([]time.Duration, len(ld.parts)+len(ld.decoded))
	if ld.fl.Biases != nil {
		ld.gb, ld.ub, ld.db = make([]float32, e*I), make([]float32, e*I), make([]float32, e*H)
	}
	return nil
}

// setUpDecodes sets up each part of a format decoded on the device: its
// bf16 copy, its scales and global scales filled expert by expert too.
func (ld *orderedLoad) setUpDecodes(parts []bankPart) error {
	for _, p := range parts {
		d, err := ld.b.decodeSetup(ld.s, ld.src, p, ld.wf, true)
		if err != nil {
			return err
		}
		if d.rows%ld.e != 0 {
			return fmt.Errorf("%s: tensor %s: %d rows for %d experts", d.t.File, d.t.Name, d.rows, ld.e)
		}
		*p.mat = d.mat
		ld.decoded = append(ld.decoded, d)
	}
	return nil
}

// allocStacks allocates each part's weight stack, and its scale stack
// where the format is scaled, as the orderedParts that fill them.
func (ld *orderedLoad) allocStacks(parts []bankPart, scaled bool) error {
	b, e, s := ld.b, ld.e, ld.s
	inOut := ld.fl.Contract.Oriented() == layout.InOut
	for _, p := range parts {
		if p.name == "" {
			continue // an ungated bank's gate (Contract.Names)
		}
		t, err := tensorShaped(ld.src, p.name, p.shape)
		if err != nil {
			return err
		}
		dt, decode, err := matType(t)
		if err != nil {
			return err
		}
		if b.DType == 0 {
			b.DType = dt
		} else if b.DType != dt {
			return fmt.Errorf("%s: tensor %s is %s, the bank's other weights %v", t.File, p.name, t.DType, b.DType)
		}
		buf, err := b.alloc(s.dev, t, dt)
		if err != nil {
			return err
		}
		*p.mat = kernels.Mat{DType: dt, Ptr: buf.Ptr(), Len: int(t.NumElements())}
		ld.parts = append(ld.parts, orderedPart{t: t, dst: buf.Ptr(), per: t.NumElements() / e, outPer: int64(buf.Bytes()) / e, decode: decode}.oriented(inOut))
		if scaled {
			ts, err := tensorShaped(ld.src, p.scaleName, p.scaleShape)
			if err != nil {
				return err
			}
			sb, err := b.scaleBuffer(s.dev, ts)
			if err != nil {
				return err
			}
			*p.scale = sb
			ld.parts = append(ld.parts, orderedPart{t: ts, dst: sb.Ptr(), per: ts.NumElements() / e, outPer: int64(sb.Bytes()) / e}.oriented(inOut))
		}
	}
	return nil
}

// fill loads the experts in order, each once (pace: Take before an
// expert, Done after, also when it fails). It stops at the next expert
// once ctx ends: a run that failed elsewhere does not wait for the rest of
// the bank.
func (ld *orderedLoad) fill(ctx context.Context, order []int, pace moelayer.Pace) error {
	done := map[int]bool{}
	for _, x := range order {
		if err := ctx.Err(); err != nil {
			return err
		}
		if x < 0 || int64(x) >= ld.e || done[x] {
			return fmt.Errorf("bank order names expert %d of %d twice or out of range", x, ld.e)
		}
		done[x] = true
		if pace != nil {
			if err := pace.Take(ctx, x); err != nil {
				return err
			}
		}
		err := ld.expert(x)
		// copyElems copied the bytes into a staging buffer: the source
		// may go.
		if pace != nil {
			pace.Done(x)
		}
		if err != nil {
			return err
		}
	}
	if int64(len(done)) != ld.e {
		return fmt.Errorf("bank order names %d of %d experts", len(done), ld.e)
	}
	return nil
}

// expert queues expert x's slice of every stack (copied, or decoded with
// its scales) and gathers its biases.
func (ld *orderedLoad) expert(x int) error {
	s, e := ld.s, ld.e
	for i, p := range ld.parts {
		t0 := time.Now()
		err := p.copyExpert(s, int64(x))
		ld.busy[i] += time.Since(t0)
		if err != nil {
			return err
		}
	}
	for i, d := range ld.decoded {
		t0 := time.Now()
		r := d.rows / e
		err := d.expertScales(s, int64(x), e)
		if err == nil {
			err = d.decodeRows(s, int64(x)*r, int64(x+1)*r)
		}
		ld.busy[len(ld.parts)+i] += time.Since(t0)
		if err != nil {
			return err
		}
	}
	if ld.fl.Biases != nil {
		g, u, d, err := ld.fl.ExpertBiases(ld.src, x, ld.h, ld.inter)
		if err != nil {
			return fmt.Errorf("expert %d: %w", x, err)
		}
		copy(ld.gb[x*ld.inter:], g)
		copy(ld.ub[x*ld.inter:], u)
		copy(ld.db[x*ld.h:], d)
	}
	return nil
}

// record adds each stack's bytes and the time its copies took to the
// stager's recorder, where it has one.
func (ld *orderedLoad) record() {
	s, e := ld.s, ld.e
	if s.rec == nil {
		return
	}
	for i, p := range ld.parts {
		s.rec.addTimed(p.t, p.decode, e*p.per*int64(p.t.DType.Size()), ld.busy[i])
	}
	for i, d := range ld.decoded {
		s.rec.addTimed(d.t, false, d.t.NumElements()*int64(d.t.DType.Size()), ld.busy[len(ld.parts)+i])
		if !d.fp8 { // a 4-bit grid's bytes come with its weight's
			s.rec.addTimed(d.ts, false, d.ts.NumElements()*int64(d.ts.DType.Size()), 0)
		}
	}
}

// oriented is p for a stack stored in-out: one expert's slice is stored
// transposed, [rows, cols] = the last two dimensions of the tensor.
func (p orderedPart) oriented(inOut bool) orderedPart {
	if inOut && len(p.t.Shape) == 3 {
		p.rows, p.cols = p.t.Shape[1], p.t.Shape[2]
	}
	return p
}
