package tensorbytes

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/safetensors"
)

// NonFiniteError names a NaN or Inf found in a tensor validate read.
type NonFiniteError struct {
	File, Tensor string
	Element      int64 // index within the tensor
	Bits         uint64
	DType        safetensors.DType
}

func (e *NonFiniteError) Error() string {
	return fmt.Sprintf("%s: tensor %s holds a NaN or Inf at element %d (%s bits %#x)", e.File, e.Tensor, e.Element, e.DType, e.Bits)
}

// firstNonFinite returns the index of the first NaN or Inf among the
// little-endian elements of raw, or -1. Integer dtypes have none. FP8
// E4M3 (torch float8_e4m3fn) has no infinity and one NaN pattern per sign,
// S.1111.111; E8M0 scales use 0xFF for NaN.
func FirstNonFinite(d safetensors.DType, raw []byte) (int, uint64) {
	if clean(d, raw) {
		return -1, 0
	}
	return firstNonFiniteSlow(d, raw)
}

func firstNonFiniteSlow(d safetensors.DType, raw []byte) (int, uint64) {
	if f, ok := nonFinite[d]; ok {
		return firstAllSet(raw, f.width, f.mask)
	}
	return -1, 0
}

// nonFinite gives each float dtype's element width in bytes and the bits
// all set in its NaNs and Infs: the exponent, E4M3's one NaN pattern per
// sign (S.1111.111), E8M0's 0xFF.
var nonFinite = map[safetensors.DType]struct {
	width int
	mask  uint64
}{
	safetensors.BF16:   {2, 0x7F80},
	safetensors.F16:    {2, 0x7C00},
	safetensors.F32:    {4, 0x7F800000},
	safetensors.F64:    {8, 0x7FF0000000000000},
	safetensors.F8E4M3: {1, 0x7F},
	safetensors.F8E5M2: {1, 0x7C},
	safetensors.F8E8M0: {1, 0xFF},
}

// firstAllSet returns the index and bits of the first little-endian
// element of raw, width bytes wide, whose mask bits are all set (an
// exponent of all ones), or -1.
func firstAllSet(raw []byte, width int, mask uint64) (int, uint64) {
	for i := 0; i+width <= len(raw); i += width {
		var v uint64
		switch width {
		case 1:
			v = uint64(raw[i])
		case 2:
			v = uint64(binary.LittleEndian.Uint16(raw[i:]))
		case 4:
			v = uint64(binary.LittleEndian.Uint32(raw[i:]))
		default:
			v = binary.LittleEndian.Uint64(raw[i:])
		}
		if v&mask == mask {
			return i / width, v
		}
	}
	return -1, 0
}

// checkFinite returns a *NonFiniteError when raw, the elements of tensor
// name from element off on, holds a NaN or Inf.
func CheckFinite(file, name string, d safetensors.DType, raw []byte, off int64) error {
	if i, bits := FirstNonFinite(d, raw); i >= 0 {
		return &NonFiniteError{File: file, Tensor: name, Element: off + int64(i), Bits: bits, DType: d}
	}
	return nil
}

// clean reports, eight bytes at a time, that raw holds no NaN or Inf of the
// common weight dtypes (false: look element by element). A lane is
// non-finite when its exponent bits are all set: x = (w & m) ^ m has a zero
// lane exactly there, and the classic has-zero test finds it.
func clean(d safetensors.DType, raw []byte) bool {
	var m, lo, hi uint64
	var width int
	switch d {
	case safetensors.BF16:
		m, lo, hi, width = 0x7F807F807F807F80, 0x0001000100010001, 0x8000800080008000, 2
	case safetensors.F32:
		m, lo, hi, width = 0x7F8000007F800000, 0x0000000100000001, 0x8000000080000000, 4
	case safetensors.F8E4M3:
		m, lo, hi, width = 0x7F7F7F7F7F7F7F7F, 0x0101010101010101, 0x8080808080808080, 1
	default:
		return false
	}
	// 32 bytes a round, their tests or-ed: one branch a round (the scan
	// runs over every byte validate reads); with AVX2, one compare of the
	// 32 bytes' lanes.
	n := len(raw) &^ 31
	if useAVX2 && n > 0 {
		if anyAllSet(&raw[0], n, uint32(m), width) {
			return false
		}
	} else {
		for i := 0; i < n; i += 32 {
			if !clean32(raw[i:i+32:i+32], m, lo, hi) {
				return false
			}
		}
	}
	for ; n+8 <= len(raw); n += 8 {
		x := (binary.LittleEndian.Uint64(raw[n:]) & m) ^ m
		if (x-lo)&^x&hi != 0 {
			return false
		}
	}
	// the tail, and any word the test flagged, go element by element
	if n == len(raw) {
		return true
	}
	i, _ := firstNonFiniteSlow(d, raw[n:])
	return i < 0
}

// clean32 is one of clean's 32-byte rounds in Go: no lane of b has every
// bit of m set.
func clean32(b []byte, m, lo, hi uint64) bool {
	x0 := (binary.LittleEndian.Uint64(b[0:]) & m) ^ m
	x1 := (binary.LittleEndian.Uint64(b[8:]) & m) ^ m
	x2 := (binary.LittleEndian.Uint64(b[16:]) & m) ^ m
	x3 := (binary.LittleEndian.Uint64(b[24:]) & m) ^ m
	return ((x0-lo)&^x0|(x1-lo)&^x1|(x2-lo)&^x2|(x3-lo)&^x3)&hi == 0
}

// readAt fills buf from byte off of tensor t's data: a short read is an error
// that names the file and the tensor.
func ReadAt(t *checkpoint.Tensor, buf []byte, off int64) error {
	n, err := t.Data.ReadAt(buf, off)
	if n == len(buf) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%s: reading tensor %s: %w", t.File, t.Name, err)
}

// Lender is a tensor reader that can lend bytes it holds in memory
// instead of copying them out (a streamed pass: validate/stream).
type Lender interface {
	// Lend returns bytes [off, off+n) and the function that hands them
	// back, or ok false when it does not hold them.
	Lend(off, n int64) (b []byte, done func(), ok bool)
}

// Lend is t's bytes [off, off+n) where its reader lends them.
func Lend(t *checkpoint.Tensor, off, n int64) ([]byte, func(), bool) {
	if l, ok := t.Data.(Lender); ok {
		return l.Lend(off, n)
	}
	return nil, nil, false
}

// Consumer is a tensor reader that is told which bytes a reader is done
// with for good: a streamed pass lets a part of an expert go once its
// reader has consumed every byte of it, instead of when the whole expert's
// job ends.
type Consumer interface {
	Consumed(off, n int64)
}

// Consumed tells t's reader, where it listens, that bytes [off, off+n) of
// t will not be read again by the caller.
func Consumed(t *checkpoint.Tensor, off, n int64) {
	if c, ok := t.Data.(Consumer); ok {
		c.Consumed(off, n)
	}
}
