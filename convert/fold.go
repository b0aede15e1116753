package convert

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/moeprep/moeprep/safetensors"
)

// Folding multiplies every element by factor (routed_scaling_factor): the
// exact product (computed in float64, exact for every bf16/f16/f32 value when
// factor has at most 29 significant bits, as 2.5 or 16 do) rounded ONCE to
// nearest even in the element's dtype. For F32 (FP8 scale_inv tensors, f32
// weights) that is float32(x*factor); for BF16/F16 it goes through float32
// with round-to-odd, which makes the second rounding exact. NaN and Inf stay
// as they are; a finite product past the dtype's range becomes Inf.

// foldStats tracks the largest relative change |folded - x*f| / |x*f| over all
// finite non-zero elements, shared by every fold reader of a run.
type foldStats struct {
	mu     sync.Mutex
	maxRel float64
}

func (s *foldStats) note(v float64) {
	s.mu.Lock()
	if v > s.maxRel {
		s.maxRel = v
	}
	s.mu.Unlock()
}

func (s *foldStats) max() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxRel
}

// foldable reports whether fold readers handle dtype.
func foldable(d safetensors.DType) bool {
	return d == safetensors.F32 || d == safetensors.BF16 || d == safetensors.F16
}

// foldReader multiplies the little-endian elements flowing through it by
// factor, in the caller's buffer; it keeps at most one element of its own.
type foldReader struct {
	src    io.Reader
	dtype  safetensors.DType
	es     int
	factor float64
	stats  *foldStats
	one    [4]byte
	pend   []byte // transformed bytes of one element not yet handed out
}

func newFoldReader(src io.Reader, d safetensors.DType, factor float64, stats *foldStats) (*foldReader, error) {
	if !foldable(d) {
		return nil, fmt.Errorf("cannot fold routed_scaling_factor into %s data", d)
	}
	return &foldReader{src: src, dtype: d, es: d.Size(), factor: factor, stats: stats}, nil
}

func (f *foldReader) Read(p []byte) (int, error) {
	if len(f.pend) > 0 {
		n := copy(p, f.pend)
		f.pend = f.pend[n:]
		return n, nil
	}
	if len(p) == 0 {
		return 0, nil
	}
	buf := p[:len(p)/f.es*f.es]
	if len(buf) == 0 { // a caller buffer smaller than one element
		buf = f.one[:f.es]
	}
	n, err := io.ReadFull(f.src, buf)
	if n%f.es != 0 {
		return 0, fmt.Errorf("folding: data ends inside an element: %w", io.ErrUnexpectedEOF)
	}
	f.stats.note(foldInPlace(buf[:n], f.dtype, f.factor))
	if len(p) < f.es && n > 0 {
		c := copy(p, buf[:n])
		f.pend = buf[c:n]
		n = c
	}
	switch {
	case err == io.ErrUnexpectedEOF || (err == io.EOF && n > 0):
		return n, nil
	case err != nil:
		return n, err
	}
	return n, nil
}

// foldInPlace folds every element of b and returns the largest relative change.
func foldInPlace(b []byte, d safetensors.DType, factor float64) float64 {
	maxRel := 0.0
	track := func(got, exact float64) {
		if exact != 0 && !math.IsInf(exact, 0) && !math.IsNaN(exact) {
			if r := math.Abs(got-exact) / math.Abs(exact); r > maxRel {
				maxRel = r
			}
		}
	}
	switch d {
	case safetensors.F32:
		for i := 0; i+4 <= len(b); i += 4 {
			x := float64(math.Float32frombits(binary.LittleEndian.Uint32(b[i:])))
			if math.IsNaN(x) || math.IsInf(x, 0) {
				continue
			}
			y := float32(x * factor)
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(y))
			track(float64(y), x*factor)
		}
	case safetensors.BF16:
		for i := 0; i+2 <= len(b); i += 2 {
			h := binary.LittleEndian.Uint16(b[i:])
			x := float64(math.Float32frombits(uint32(h) << 16))
			if math.IsNaN(x) || math.IsInf(x, 0) {
				continue
			}
			y := BF16FromFloat32(roundToOdd32(x * factor))
			binary.LittleEndian.PutUint16(b[i:], y)
			track(float64(math.Float32frombits(uint32(y)<<16)), x*factor)
		}
	case safetensors.F16:
		for i := 0; i+2 <= len(b); i += 2 {
			x := F16ToFloat64(binary.LittleEndian.Uint16(b[i:]))
			if math.IsNaN(x) || math.IsInf(x, 0) {
				continue
			}
			y := F16FromFloat32(roundToOdd32(x * factor))
			binary.LittleEndian.PutUint16(b[i:], y)
			track(F16ToFloat64(y), x*factor)
		}
	}
	return maxRel
}

// FoldValue is the folded value of one element, as float64, for tests and validate:
// the exact x*factor rounded once to nearest even in dtype d.
func FoldValue(x, factor float64, d safetensors.DType) float64 {
	p := x * factor
	switch d {
	case safetensors.BF16:
		return float64(math.Float32frombits(uint32(BF16FromFloat32(roundToOdd32(p))) << 16))
	case safetensors.F16:
		return F16ToFloat64(F16FromFloat32(roundToOdd32(p)))
	}
	return float64(float32(p))
}

// roundToOdd32 rounds x to float32 toward zero and sets the last mantissa bit
// when inexact ("round to odd"), so that a later round-to-nearest-even to any
// format at least two bits narrower gives the correctly rounded result of x.
func roundToOdd32(x float64) float32 {
	f := float32(x)
	if float64(f) == x || math.IsNaN(x) {
		return f
	}
	if math.IsInf(float64(f), 0) || math.Abs(float64(f)) > math.Abs(x) {
		f = math.Nextafter32(f, 0)
	}
	return math.Float32frombits(math.Float32bits(f) | 1)
}

// BF16FromFloat32 rounds f to bfloat16, nearest even; NaN stays NaN.
func BF16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// F16FromFloat32 rounds f to IEEE half precision, nearest even, with subnormals.
func F16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if exp == 0 { // f32 subnormal: far below half of f16's smallest subnormal
			return sign
		}
		m := uint64(mant | 0x800000)
		shift := uint(14 - e)
		if shift >= 40 {
			return sign
		}
		h := m >> shift
		rem := m & (1<<shift - 1)
		half := uint64(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent is right, up to Inf
	}
	return sign | uint16(h)
}

// F16ToFloat64 decodes IEEE half precision.
func F16ToFloat64(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e := int(h>>10) & 0x1f
	m := float64(h & 0x3ff)
	switch e {
	case 0:
		return sign * m * math.Ldexp(1, -24)
	case 0x1f:
		if m != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * (1 + m/1024) * math.Ldexp(1, e-15)
}
