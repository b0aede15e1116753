package gpurun

import (
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/tensorbytes"
	"github.com/moeprep/moeprep/weightfmt"
)

// StageChunkBytes is the size of each of a stager's two pinned host
// buffers: weights reach the device in chunks of at most this many bytes,
// so host memory stays bounded whatever the tensor size.
const StageChunkBytes = 64 << 20

// Stager streams tensors from a checkpoint to device memory through two
// pinned host buffers on one stream: while chunk i is copied, chunk i+1 is
// read from disk into the other buffer. A buffer is refilled only after the
// event recorded behind its last copy has completed.
type Stager struct {
	dev    *cuda.Device
	stream cuda.Stream
	bufs   [2]*cuda.HostBuffer
	events [2]cuda.Event
	used   [2]bool
	next   int
	raw    []byte // read buffer for tensors decoded to f32 on the host
	// rec, when set, collects what this stager reads and the time it takes
	// (a layer's I/O); only the goroutine using the stager touches it.
	rec *StageRecord
	// ring, when > 0, wraps the device offsets of copyTensor into the
	// first ring bytes of dst: the I/O baseline copies every byte without
	// holding a whole tensor on the device.
	ring int64
	// dq is the device scratch of weights decoded on the device (dequant.go).
	dq dequantScratch
}

func newStager(dev *cuda.Device, stream cuda.Stream) (*Stager, error) {
	s := &Stager{dev: dev, stream: stream}
	for i := range s.bufs {
		b, err := dev.AllocHost(StageChunkBytes)
		if err != nil {
			s.free()
			return nil, err
		}
		s.bufs[i] = b
	}
	err := dev.Do(func(c *cuda.Ctx) error {
		for i := range s.events {
			e, err := c.NewEvent()
			if err != nil {
				return err
			}
			s.events[i] = e
		}
		return nil
	})
	if err != nil {
		s.free()
		return nil, err
	}
	return s, nil
}

func (s *Stager) free() {
	s.dev.Do(func(c *cuda.Ctx) error {
		c.SyncStream(s.stream)
		for _, e := range s.events {
			c.DestroyEvent(e)
		}
		return nil
	})
	for _, b := range s.bufs {
		b.Free()
	}
	s.dq.free()
}

// buffer returns the next staging buffer once its previous copy is done.
func (s *Stager) buffer() (int, []byte, error) {
	i := s.next
	s.next = 1 - s.next
	if s.used[i] {
		if err := s.dev.Do(func(c *cuda.Ctx) error { return c.SyncEvent(s.events[i]) }); err != nil {
			return 0, nil, err
		}
	}
	return i, s.bufs[i].Bytes(), nil
}

// send queues the copy of n staged bytes of buffer i to dst.
func (s *Stager) send(i int, dst cuda.DevicePtr, n int) error {
	s.used[i] = true
	return s.dev.Do(func(c *cuda.Ctx) error {
		if err := c.CopyHtoDAsync(dst, s.bufs[i], 0, n, s.stream); err != nil {
			return err
		}
		return c.Record(s.events[i], s.stream)
	})
}

// copyTensor queues the upload of tensor t to dst: its raw bytes, or, when
// decode is set, its values decoded to float32 (dtypes the kernels do not
// take). The copies complete in stream order; wait() waits for them.
func (s *Stager) copyTensor(dst cuda.DevicePtr, t *checkpoint.Tensor, decode bool) error {
	size := int64(t.DType.Size())
	if size == 0 {
		return fmt.Errorf("%s: tensor %s has unknown dtype %s", t.File, t.Name, t.DType)
	}
	total := t.NumElements()
	if s.rec != nil {
		defer s.rec.add(t, decode, total*size, time.Now())
	}
	return s.copyElems(dst, t, 0, total, decode)
}

// copyElems queues the upload of elements [from, to) of tensor t to dst
// (copyTensor without the record).
func (s *Stager) copyElems(dst cuda.DevicePtr, t *checkpoint.Tensor, from, to int64, decode bool) error {
	size := int64(t.DType.Size())
	per := int64(StageChunkBytes) / size
	if decode {
		per = StageChunkBytes / 4
	}
	var out int64
	for off := from; off < to; off += per {
		n := min(per, to-off)
		i, buf, err := s.buffer()
		if err != nil {
			return err
		}
		if !decode {
			if err := tensorbytes.ReadAt(t, buf[:n*size], off*size); err != nil {
				return err
			}
			if err := tensorbytes.CheckFinite(t.File, t.Name, t.DType, buf[:n*size], off); err != nil {
				return err
			}
			if err := s.send(i, s.at(dst, out, n*size), int(n*size)); err != nil {
				return err
			}
			out += n * size
			continue
		}
		if int64(cap(s.raw)) < n*size {
			s.raw = make([]byte, n*size)
		}
		raw := s.raw[:n*size]
		if err := tensorbytes.ReadAt(t, raw, off*size); err != nil {
			return err
		}
		if err := tensorbytes.CheckFinite(t.File, t.Name, t.DType, raw, off); err != nil {
			return err
		}
		f := unsafe.Slice((*float32)(unsafe.Pointer(&buf[0])), n)
		if err := cpuref.Decode(t.DType, raw, f); err != nil {
			return fmt.Errorf("%s: tensor %s: %w", t.File, t.Name, err)
		}
		if err := s.send(i, s.at(dst, out, n*4), int(n*4)); err != nil {
			return err
		}
		out += n * 4
	}
	return nil
}

// at is where n bytes at offset out of a tensor go: dst + out, or, with
// a ring, wrapped into its first s.ring bytes (n <= StageChunkBytes <= ring).
func (s *Stager) at(dst cuda.DevicePtr, out, n int64) cuda.DevicePtr {
	if s.ring > 0 {
		if out %= s.ring; out+n > s.ring {
			out = 0
		}
	}
	return dst.Add(int(out))
}

// wait blocks until every queued copy has reached the device.
func (s *Stager) wait() error {
	if s.rec != nil {
		defer s.rec.addWait(time.Now())
	}
	return s.dev.Do(func(c *cuda.Ctx) error { return c.SyncStream(s.stream) })
}

// matType is how a weight dtype reaches the kernels: bf16, f32 and fp8
// bytes as they are; other float types decoded to f32 on the host.
func matType(t *checkpoint.Tensor) (kernels.MatDType, bool, error) {
	switch t.DType {
	case safetensors.BF16:
		return kernels.MatBF16, false, nil
	case safetensors.F32:
		return kernels.MatF32, false, nil
	case safetensors.F8E4M3:
		return kernels.MatFP8, false, nil
	}
	if cpuref.Decodable(t.DType) && t.DType.Size() > 0 {
		return kernels.MatF32, true, nil
	}
	return 0, false, fmt.Errorf("%s: tensor %s has dtype %s, which the GPU path cannot use", t.File, t.Name, t.DType)
}

// Bank is an ExpertBank whose device memory this package owns.
type Bank struct {
	kernels.ExpertBank
	bytes []*cuda.Buffer[uint8]
	f32   []*cuda.Buffer[float32]
	Size  int64 // device bytes
}

// Free releases the bank's device memory (nil: nothing).
func (b *Bank) Free() {
	if b == nil {
		return
	}
	for _, x := range b.bytes {
		x.Free()
	}
	for _, x := range b.f32 {
		x.Free()
	}
	b.bytes, b.f32 = nil, nil
}

// weight allocates device memory for tensor t (shape checked against want)
// and queues its upload; the Mat has the bank's dtype.
func (b *Bank) weight(s *Stager, src cpuref.TensorSource, name string, want []int64) (kernels.Mat, error) {
	t, err := tensorShaped(src, name, want)
	if err != nil {
		return kernels.Mat{}, err
	}
	dt, decode, err := matType(t)
	if err != nil {
		return kernels.Mat{}, err
	}
	if b.DType == 0 {
		b.DType = dt
	} else if b.DType != dt {
		return kernels.Mat{}, fmt.Errorf("%s: tensor %s is %s, the bank's other weights %v", t.File, name, t.DType, b.DType)
	}
	n := t.NumElements()
	es := int64(4)
	switch dt {
	case kernels.MatBF16:
		es = 2
	case kernels.MatFP8:
		es = 1
	}
	if n > math.MaxInt/es {
		return kernels.Mat{}, fmt.Errorf("%s: tensor %s is too large", t.File, name)
	}
	buf, err := cuda.Alloc[uint8](s.dev, int(n*es))
	if err != nil {
		return kernels.Mat{}, fmt.Errorf("tensor %s: %w", name, err)
	}
	b.bytes = append(b.bytes, buf)
	b.Size += n * es
	if err := s.copyTensor(buf.Ptr(), t, decode); err != nil {
		return kernels.Mat{}, err
	}
	return kernels.Mat{DType: dt, Ptr: buf.Ptr(), Len: int(n)}, nil
}

// scale allocates and queues an F32 block-scale tensor of shape want.
func (b *Bank) scale(s *Stager, src cpuref.TensorSource, name string, want []int64, dtype safetensors.DType) (*cuda.Buffer[float32], error) {
	t, err := tensorShaped(src, name, want)
	if err != nil {
		return nil, err
	}
	if dtype != "" && dtype != safetensors.F32 {
		return b.widenedScale(s, t, dtype)
	}
	if t.DType != safetensors.F32 {
		return nil, fmt.Errorf("%s: scale %s is %s, want F32", t.File, name, t.DType)
	}
	buf, err := cuda.Alloc[float32](s.dev, int(t.NumElements()))
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", name, err)
	}
	b.f32 = append(b.f32, buf)
	b.Size += int64(buf.Bytes())
	return buf, s.copyTensor(buf.Ptr(), t, false)
}

// widenedScale uploads FP8 block scale grid t, stored as dtype (E8M0:
// F8_E8M0 or its U8 bytes, DeepSeek-V4's official x.scale), as the F32
// the kernels read: each entry 2^(e-127), exact in float32. The grid is
// one entry per 128x128 block, small enough to widen on the host.
func (b *Bank) widenedScale(s *Stager, t *checkpoint.Tensor, dtype safetensors.DType) (*cuda.Buffer[float32], error) {
	if t.DType != dtype || !scaleWidens(dtype) {
		return nil, fmt.Errorf("%s: scale %s is %s, want %s", t.File, t.Name, t.DType, dtype)
	}
	raw, err := t.ReadAll()
	if err != nil {
		return nil, err
	}
	vals := make([]float32, t.NumElements())
	if err := weightfmt.Decode(safetensors.F8E8M0, raw, vals); err != nil { // U8: the same bytes
		return nil, fmt.Errorf("%s: scale %s: %w", t.File, t.Name, err)
	}
	buf, err := cuda.FromHost(s.dev, vals)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", t.Name, err)
	}
	b.f32 = append(b.f32, buf)
	b.Size += int64(buf.Bytes())
	return buf, nil
}

func tensorShaped(src cpuref.TensorSource, name string, want []int64) (*checkpoint.Tensor, error) {
	t, ok := src.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("tensor %s is missing", name)
	}
	same := len(t.Shape) == len(want)
	for i := range want {
		same = same && t.Shape[i] == want[i]
	}
	if !same {
		return nil, fmt.Errorf("%s: tensor %s has shape %v, want %v", t.File, name, t.Shape, want)
	}
	return t, nil
}
