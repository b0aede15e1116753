package convert

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
)

// Folding multiplies every element by factor (routed_scaling_factor): the
// exact product (computed in float64, exact for every bf16/f16/f32 value when
// factor has at most 29 significant bits, as 2.5 or 16 do) rounded ONCE to
// nearest even in the element's dtype. For F32 (FP8 scale_inv tensors, f32
// weights) that is float32(x*factor); for BF16/F16 numfmt.F64ToBF16 and
// numfmt.F64ToF16 round the float64 product once. NaN and Inf stay as they
// are; a finite product past the dtype's range becomes Inf.

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
			x := float64(numfmt.BF16ToF32(binary.LittleEndian.Uint16(b[i:])))
			if math.IsNaN(x) || math.IsInf(x, 0) {
				continue
			}
			y := numfmt.F64ToBF16(x * factor)
			binary.LittleEndian.PutUint16(b[i:], y)
			track(float64(numfmt.BF16ToF32(y)), x*factor)
		}
	case safetensors.F16:
		for i := 0; i+2 <= len(b); i += 2 {
			x := float64(numfmt.F16ToF32(binary.LittleEndian.Uint16(b[i:])))
			if math.IsNaN(x) || math.IsInf(x, 0) {
				continue
			}
			y := numfmt.F64ToF16(x * factor)
			binary.LittleEndian.PutUint16(b[i:], y)
			track(float64(numfmt.F16ToF32(y)), x*factor)
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
		return float64(numfmt.BF16ToF32(numfmt.F64ToBF16(p)))
	case safetensors.F16:
		return float64(numfmt.F16ToF32(numfmt.F64ToF16(p)))
	}
	return float64(float32(p))
}
