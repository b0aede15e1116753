package weightfmt

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
)

// Dequantising a quantised weight into a plain dtype (convert --dtype): the
// weight's exact float32 dequantisation (its format's Dequantise, as
// DequantiseWeight gives it), each value then rounded ONCE to nearest even
// in the target dtype (numfmt's encoders, torch's casts). F32 is the
// dequantisation itself, unrounded. Nothing rounds twice: the float32 values
// are never rounded to anything in between.

// Dequantisable reports whether d is a dtype quantised weights can be
// dequantised into: BF16, F16 or F32.
func Dequantisable(d safetensors.DType) bool {
	return d == safetensors.BF16 || d == safetensors.F16 || d == safetensors.F32
}

// Rounding rules, as a moeprep contract records them.
const (
	// RoundNearestEven: the exact float32 value rounded once to nearest,
	// ties to even (BF16, F16).
	RoundNearestEven = "nearest-even"
	// RoundExact: the exact float32 value itself (F32).
	RoundExact = "exact"
)

// RoundingOf is the rounding that dequantising into d applies.
func RoundingOf(d safetensors.DType) string {
	if d == safetensors.F32 {
		return RoundExact
	}
	return RoundNearestEven
}

// RowUnit is the number of rows a scale entry spans, so that a piece of the
// weight to dequantise on its own must start on a multiple of it: the scale
// block's rows, 1 where each row has its own scales or one scale covers the
// whole weight (any rows of it share that one entry).
func (m Matrix) RowUnit() int64 {
	s, ok := m.Format.Scale()
	if !ok || s.Block[0] <= 1 {
		return 1
	}
	return s.Block[0]
}

// RowSource hands DequantRows the stored bytes of one weight (a Matrix):
// its weight bytes and its scale grid's bytes as row-major streams (byte
// off of the stream), and its one global scale entry.
type RowSource interface {
	ReadWeight(b []byte, off int64) error
	ReadScale(b []byte, off int64) error
	ReadGlobal(b []byte) error
}

// Dequantiser dequantises rows of weights into a plain dtype, reusing its
// buffers from call to call: its memory is that of one group of rows
// (dequantGroupElems values, or one scale block of rows where that is
// more), whatever the weight's size.
type Dequantiser struct {
	raw, scale, global []byte
	vals               []float32
}

// dequantGroupElems is how many values DequantRows decodes per call of the
// format's Dequantise, in whole scale blocks of rows: enough that the
// per-call setup (NVFP4's 4096-entry table, FP8's scale decode) is noise,
// few enough that the float32 buffer stays at 1 MiB.
const dequantGroupElems = 1 << 18

// OverflowError is a finite dequantised value that the target dtype cannot
// hold: rounding gave an infinity (F16 above 65504).
type OverflowError struct {
	Row, Col int64
	Value    float32
	To       safetensors.DType
}

func (e *OverflowError) Error() string {
	return fmt.Sprintf("dequantised value %g at row %d, column %d overflows %s", e.Value, e.Row, e.Col, e.To)
}

// DequantRows dequantises rows [r0, r0+n) of m, read from src, and writes
// each value as the dtype to (Dequantisable) to out, little-endian:
// n*m.Cols*to.Size() bytes. r0 must be a multiple of m.RowUnit() (a piece
// that starts on a scale block). It returns an *OverflowError for a finite
// value that rounds to an infinity; NaN and infinities stay what they are.
func (d *Dequantiser) DequantRows(m Matrix, src RowSource, r0, n int64, to safetensors.DType, out []byte) error {
	if !Dequantisable(to) {
		return fmt.Errorf("dequantising %s weights to %s: want BF16, F16 or F32", m.Format, to)
	}
	unit := m.RowUnit()
	es := int64(to.Size())
	switch {
	case m.Rows < 0 || m.Cols < 0 || r0 < 0 || n < 0 || r0 > m.Rows || n > m.Rows-r0:
		return fmt.Errorf("dequantising rows %d..%d of a %dx%d %s weight", r0, r0+n, m.Rows, m.Cols, m.Format)
	case r0%unit != 0:
		return fmt.Errorf("dequantising from row %d of a %s weight: not on a %d-row scale block", r0, m.Format, unit)
	case product(n, m.Cols, es) != int64(len(out)):
		return fmt.Errorf("dequantising %d rows of %d columns to %s: %d output bytes", n, m.Cols, to, len(out))
	}
	if n == 0 || m.Cols == 0 {
		return nil
	}
	group := unit
	if per := product(unit, m.Cols); per > 0 && per < dequantGroupElems {
		group = unit * (dequantGroupElems / per)
	}
	var global []byte
	if gb := m.GlobalBytes(); gb > 0 {
		d.global = grow(d.global, gb)
		global = d.global
		if err := src.ReadGlobal(global); err != nil {
			return err
		}
	}
	for r := r0; r < r0+n; r += group {
		gn := min(group, r0+n-r)
		sl := m.RowBlock(r, gn)
		d.raw = grow(d.raw, sl.Weight.Size())
		if err := src.ReadWeight(d.raw, sl.Weight.Off); err != nil {
			return err
		}
		var scale []byte
		if sl.Scale.Size() > 0 {
			d.scale = grow(d.scale, sl.Scale.Size())
			scale = d.scale
			if err := src.ReadScale(scale, sl.Scale.Off); err != nil {
				return err
			}
		}
		vals := product(gn, m.Cols)
		if int64(cap(d.vals)) < vals {
			d.vals = make([]float32, vals)
		}
		d.vals = d.vals[:vals]
		if err := DequantiseWeight(m.Format, d.raw, int(gn), int(m.Cols), scale, global, d.vals); err != nil {
			return err
		}
		o := out[(r-r0)*m.Cols*es : (r-r0+gn)*m.Cols*es]
		if i := Encode(to, d.vals, o); i >= 0 {
			return &OverflowError{Row: r + int64(i)/m.Cols, Col: int64(i) % m.Cols, Value: d.vals[i], To: to}
		}
	}
	return nil
}

// grow is b resized to n bytes, reallocated only when it is too small.
func grow(b []byte, n int64) []byte {
	if int64(cap(b)) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// Encode writes each value of vals as dtype to (BF16, F16: rounded once to
// nearest even; F32: as it is) to out, little-endian, len(vals)*to.Size()
// bytes. It returns the index of the first finite value that rounded to an
// infinity, -1 when none did.
func Encode(to safetensors.DType, vals []float32, out []byte) int {
	switch to {
	case safetensors.F32:
		out = out[:4*len(vals)]
		for i, v := range vals {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		}
		return -1
	case safetensors.BF16:
		return encode16(vals, out, numfmt.F32ToBF16, 0x7f80)
	case safetensors.F16:
		return encode16(vals, out, numfmt.F32ToF16, 0x7c00)
	}
	panic("weightfmt.Encode: dtype " + string(to))
}

// encode16 encodes vals through enc, whose infinity has the exponent bits
// inf, and finds the first finite value that overflowed.
func encode16(vals []float32, out []byte, enc func(float32) uint16, inf uint16) int {
	out = out[:2*len(vals)]
	over := -1
	for i, v := range vals {
		h := enc(v)
		binary.LittleEndian.PutUint16(out[2*i:], h)
		if h&0x7fff == inf && over < 0 && !math.IsInf(float64(v), 0) && v == v {
			over = i
		}
	}
	return over
}
