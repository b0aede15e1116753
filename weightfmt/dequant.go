package weightfmt

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"

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

// OverflowError is a value computed from finite source values (its code,
// its scale entry, the global scale) that the target dtype cannot hold:
// its float32 dequantisation rounded to an infinity (F16 from 65520, BF16
// from 3.3961775e38: halfway past each one's largest value), or was
// already past float32 (MXFP4's E8M0 254 = 2^127 times FP4 6.0, INT4's
// largest bf16 scale times -8). An infinity written for a finite weight
// would be a wrong model that nothing downstream notices. Value is the
// exact value, in float64 because it may be past float32's range; NaN
// where the format's float32 steps make a NaN of finite values (NVFP4: a
// zero times a block scale past float32).
type OverflowError struct {
	Row, Col int64
	Value    float64
	To       safetensors.DType
}

func (e *OverflowError) Error() string {
	if math.IsNaN(e.Value) {
		return fmt.Sprintf("dequantised value at row %d, column %d is NaN from finite source values (zero times a scale that is not finite in float32): %s cannot hold it",
			e.Row, e.Col, e.To)
	}
	// Shortest digits: a float32's as before (89600, 3.3961775e+38), a
	// value past float32 in float64's.
	bits := 64
	if float64(float32(e.Value)) == e.Value {
		bits = 32
	}
	return fmt.Sprintf("dequantised value %s at row %d, column %d overflows %s", strconv.FormatFloat(e.Value, 'g', -1, bits), e.Row, e.Col, e.To)
}

// exactDequantiser is what every quantised format implements so that
// DequantRows can tell an overflow from an infinity or NaN the source
// holds. Its float32 dequantisation meets a value past float32 as an
// infinity, the same as an infinite scale gives; exactValues tells them
// apart and names the value.
type exactDequantiser interface {
	// exactValues takes a rows x cols piece as DequantiseWeight does and
	// returns a function of an element's row-major index in it: the
	// element's dequantised value computed in float64 (past float32's
	// range), and whether the source values it is computed from are all
	// finite. DequantRows calls it only where the float32 value is not
	// finite, so that its cost (decoding the piece's scales) is paid only
	// there.
	exactValues(raw []byte, rows, cols int, scale, global []byte) (func(i int) (float64, bool), error)
}

// finite32 reports whether v is neither an infinity nor NaN.
func finite32(v float32) bool { return !math.IsInf(float64(v), 0) && !math.IsNaN(float64(v)) }

// dequantE4M3 is Dequantise of the FP8 formats (e4m3Scaled): each E4M3
// value times its scale entry, rounded once to float32 (DequantE4M3).
func dequantE4M3(f e4m3Scaled, raw []byte, rows, cols int, scale []byte, dst []float32) error {
	s, bo, bi, err := f.e4m3Grid(rows, cols, scale)
	if err != nil {
		return err
	}
	return DequantE4M3(raw, rows, cols, s, bo, bi, dst)
}

// exactE4M3 is exactValues of the FP8 formats (e4m3Scaled): the E4M3
// value times its scale entry, exact in float64 (4 bits of significand
// times 24); finite unless the code is E4M3's NaN or the scale is not.
func exactE4M3(f e4m3Scaled, raw []byte, rows, cols int, scale []byte) (func(int) (float64, bool), error) {
	s, bo, bi, err := f.e4m3Grid(rows, cols, scale)
	if err != nil {
		return nil, err
	}
	if bo <= 0 || bi <= 0 || rows < 0 || cols <= 0 || len(raw) != rows*cols || len(s) != ((rows+bo-1)/bo)*((cols+bi-1)/bi) {
		return nil, fmt.Errorf("fp8 dequant: %d bytes, %d scales for a %dx%d weight in %dx%d blocks", len(raw), len(s), rows, cols, bo, bi)
	}
	sc := (cols + bi - 1) / bi
	return func(i int) (float64, bool) {
		e, k := numfmt.E4M3ToF32(raw[i]), s[(i/cols)/bo*sc+(i%cols)/bi]
		return float64(e) * float64(k), finite32(e) && finite32(k)
	}, nil
}

// DequantRows dequantises rows [r0, r0+n) of m, read from src, and writes
// each value as the dtype to (Dequantisable) to out, little-endian:
// n*m.Cols*to.Size() bytes. r0 must be a multiple of m.RowUnit() (a piece
// that starts on a scale block). It returns an *OverflowError for a value
// of finite source values that is not finite in to (rounded to an
// infinity, or past float32 before any rounding); an infinity or NaN that
// the source holds (an infinite scale, E8M0's or E4M3's NaN) stays what
// it is.
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
		first := encode(to, d.vals, o)
		if first < 0 {
			continue
		}
		i, v, err := firstRefused(m.Format, d.raw, int(gn), int(m.Cols), scale, global, d.vals, to, o, first)
		if err != nil {
			return err
		}
		if i >= 0 {
			return &OverflowError{Row: r + int64(i)/m.Cols, Col: int64(i) % m.Cols, Value: v, To: to}
		}
	}
	return nil
}

// firstRefused looks at the values of one group (encoded in out, the first
// that is not finite at from) for the first computed from finite source
// values that is not finite in to: i, its exact value v; i < 0 when every
// one is an infinity or NaN the source holds. Rare, so not fast: the
// format's exactValues is asked only once a float32 value is not finite.
func firstRefused(f Format, raw []byte, rows, cols int, scale, global []byte, vals []float32, to safetensors.DType, out []byte, from int) (i int, v float64, err error) {
	var exact func(int) (float64, bool)
	for i := from; i >= 0; i = nonFinite(to, out, i+1) {
		if finite32(vals[i]) {
			return i, float64(vals[i]), nil // rounding took it past to's largest value
		}
		if exact == nil {
			ed, ok := f.(exactDequantiser)
			if !ok {
				return -1, 0, nil // a format that cannot tell (plain): as it is
			}
			if exact, err = ed.exactValues(raw, rows, cols, scale, global); err != nil {
				return -1, 0, err
			}
		}
		if x, ok := exact(i); ok {
			return i, x, nil
		}
	}
	return -1, 0, nil
}

// encodeE4M3 writes the rows x cols E4M3 weight src, element (r, c)
// scaled by s[r/bo][c/bi], as dtype to into out: for each scale entry the
// 256 values its bytes can take, dequantised as DequantE4M3 does
// (E4M3 value times the scale, rounded to float32) and encoded as Encode
// does, then one lookup an element: the same bits as DequantE4M3 and
// Encode, without the float32 values in between (the most of --dtype's
// CPU time for FP8 checkpoints). done is false, and out not all written,
// when some value would overflow to or float32: the caller takes the
// general path, which reports it.
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
	var enc [256 * 4]byte // vals encoded: 256*es bytes
	var tab16 [256]uint16
	var tab32 [256]uint32
	for br := range sr {
		r0, r1 := br*bo, min((br+1)*bo, rows)
		for bc := range sc {
			c0, c1 := bc*bi, min((bc+1)*bi, cols)
			k := s[br*sc+bc]
			e4m3Times(&vals, k)
			encode(to, vals[:], enc[:256*es])
			// Code 0x7e is E4M3's largest magnitude (448; 0xfe the same,
			// negative), and rounding is monotonic: with a finite scale,
			// some value is past float32 or past to exactly when 448*k
			// encodes as an infinity. One check a scale entry, not a scan
			// past the NaN codes (0x7f, 0xff).
			if finite32(k) && nonFinite(to, enc[:256*es], 0x7e) == 0x7e {
				return false, nil
			}
			if es == 4 {
				for i := range tab32 {
					tab32[i] = binary.LittleEndian.Uint32(enc[4*i:])
				}
			} else {
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
	for i := encode(to, vals, out); i >= 0; i = nonFinite(to, out, i+1) {
		if finite32(vals[i]) {
			return i
		}
	}
	return -1
}

// encode is Encode, returning the index of the first value whose encoding
// is not finite (an infinity or NaN, whatever the value was), -1 when
// none is: one comparison an element finds where the rare path
// (DequantRows' refusal, Encode's overflow) must look.
func encode(to safetensors.DType, vals []float32, out []byte) int {
	switch to {
	case safetensors.F32:
		return encode32(vals, out)
	case safetensors.BF16, safetensors.F16:
		return encode16(vals, out, to == safetensors.F16)
	}
	panic("weightfmt.Encode: dtype " + string(to))
}

// encode32 writes vals as F32 to out and returns the index of the first
// value that is an infinity or NaN (-1: none). Four values a step, their
// exponents ORed without a branch: (u&0x7fffffff)+2^23 sets bit 31 only
// for an all-ones exponent. This is faster than the plain copy it
// replaces, so that --dtype f32 pays nothing for the check; where a value
// is not finite, nonFinite finds the first.
func encode32(vals []float32, out []byte) int {
	out = out[:4*len(vals)]
	const mag, carry = 0x7fffffff, 0x00800000
	var acc uint32
	n := len(vals) &^ 3
	for i := 0; i < n; i += 4 {
		v := vals[i : i+4 : i+4]
		o := out[4*i : 4*i+16 : 4*i+16]
		a, b, c, d := math.Float32bits(v[0]), math.Float32bits(v[1]), math.Float32bits(v[2]), math.Float32bits(v[3])
		binary.LittleEndian.PutUint64(o, uint64(a)|uint64(b)<<32)
		binary.LittleEndian.PutUint64(o[8:], uint64(c)|uint64(d)<<32)
		acc |= (a&mag + carry) | (b&mag + carry) | (c&mag + carry) | (d&mag + carry)
	}
	for i := n; i < len(vals); i++ {
		u := math.Float32bits(vals[i])
		binary.LittleEndian.PutUint32(out[4*i:], u)
		acc |= u&mag + carry
	}
	if acc&0x80000000 == 0 {
		return -1
	}
	return nonFinite(safetensors.F32, out, 0)
}

// encode16 encodes vals as bf16, or f16, into out and returns the index of
// the first value encoded as an infinity or NaN (-1: none). The encoders
// are called directly, so that they inline (a function value would cost a
// call an element); the dtype is a branch the loop predicts.
func encode16(vals []float32, out []byte, f16 bool) int {
	out = out[:2*len(vals)]
	inf := uint16(0x7f80)
	if f16 {
		inf = 0x7c00
	}
	first := -1
	for i, v := range vals {
		var h uint16
		if f16 {
			h = numfmt.F32ToF16(v)
		} else {
			h = numfmt.F32ToBF16(v)
		}
		binary.LittleEndian.PutUint16(out[2*i:], h)
		if h&0x7fff >= inf && first < 0 { // the exponent all ones
			first = i
		}
	}
	return first
}

// nonFinite is the index of the first value at or after i whose encoding
// as to in out is an infinity or NaN, -1 when none is.
func nonFinite(to safetensors.DType, out []byte, i int) int {
	es := to.Size()
	for ; i*es < len(out); i++ {
		var exp bool
		switch to {
		case safetensors.F32:
			exp = binary.LittleEndian.Uint32(out[4*i:])&0x7f800000 == 0x7f800000
		case safetensors.F16:
			exp = binary.LittleEndian.Uint16(out[2*i:])&0x7c00 == 0x7c00
		default:
			exp = binary.LittleEndian.Uint16(out[2*i:])&0x7f80 == 0x7f80
		}
		if exp {
			return i
		}
	}
	return -1
}
