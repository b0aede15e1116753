package weightfmt

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
)

// QuantNone is the quantization of plain weights.
const QuantNone = "none"

// plain is an unquantised weight: every element is its own value, in
// dtype d, with no scale.
type plain struct{ d safetensors.DType }

// Plain is the format of unquantised weights of dtype d (BF16, F16 or F32
// as checkpoints ship experts; any dtype Decode reads decodes).
func Plain(d safetensors.DType) Format { return plain{d} }

func init() {
	// A plain contract has no weight_block_size, and a Block given anyway
	// has nothing to apply to.
	register(QuantNone, func(s Spec) (Format, error) { return Plain(s.DType), nil })
}

func (p plain) Quantization() string          { return QuantNone }
func (p plain) DType() safetensors.DType      { return p.d }
func (p plain) Packing() (elems, bytes int64) { return 1, int64(p.d.Size()) }
func (p plain) Scale() (Scale, bool)          { return Scale{}, false }
func (p plain) String() string                { return string(p.d) }

func (p plain) Dequantise(raw []byte, rows, cols int, scale []byte, dst []float32) error {
	if scale != nil {
		return fmt.Errorf("%s weights have no scale, got %d scale bytes", p.d, len(scale))
	}
	if rows < 0 || cols < 0 || len(dst) != rows*cols {
		return fmt.Errorf("%s: %d outputs for a %dx%d weight", p.d, len(dst), rows, cols)
	}
	return Decode(p.d, raw, dst)
}

// Fold multiplies the elements themselves: one rounding to bf16 or f16
// moves a value by up to 2^-9 or 2^-12 of itself, so only a fold asked for
// explicitly takes it.
func (p plain) Fold() FoldRule {
	if !foldable(p.d) {
		return FoldRule{refusal: "cannot fold %s into " + string(p.d) + " expert weights"}
	}
	return FoldRule{Into: FoldWeights, DType: p.d}
}

// foldable reports whether FoldInPlace handles dtype d.
func foldable(d safetensors.DType) bool {
	return d == safetensors.F32 || d == safetensors.BF16 || d == safetensors.F16
}

// Decodable reports whether Decode can widen dtype d to float32.
func Decodable(d safetensors.DType) bool {
	switch d {
	case safetensors.BF16, safetensors.F16, safetensors.F32, safetensors.F64,
		safetensors.F8E4M3, safetensors.F8E5M2, safetensors.F8E8M0:
		return true
	}
	return false
}

// Decode widens little-endian elements of dtype d in src to float32 in
// dst, exactly (F64 rounds once). len(src) must be len(dst) * d.Size().
func Decode(d safetensors.DType, src []byte, dst []float32) error {
	if !Decodable(d) {
		return fmt.Errorf("dtype %s is not a floating-point type moeprep can read", d)
	}
	if len(src) != len(dst)*d.Size() {
		return fmt.Errorf("decoding %s: %d bytes for %d elements", d, len(src), len(dst))
	}
	switch d {
	case safetensors.BF16:
		if n := len(dst) &^ 15; useAVX2 && n > 0 {
			bf16Widen(&src[0], &dst[0], n)
			src, dst = src[2*n:], dst[n:] // the last few in Go
		}
		for i := range dst {
			dst[i] = numfmt.BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case safetensors.F16:
		for i := range dst {
			dst[i] = numfmt.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case safetensors.F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case safetensors.F64:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
		}
	case safetensors.F8E4M3:
		decodeBytes(numfmt.E4M3ToF32, src, dst)
	case safetensors.F8E5M2:
		decodeBytes(numfmt.E5M2ToF32, src, dst)
	case safetensors.F8E8M0:
		decodeBytes(numfmt.E8M0ToF32, src, dst)
	}
	return nil
}

// decodeBytes widens one-byte floats; numfmt's decoders are table lookups.
func decodeBytes(dec func(byte) float32, src []byte, dst []float32) {
	dst = dst[:len(src)]
	for i, b := range src {
		dst[i] = dec(b)
	}
}

// Value is the element of dtype d at the start of b, as float64: BF16, F16,
// F64, and F32 for any other dtype (the dtypes a fold writes).
func Value(d safetensors.DType, b []byte) float64 {
	switch d {
	case safetensors.BF16:
		return float64(numfmt.BF16ToF32(binary.LittleEndian.Uint16(b)))
	case safetensors.F16:
		return float64(numfmt.F16ToF32(binary.LittleEndian.Uint16(b)))
	case safetensors.F64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b))
	}
	return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
}

// RoundingBound is one rounding to nearest in d: at most half an ulp,
// which is at most 2^-(mantissa bits+1) of the value, plus half the
// smallest subnormal for values that underflow. Dtypes other than BF16 and
// F16 get float32's.
func RoundingBound(d safetensors.DType) (rel, abs float64) {
	switch d {
	case safetensors.BF16:
		return 0x1p-8, 0x1p-134
	case safetensors.F16:
		return 0x1p-11, 0x1p-25
	}
	return 0x1p-24, 0x1p-150
}

// Folding multiplies every element by factor: the exact product (computed
// in float64, exact for every bf16/f16/f32 value when factor has at most 29
// significant bits, as 2.5 or 16 do) rounded ONCE to nearest even in the
// element's dtype. For F32 that is float32(x*factor); for BF16/F16
// numfmt.F64ToBF16 and numfmt.F64ToF16 round the float64 product once. NaN
// and Inf stay as they are; a finite product past the dtype's range
// becomes Inf.

// FoldInPlace folds every element of b, of dtype d (F32, BF16 or F16;
// others are left alone), and returns the largest relative change
// |folded - x*factor| / |x*factor| over the finite non-zero products.
func FoldInPlace(d safetensors.DType, b []byte, factor float64) float64 {
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
			y := FoldF32(x, factor)
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(y))
			track(float64(y), x*factor)
		}
	case safetensors.BF16:
		fold16(b, factor, numfmt.BF16ToF32, numfmt.F64ToBF16, track)
	case safetensors.F16:
		fold16(b, factor, numfmt.F16ToF32, numfmt.F64ToF16, track)
	}
	return maxRel
}

// FoldF32 is F32 value x with factor folded in, as FoldInPlace writes
// it: the product rounded once to float32. Those who check a fold (a
// folded scale against its source's) call it to hold the same rule.
func FoldF32(x, factor float64) float32 { return float32(x * factor) }

// fold16 folds every finite 16-bit element of b (decoded by dec, the
// product encoded by enc, rounding once) and tracks each folded value
// against the exact product.
func fold16(b []byte, factor float64, dec func(uint16) float32, enc func(float64) uint16, track func(got, exact float64)) {
	for i := 0; i+2 <= len(b); i += 2 {
		x := float64(dec(binary.LittleEndian.Uint16(b[i:])))
		if math.IsNaN(x) || math.IsInf(x, 0) {
			continue
		}
		y := enc(x * factor)
		binary.LittleEndian.PutUint16(b[i:], y)
		track(float64(dec(y)), x*factor)
	}
}

// FoldValue is the folded value of one element x of dtype d, as float64:
// the exact x*factor rounded once to nearest even in d (F32 for any dtype
// but BF16 and F16).
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
