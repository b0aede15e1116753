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
	"github.com/moeprep/moeprep/validate/tensorbytes"
	"github.com/moeprep/moeprep/validate/tensorload"
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
	// decoded is copyTransposed's room for a slice decoded to f32.
	decoded []byte
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
		if err := tensorload.Decode(t.DType, raw, f); err != nil {
			return fmt.Errorf("%s: tensor %s: %w", t.File, t.Name, err)
		}
		if err := s.send(i, s.at(dst, out, n*4), int(n*4)); err != nil {
			return err
		}
		out += n * 4
	}
	return nil
}

// copyTransposed queues the upload of expert x's slice of in-out stack t,
// stored [rows, cols] (in, out), as its out-in transpose [cols, rows] at
// dst: the bytes the kernels take (decoded to f32 on the host first when
// decode). The slice is read whole into host memory (one expert's, the
// unit a streamed pass holds anyway), then transposed a staging buffer of
// output rows at a time.
func (s *Stager) copyTransposed(dst cuda.DevicePtr, t *checkpoint.Tensor, x, rows, cols int64, decode bool) error {
	size := int64(t.DType.Size())
	n := rows * cols
	if size == 0 || rows <= 0 || cols <= 0 || n > math.MaxInt/8 {
		return fmt.Errorf("%s: tensor %s: expert %d of %d x %d cannot be transposed", t.File, t.Name, x, rows, cols)
	}
	if int64(cap(s.raw)) < n*size {
		s.raw = make([]byte, n*size)
	}
	raw := s.raw[:n*size]
	if err := tensorbytes.ReadAt(t, raw, x*n*size); err != nil {
		return err
	}
	if err := tensorbytes.CheckFinite(t.File, t.Name, t.DType, raw, x*n); err != nil {
		return err
	}
	in, es := raw, size
	if decode {
		if int64(cap(s.decoded)) < n*4 {
			s.decoded = make([]byte, n*4)
		}
		in, es = s.decoded[:n*4], 4
		f := unsafe.Slice((*float32)(unsafe.Pointer(&in[0])), n)
		if err := tensorload.Decode(t.DType, raw, f); err != nil {
			return fmt.Errorf("%s: tensor %s: %w", t.File, t.Name, err)
		}
	}
	rowOut := rows * es // bytes of one output row
	if rowOut > StageChunkBytes {
		return fmt.Errorf("%s: tensor %s: a row of %d bytes does not fit a staging buffer", t.File, t.Name, rowOut)
	}
	per := StageChunkBytes / rowOut
	for c0 := int64(0); c0 < cols; c0 += per {
		nc := min(per, cols-c0)
		i, buf, err := s.buffer()
		if err != nil {
			return err
		}
		transposeInto(buf[:nc*rowOut], in, rows, cols, c0, nc, es)
		if err := s.send(i, dst.Add(int(c0*rowOut)), int(nc*rowOut)); err != nil {
			return err
		}
	}
	return nil
}

// transposeInto writes columns [c0, c0+nc) of in, a rows x cols matrix of
// es-byte elements (1, 2 or 4), as the rows of out: out[c-c0][r] =
// in[r][c].
func transposeInto(out, in []byte, rows, cols, c0, nc, es int64) {
	switch es {
	case 1:
		transposeTiles(out, in, rows, cols, c0, nc)
	case 2:
		transposeTiles(asElems[uint16](out), asElems[uint16](in), rows, cols, c0, nc)
	default:
		transposeTiles(asElems[uint32](out), asElems[uint32](in), rows, cols, c0, nc)
	}
}

// asElems views b as elements of T (b's length a multiple of T's size).
func asElems[T uint16 | uint32](b []byte) []T {
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

// transposeTiles is transposeInto for one element type, in 64 x 64 tiles
// that keep both sides in cache.
func transposeTiles[T uint8 | uint16 | uint32](out, in []T, rows, cols, c0, nc int64) {
	const tile = 64
	for r0 := int64(0); r0 < rows; r0 += tile {
		r1 := min(r0+tile, rows)
		for cc := c0; cc < c0+nc; cc += tile {
			cc1 := min(cc+tile, c0+nc)
			for c := cc; c < cc1; c++ {
				o := out[(c-c0)*rows : (c-c0+1)*rows]
				for r := r0; r < r1; r++ {
					o[r] = in[r*cols+c]
				}
			}
		}
	}
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
	if tensorload.Decodable(t.DType) && t.DType.Size() > 0 {
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
func (b *Bank) weight(s *Stager, src tensorload.TensorSource, name string, want []int64) (kernels.Mat, error) {
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
	buf, err := b.alloc(s.dev, t, dt)
	if err != nil {
		return kernels.Mat{}, err
	}
	if err := s.copyTensor(buf.Ptr(), t, decode); err != nil {
		return kernels.Mat{}, err
	}
	return kernels.Mat{DType: dt, Ptr: buf.Ptr(), Len: int(t.NumElements())}, nil
}

// alloc allocates the bank's device memory for weight tensor t as dt.
func (b *Bank) alloc(dev *cuda.Device, t *checkpoint.Tensor, dt kernels.MatDType) (*cuda.Buffer[uint8], error) {
	n := t.NumElements()
	es := int64(4)
	switch dt {
	case kernels.MatBF16:
		es = 2
	case kernels.MatFP8:
		es = 1
	}
	if n > math.MaxInt/es {
		return nil, fmt.Errorf("%s: tensor %s is too large", t.File, t.Name)
	}
	buf, err := cuda.Alloc[uint8](dev, int(n*es))
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", t.Name, err)
	}
	b.bytes = append(b.bytes, buf)
	b.Size += n * es
	return buf, nil
}

// scale allocates and queues an F32 block-scale tensor of shape want.
func (b *Bank) scale(s *Stager, src tensorload.TensorSource, name string, want []int64, dtype safetensors.DType) (*cuda.Buffer[float32], error) {
	t, err := tensorShaped(src, name, want)
	if err != nil {
		return nil, err
	}
	if dtype != "" && dtype != safetensors.F32 {
		return b.widenedScale(s, t, dtype)
	}
	buf, err := b.scaleBuffer(s.dev, t)
	if err != nil {
		return nil, err
	}
	return buf, s.copyTensor(buf.Ptr(), t, false)
}

// scaleBuffer allocates the bank's device memory for F32 scale tensor t.
func (b *Bank) scaleBuffer(dev *cuda.Device, t *checkpoint.Tensor) (*cuda.Buffer[float32], error) {
	if t.DType != safetensors.F32 {
		return nil, fmt.Errorf("%s: scale %s is %s, want F32", t.File, t.Name, t.DType)
	}
	buf, err := cuda.Alloc[float32](dev, int(t.NumElements()))
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", t.Name, err)
	}
	b.f32 = append(b.f32, buf)
	b.Size += int64(buf.Bytes())
	return buf, nil
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

func tensorShaped(src tensorload.TensorSource, name string, want []int64) (*checkpoint.Tensor, error) {
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
