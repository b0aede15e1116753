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

// MemRows is a RowSource over bytes in memory: a weight's (or a piece's)
// stored bytes, its scale grid's and its global scale's.
type MemRows struct{ Raw, Scale, Global []byte }

func (m MemRows) ReadWeight(b []byte, off int64) error { return readMem("weight", m.Raw, b, off) }
func (m MemRows) ReadScale(b []byte, off int64) error  { return readMem("scale", m.Scale, b, off) }
func (m MemRows) ReadGlobal(b []byte) error            { return readMem("global scale", m.Global, b, 0) }

func readMem(what string, src, b []byte, off int64) error {
	if off < 0 || off > int64(len(src)) || int64(len(b)) > int64(len(src))-off {
		return fmt.Errorf("reading %d %s bytes at %d of %d", len(b), what, off, len(src))
	}
	copy(b, src[off:])
	return nil
}

// Dequantiser dequantises rows of weights into a plain dtype, reusing its
// buffers from call to call: its memory is that of one group of rows
// (dequantGroupElems values, or one scale block of rows where that is
// more), whatever the weight's size.
type Dequantiser struct {
	// Reference turns off the fast path of the FP8 formats (a table of
	// encoded values per scale entry, no float32 in between), so that
	// every value goes through the format's Dequantise and Encode: the
	// byte proof predicts with it what convert wrote with the fast path.
	Reference bool

	raw, scale, global []byte
	vals               []float32
}

// e4m3Scaled is what the FP8 formats implement: a weight of E4M3 bytes,
// the element (r, c) scaled by entry [r/bo][c/bi] of a float32 grid.
type e4m3Scaled interface {
	e4m3Grid(rows, cols int, scale []byte) (s []float32, bo, bi int, err error)
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
		o := out[(r-r0)*m.Cols*es : (r-r0+gn)*m.Cols*es]
		if f, ok := m.Format.(e4m3Scaled); ok && !d.Reference {
			s, bo, bi, err := f.e4m3Grid(int(gn), int(m.Cols), scale)
			if err != nil {
				return err
			}
			done, err := encodeE4M3(d.raw, int(gn), int(m.Cols), s, bo, bi, to, o)
			if err != nil {
				return err
			}
			if done {
				continue
			}
			// A value overflows: the general path says which.
		}
		vals := product(gn, m.Cols)
		if int64(cap(d.vals)) < vals {
			d.vals = make([]float32, vals)
		}
		d.vals = d.vals[:vals]
		if err := DequantiseWeight(m.Format, d.raw, int(gn), int(m.Cols), scale, global, d.vals); err != nil {
			return err
		}
		if i := Encode(to, d.vals, o); i >= 0 {
			return &OverflowError{Row: r + int64(i)/m.Cols, Col: int64(i) % m.Cols, Value: d.vals[i], To: to}
		}
	}
	return nil
}

// encodeE4M3 writes the rows x cols E4M3 weight src, element (r, c)
// scaled by s[r/bo][c/bi], as dtype to into out: for each scale entry the
// 256 values its bytes can take, dequantised as DequantE4M3 does
// (E4M3 value times the scale, rounded to float32) and encoded as Encode
// does, then one lookup an element: the same bits as DequantE4M3 and
// Encode, without the float32 values in between (the most of --dtype's
// CPU time for FP8 checkpoints). done is false, and out not all written,
// when some value would overflow to: the caller takes the general path,
// which reports it.
func encodeE4M3(src []byte, rows, cols int, s []float32, bo, bi int, to safetensors.DType, out []byte) (done bool, err error) {
	if bo <= 0 || bi <= 0 || rows < 0 || cols < 0 || (cols > 0 && rows > math.MaxInt/cols) || len(src) != rows*cols || len(out) != rows*cols*to.Size() {
		return false, fmt.Errorf("fp8 dequant: %d bytes, %d output bytes for a %dx%d weight", len(src), len(out), rows, cols)
	}
	sr, sc := (rows+bo-1)/bo, (cols+bi-1)/bi
	if len(s) != sr*sc {
		return false, fmt.Errorf("fp8 dequant: %d scales for a %dx%d weight, want %dx%d", len(s), rows, cols, sr, sc)
	}
	es := to.Size()
	var vals [256]float32
	var tab16 [256]uint16
	var tab32 [256]uint32
	for br := range sr {
		r0, r1 := br*bo, min((br+1)*bo, rows)
		for bc := range sc {
			c0, c1 := bc*bi, min((bc+1)*bi, cols)
			for i := range vals {
				vals[i] = numfmt.E4M3ToF32(byte(i)) * s[br*sc+bc]
			}
			switch to {
			case safetensors.F32:
				for i, v := range vals {
					tab32[i] = math.Float32bits(v)
				}
			default:
				var enc [512]byte
				if Encode(to, vals[:], enc[:]) >= 0 {
					return false, nil
				}
				for i := range tab16 {
					tab16[i] = binary.LittleEndian.Uint16(enc[2*i:])
				}
			}
			for r := r0; r < r1; r++ {
				row := src[r*cols+c0 : r*cols+c1]
				o := out[(r*cols+c0)*es : (r*cols+c1)*es]
				if es == 4 {
					o = o[:4*len(row)]
					for i, b := range row {
						binary.LittleEndian.PutUint32(o[4*i:], tab32[b])
					}
					continue
				}
				o = o[:2*len(row)]
				n := len(row) &^ 3
				for i := 0; i < n; i += 4 { // four values a store
					x := row[i : i+4 : i+4]
					binary.LittleEndian.PutUint64(o[2*i:], uint64(tab16[x[0]])|uint64(tab16[x[1]])<<16|uint64(tab16[x[2]])<<32|uint64(tab16[x[3]])<<48)
				}
				for i := n; i < len(row); i++ {
					binary.LittleEndian.PutUint16(o[2*i:], tab16[row[i]])
				}
			}
		}
	}
	return true, nil
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
	case safetensors.BF16, safetensors.F16:
		return encode16(vals, out, to == safetensors.F16)
	}
	panic("weightfmt.Encode: dtype " + string(to))
}

// encode16 encodes vals as bf16, or f16, into out and returns the index of
// the first finite value that overflowed (-1: none). The encoders are
// called directly, so that they inline (a function value would cost a
// call an element); the dtype is a branch the loop predicts.
func encode16(vals []float32, out []byte, f16 bool) int {
	out = out[:2*len(vals)]
	inf := uint16(0x7f80)
	if f16 {
		inf = 0x7c00
	}
	over := -1
	for i, v := range vals {
		var h uint16
		if f16 {
			h = numfmt.F32ToF16(v)
		} else {
			h = numfmt.F32ToBF16(v)
		}
		binary.LittleEndian.PutUint16(out[2*i:], h)
		if h&0x7fff == inf && over < 0 {
			over = overflowed(v, i)
		}
	}
	return over
}

// overflowed is i when v, which encoded as an infinity, was finite, and -1
// when it was an infinity itself.
func overflowed(v float32, i int) int {
	if math.IsInf(float64(v), 0) {
		return -1
	}
	return i
}
