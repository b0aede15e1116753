package convert

import (
	"encoding/binary"
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
