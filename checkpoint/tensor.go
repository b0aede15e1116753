// Package checkpoint opens a hub-layout model directory (safetensors, single
// or sharded, or PyTorch zip .bin files) and presents every tensor through one
// type whose bytes are read on demand, never loaded eagerly.
package checkpoint

import (
	"fmt"
	"io"
	"reflect"
	"sync"

	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// Tensor is one named tensor of a checkpoint. Data yields exactly NumBytes()
// bytes in row-major (C-contiguous) order, whatever the source layout.
type Tensor struct {
	Name  string
	DType safetensors.DType
	Shape []int64
	File  string      // path of the file that holds it, for error messages
	Data  io.ReaderAt // the tensor's bytes, offset 0 is its first byte
	// FileShape is the shape the file stores where Shape was made
	// canonical for readers (an FP8 per-tensor weight_scale stored as a
	// scalar or [1], read as [1,1]): a tensor copied unchanged keeps it.
	// nil when Shape is the file's.
	FileShape []int64
}

// StoredShape is the shape as the file stores it: what a copy writes.
func (t *Tensor) StoredShape() []int64 {
	if t.FileShape != nil {
		return t.FileShape
	}
	return t.Shape
}

// NumElements is the product of Shape (1 for a scalar).
func (t *Tensor) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// NumBytes is the tensor's size in bytes.
func (t *Tensor) NumBytes() int64 { return t.NumElements() * int64(t.DType.Size()) }

// Reader returns a fresh reader over the tensor's bytes.
func (t *Tensor) Reader() *io.SectionReader { return io.NewSectionReader(t.Data, 0, t.NumBytes()) }

// ReadAll reads the whole tensor into memory. Use it only where the caller has
// bounded the size (one expert's weights, a router), never for a whole layer.
func (t *Tensor) ReadAll() ([]byte, error) {
	b := make([]byte, t.NumBytes())
	if _, err := t.Data.ReadAt(b, 0); err != nil && !(err == io.EOF && len(b) == 0) {
		return nil, fmt.Errorf("%s: reading tensor %s: %w", t.File, t.Name, err)
	}
	return b, nil
}

// Requantised is t, a plain 2-D weight (BF16, F16 or F32), quantised into
// format f by the format's own rule (weightfmt.Requant): two tensors that
// hold no bytes of their own, the quantised weight and its scale grid,
// whose Data computes them from t's bytes band by band on each read. They
// are named after f's tensors for t, marked "requantised ", and keep t's
// file for ordering and errors.
func Requantised(t *Tensor, f weightfmt.Format) (weight, scale *Tensor, err error) {
	if len(t.Shape) != 2 {
		return nil, nil, fmt.Errorf("%s: tensor %s has shape %v: only a 2-D weight is requantised", t.File, t.Name, t.Shape)
	}
	q, err := requantOf(t, f)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", t.File, err)
	}
	m := q.Matrix()
	names := weightfmt.TensorsOf(f, t.Name)
	sc, _ := f.Scale()
	gr, gc := m.ScaleShape()
	weight = &Tensor{Name: RequantisedPrefix + names.Weight, DType: f.DType(), Shape: m.Shape(), File: t.File, Data: computedData{q.Weight(), t}}
	scale = &Tensor{Name: RequantisedPrefix + names.Scale, DType: sc.DType, Shape: []int64{gr, gc}, File: t.File, Data: computedData{q.Scale(), t}}
	return weight, scale, nil
}

// computedData reads a tensor computed from the bytes of another, from
// (Requantised's), which it reads through from's reader at the time of
// the read (storedData), as a view does.
type computedData struct {
	io.ReaderAt
	from *Tensor
}

// RequantisedPrefix marks the names of Requantised's tensors.
const RequantisedPrefix = "requantised "

// requantOf is the weightfmt.Requant of t into f, shared by every caller
// that asks for the same tensor in the same format while it is among the
// last few asked for: validate's byte proof and its CPU reference both
// requantise a layer's shared expert (--requantize-shared), at about the
// same time, and one Requant means one band cache entry, so each band is
// quantised once, not once per caller. The bytes are the same either way
// (the rule is deterministic); only the work is shared. Bounded: a few
// entries, whatever the tensor count.
func requantOf(t *Tensor, f weightfmt.Format) (*weightfmt.Requant, error) {
	if !reflect.ValueOf(f).Comparable() {
		return weightfmt.NewRequant(f, t.Name, storedData{t}, t.DType, t.Shape[0], t.Shape[1])
	}
	k := requantKey{t, f}
	recentRequants.Lock()
	defer recentRequants.Unlock()
	for _, e := range recentRequants.e {
		if e.k == k {
			return e.q, nil
		}
	}
	q, err := weightfmt.NewRequant(f, t.Name, storedData{t}, t.DType, t.Shape[0], t.Shape[1])
	if err != nil {
		return nil, err
	}
	recentRequants.e = append(recentRequants.e, requantEntry{k, q})
	if len(recentRequants.e) > recentRequantsMax {
		recentRequants.e = recentRequants.e[1:]
	}
	return q, nil
}

// recentRequantsMax is how many Requants requantOf keeps: a shared
// expert's gate, up and down for a layer or two.
const recentRequantsMax = 8

type requantKey struct {
	t *Tensor
	f weightfmt.Format
}

type requantEntry struct {
	k requantKey
	q *weightfmt.Requant
}

var recentRequants struct {
	sync.Mutex
	e []requantEntry
}
