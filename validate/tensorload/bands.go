package tensorload

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/tensorbytes"

	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/weightfmt"
)

// Bands is one weight as read and checked, kept as its stored bytes (lent
// by a streamed pass, or read) and decoded a band of rows at a time
// (moe.Weight): the products hold a band of float32 at once instead of the
// whole matrix, four times its bf16 bytes and eight times its FP8 ones.
// Each band decodes to the values the whole matrix decodes to (a band
// starts on a scale block).
type Bands struct {
	in         decodeInputs
	f          weightfmt.Format
	rows, cols int
	where      string // "FILE: tensor NAME", for errors
	// lazy, where set, is where the weight's elements lie: in.raw is then
	// nil and each band reads its own elements (a large weight, whose
	// bytes a streamed pass holds in parts: see LazyBytes).
	lazy *lazyRows
	// folded is MatrixRef.Folded: the factor ScaledRows looks for.
	folded float64
}

// lazyRows locates a weight's elements: tensor t from element off.
type lazyRows struct {
	t   *checkpoint.Tensor
	off int64
}

// LazyBytes is the stored size from which a weight's bands each read their
// own bytes, checked and reported consumed (tensorbytes.Consumed) as they
// go, instead of the weight reading and checking them all when it is
// loaded. A streamed pass that cuts a large expert into parts (validate's
// pass plan, above the same size) then holds a few parts of it at a time,
// whatever the expert's size; smaller weights are read whole, as before.
// Tests shrink it.
var LazyBytes int64 = 16 << 20

var _ moe.Weight = (*Bands)(nil)

// Band is the rows of the format's scale blocks (1 without a scale, or
// where one scale entry spans every row).
func (w *Bands) Band() int {
	if sc, ok := w.f.Scale(); ok && sc.Block[0] > 1 {
		return int(sc.Block[0])
	}
	return 1
}

// Rows decodes rows [r0, r1) into dst [(r1-r0)*cols]; r0 must start a band.
func (w *Bands) Rows(r0, r1 int, dst []float32) error {
	if r0 < 0 || r1 > w.rows || r0 > r1 || r0%w.Band() != 0 || len(dst) != (r1-r0)*w.cols {
		return fmt.Errorf("%s: rows %d..%d of %d (bands of %d) into %d values", w.where, r0, r1, w.rows, w.Band(), len(dst))
	}
	m := weightfmt.Matrix{Format: w.f, Rows: int64(w.rows), Cols: int64(w.cols)}
	rb := m.RowBlock(int64(r0), int64(r1-r0))
	var raw []byte
	if lz := w.lazy; lz != nil {
		es := int64(lz.t.DType.Size())
		b, done, err := readChecked(lz.t, lz.off+rb.Weight.Off/es, rb.Weight.Size()/es)
		if err != nil {
			return err
		}
		defer tensorbytes.Consumed(lz.t, lz.off*es+rb.Weight.Off, rb.Weight.Size())
		defer done()
		raw = b
	} else {
		raw = w.in.raw[rb.Weight.Off : rb.Weight.Off+rb.Weight.Size()]
	}
	var scale []byte
	if _, ok := w.f.Scale(); ok {
		scale = w.in.scale[rb.Scale.Off : rb.Scale.Off+rb.Scale.Size()]
	}
	if err := weightfmt.DequantiseWeight(w.f, raw, r1-r0, w.cols, scale, w.in.global, dst); err != nil {
		return fmt.Errorf("%s: %w", w.where, err)
	}
	return nil
}

// SameRows reports whether rows [r0, r1) of w decode to the values o's
// do: o is a Bands of the same shape and format, and the rows' stored
// bytes, scale entries and global scale are the same (DST's copy of SRC's
// expert). w's bytes of those rows are then reported consumed, as Rows
// would; they need no NaN scan, being o's, which Rows scanned.
func (w *Bands) SameRows(o moe.Weight, r0, r1 int) bool {
	ob, rb, ok := w.pairedBlock(o, r0, r1)
	if !ok {
		return false
	}
	if _, ok := w.f.Scale(); ok {
		if !bytes.Equal(w.scaleOf(rb), ob.scaleOf(rb)) || !bytes.Equal(w.in.global, ob.in.global) {
			return false
		}
	}
	return w.sameElems(ob, rb)
}

// ScaledRows reports whether rows [r0, r1) of w are o's with w's folded
// factor (MatrixRef.Folded) folded into their scales as convert folds
// routed_scaling_factor (weightfmt.FoldInPlace): o a Bands of the same
// shape and format, whose scales are float32; the rows' stored elements
// and global scale the same bytes; each of w's scale entries o's, finite,
// times the factor rounded once to float32. Each of w's values is then
// o's times the factor to within 3u of it (u = 2^-24: the scale's
// rounding and each value's own, w's and o's), and so is w's product by
// any token to within 3u of the products' magnitudes: a paired run takes
// it so (moe.ScaledRows). w's bytes of those rows are reported
// consumed, as SameRows reports them.
func (w *Bands) ScaledRows(o moe.Weight, r0, r1 int) (float64, bool) {
	if w.folded == 0 || math.IsNaN(w.folded) || math.IsInf(w.folded, 0) {
		return 0, false
	}
	if sc, ok := w.f.Scale(); !ok || sc.DType != safetensors.F32 {
		return 0, false
	}
	ob, rb, ok := w.pairedBlock(o, r0, r1)
	if !ok || !bytes.Equal(w.in.global, ob.in.global) {
		return 0, false
	}
	mine, theirs := w.scaleOf(rb), ob.scaleOf(rb)
	if len(mine) != len(theirs) {
		return 0, false
	}
	for i := 0; i+4 <= len(mine); i += 4 {
		s := float64(math.Float32frombits(binary.LittleEndian.Uint32(theirs[i:])))
		y := weightfmt.FoldF32(s, w.folded)
		if !foldedWithin(s, y) || math.Float32bits(y) != binary.LittleEndian.Uint32(mine[i:]) {
			return 0, false
		}
	}
	if !w.sameElems(ob, rb) {
		return 0, false
	}
	return w.folded, true
}

// foldedWithin reports whether y, scale s folded and rounded to float32,
// is within half an ulp of the exact product relative to it: s finite and
// y zero (s zero) or a finite normal float32. A product that overflows or
// falls among the subnormals is rounded coarser (or is not a number), and
// its scale's product no longer follows o's.
func foldedWithin(s float64, y float32) bool {
	if math.IsNaN(s) || math.IsInf(s, 0) {
		return false
	}
	a := math.Abs(float64(y))
	return (s == 0 && y == 0) || (a >= 0x1p-126 && a <= math.MaxFloat32)
}

// pairedBlock is o as a Bands of w's shape and format, and the row block
// of rows [r0, r1), which must start a band.
func (w *Bands) pairedBlock(o moe.Weight, r0, r1 int) (*Bands, weightfmt.Slice, bool) {
	ob, ok := o.(*Bands)
	if !ok || ob.rows != w.rows || ob.cols != w.cols || !sameFormat(w.f, ob.f) || r0%w.Band() != 0 {
		return nil, weightfmt.Slice{}, false
	}
	m := weightfmt.Matrix{Format: w.f, Rows: int64(w.rows), Cols: int64(w.cols)}
	return ob, m.RowBlock(int64(r0), int64(r1-r0)), true
}

// scaleOf is w's scale entries of row block rb.
func (w *Bands) scaleOf(rb weightfmt.Slice) []byte {
	return w.in.scale[rb.Scale.Off : rb.Scale.Off+rb.Scale.Size()]
}

// sameElems reports whether w's and o's stored elements of row block rb
// are the same bytes, and where they are, reports w's consumed (a lazy
// weight's).
func (w *Bands) sameElems(o *Bands, rb weightfmt.Slice) bool {
	mine, done, err := w.raw(rb)
	if err != nil {
		return false
	}
	defer done()
	theirs, done2, err := o.raw(rb)
	if err != nil {
		return false
	}
	defer done2()
	if !bytes.Equal(mine, theirs) {
		return false
	}
	if lz := w.lazy; lz != nil {
		tensorbytes.Consumed(lz.t, lz.off*int64(lz.t.DType.Size())+rb.Weight.Off, rb.Weight.Size())
	}
	return true
}

// raw is the stored bytes of a row block, unchecked: lent or read for a
// lazy weight (done hands them back), else a slice of the weight's own.
func (w *Bands) raw(rb weightfmt.Slice) ([]byte, func(), error) {
	if lz := w.lazy; lz != nil {
		es := int64(lz.t.DType.Size())
		return readRaw(lz.t, lz.off+rb.Weight.Off/es, rb.Weight.Size()/es)
	}
	return w.in.raw[rb.Weight.Off : rb.Weight.Off+rb.Weight.Size()], func() {}, nil
}

// sameFormat reports whether two formats are one (formats are values; one
// that cannot be compared is taken as different).
func sameFormat(a, b weightfmt.Format) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta != nil && ta.Comparable() && a == b
}

// LoadBands reads and checks one weight as LoadMatrix does, keeping its
// stored bytes to decode a band at a time; Release hands them back.
//
// SRC's expert and DST's copy of it each load and decode their own
// bands: telling that their bytes are the same (to decode once for both,
// as the paths did while they decoded whole matrices) costs a comparison
// of every byte, more than the bands' decode it would save.
func LoadBands(src TensorSource, m MatrixRef) (*Bands, error) { return readWeight(src, m) }

// Release hands the weight's bytes back (to the streamed pass that lent
// them, or the pool); a nil w is nothing.
func (w *Bands) Release() {
	if w != nil {
		w.in.release()
	}
}

// ReleaseExpert hands a bank expert's weights back once the grouped GEMM
// is done with it: banded ones to their bytes' owners, whole ones to the
// pool.
func ReleaseExpert(m *moe.ExpertMats) {
	for _, d := range []*[]float32{&m.Gate, &m.Up, &m.Down} {
		if *d != nil {
			PutFloats(*d)
		}
		*d = nil
	}
	for _, w := range []*moe.Weight{&m.GateW, &m.UpW, &m.DownW} {
		if b, ok := (*w).(*Bands); ok {
			b.Release()
		}
		*w = nil
	}
}
