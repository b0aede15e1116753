package gpurun

import (
	"context"
	"fmt"
	"time"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/cpuref"
)

// LoadsInOrder reports whether LoadFusedBankInOrder can load fl's bank:
// out-in stacks whose bytes go to the device as they are (bf16, f32 or
// FP8 blocks, or float types decoded to f32 on the host) and no biases.
// Formats decoded on the device, and biases, load by tensor
// (LoadFusedBank).
func LoadsInOrder(fl *cpuref.FusedLayer) bool {
	c := fl.Contract
	if c.Oriented() != layout.OutIn || fl.Biases != nil {
		return false
	}
	wf, err := c.Format()
	if err != nil {
		return false
	}
	_, scaled := wf.Scale()
	return !DecodesOnDevice(wf) && (!scaled || kernelsTake(wf))
}

// orderedPart is one stack of a bank loaded expert by expert: the stored
// tensor, where its device copy starts, and one expert's elements in and
// bytes out.
type orderedPart struct {
	t      *checkpoint.Tensor
	dst    cuda.DevicePtr
	per    int64 // elements of one expert
	outPer int64 // device bytes of one expert
	decode bool
}

// LoadFusedBankInOrder is LoadFusedBank for a streamed run: the same bank,
// filled expert by expert in order (bank indices, each once) rather than
// tensor by tensor, so that it takes each expert's slices of every stack
// together, in the order a streamed pass reads them, and lets them go at
// once (pace: Take before an expert's slices are read, Done after; nil:
// none). Only for layers LoadsInOrder takes.
func LoadFusedBankInOrder(ctx context.Context, s *Stager, src cpuref.TensorSource, fl *cpuref.FusedLayer, order []int, pace cpuref.Pace) (*Bank, error) {
	if !LoadsInOrder(fl) {
		return nil, fmt.Errorf("layer %d: the bank does not load expert by expert", fl.Index)
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
	H, I := int64(h), int64(inter)
	shapes := layout.StackShapesFor(n.Layout, e, I, H, wf)
	b := &Bank{}
	b.NumExperts, b.H, b.I = int(e), h, inter
	fail := func(err error) (*Bank, error) {
		s.wait()
		b.Free()
		return nil, fmt.Errorf("layer %d: %w", fl.Index, err)
	}
	type stackOf struct {
		name       string
		shape      []int64
		mat        *kernels.Mat
		scaleName  string
		scaleShape []int64
		scale      **cuda.Buffer[float32]
	}
	stacks := []stackOf{{n.Gate, shapes.Gate, &b.Gate, n.GateScale, shapes.GateScale, &b.GateScale},
		{n.Up, shapes.Up, &b.Up, n.UpScale, shapes.UpScale, &b.UpScale}}
	if n.Layout.Fused() {
		stacks = []stackOf{{n.GateUp, shapes.GateUp, &b.GateUp, n.GateUpScale, shapes.GateUpScale, &b.GateUpScale}}
		b.UpFirst = n.Layout == layout.UpGate
	}
	stacks = append(stacks, stackOf{n.Down, shapes.Down, &b.Down, n.DownScale, shapes.DownScale, &b.DownScale})
	// Allocate every stack first, as LoadFusedBank does, then fill them.
	var parts []orderedPart
	for _, st := range stacks {
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
		parts = append(parts, orderedPart{t: t, dst: buf.Ptr(), per: t.NumElements() / e, outPer: int64(buf.Bytes()) / e, decode: decode})
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
			parts = append(parts, orderedPart{t: ts, dst: sb.Ptr(), per: ts.NumElements() / e, outPer: int64(sb.Bytes()) / e})
		}
	}
	if scaled != (b.DType == kernels.MatFP8) {
		return fail(fmt.Errorf("the contract says quantization %q, the expert weights are %v", c.Quantization, b.DType))
	}
	busy := make([]time.Duration, len(parts))
	done := map[int]bool{}
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
			err := s.copyElems(p.dst.Add(int(int64(x)*p.outPer)), p.t, int64(x)*p.per, int64(x+1)*p.per, p.decode)
			busy[i] += time.Since(t0)
			if err != nil {
				if pace != nil {
					pace.Done(x)
				}
				return fail(err)
			}
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
	}
	b.Act = c.Act()
	if err := s.wait(); err != nil {
		b.Free()
		return nil, err
	}
	return b, nil
}
