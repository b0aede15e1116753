package weightfmt

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
)

// Plain weights dequantise to numfmt's exact widening of every element,
// refuse a scale, and Value reads the same numbers one at a time.
func TestPlainDequantiseAgainstNumfmt(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 16))
	for _, d := range []safetensors.DType{safetensors.BF16, safetensors.F16, safetensors.F32} {
		f := Plain(d)
		const rows, cols = 7, 13
		raw := randomWeight(rng, f, rows*cols)
		dst := make([]float32, rows*cols)
		if err := f.Dequantise(raw, rows, cols, nil, dst); err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		es := d.Size()
		for i := range dst {
			var want float32
			switch d {
			case safetensors.BF16:
				want = numfmt.BF16ToF32(binary.LittleEndian.Uint16(raw[es*i:]))
			case safetensors.F16:
				want = numfmt.F16ToF32(binary.LittleEndian.Uint16(raw[es*i:]))
			default:
				want = math.Float32frombits(binary.LittleEndian.Uint32(raw[es*i:]))
			}
			if dst[i] != want || want == 0 {
				t.Fatalf("%s element %d = %v, want %v (non-zero)", d, i, dst[i], want)
			}
			if v := Value(d, raw[es*i:]); v != float64(want) {
				t.Fatalf("%s element %d: Value %v, want %v", d, i, v, want)
			}
		}
		if err := f.Dequantise(raw, rows, cols, []byte{1, 2, 3, 4}, dst); err == nil {
			t.Errorf("%s: a scale was accepted", d)
		}
		if err := f.Dequantise(raw[:len(raw)-es], rows, cols, nil, dst); err == nil {
			t.Errorf("%s: a short weight was accepted", d)
		}
	}
}

func TestDecode(t *testing.T) {
	f32 := testkit.F32LE(1.25, -3)
	f64 := binary.LittleEndian.AppendUint64(nil, math.Float64bits(0.5))
	for _, tc := range []struct {
		d    safetensors.DType
		in   []byte
		want []float32
	}{
		{safetensors.BF16, testkit.U16LE(0x3F80, 0xC000), []float32{1, -2}},
		{safetensors.F16, testkit.U16LE(0x3C00, 0x3800), []float32{1, 0.5}},
		{safetensors.F32, f32, []float32{1.25, -3}},
		{safetensors.F64, f64, []float32{0.5}},
		{safetensors.F8E4M3, []byte{0x38, 0x7E, 0x01}, []float32{1, 448, float32(math.Ldexp(1, -9))}},
		{safetensors.F8E5M2, []byte{0x3C, 0xC0}, []float32{1, -2}},
		{safetensors.F8E8M0, []byte{127, 130}, []float32{1, 8}},
	} {
		got := make([]float32, len(tc.want))
		if err := Decode(tc.d, tc.in, got); err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v %v, want %v", tc.d, got, err, tc.want)
		}
	}
	if err := Decode(safetensors.BF16, []byte{1, 2, 3}, make([]float32, 2)); err == nil {
		t.Error("a short buffer decoded")
	}
	if err := Decode(safetensors.I32, make([]byte, 4), make([]float32, 1)); err == nil {
		t.Error("I32 decoded as a float")
	}
}

// RoundingBound holds half an ulp of each dtype: rounding random values
// once stays within it, and the bound is not loose by more than 2x.
func TestRoundingBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 32))
	for _, d := range []safetensors.DType{safetensors.BF16, safetensors.F16, safetensors.F32} {
		rel, abs := RoundingBound(d)
		worst := 0.0
		for range 20000 {
			x := (rng.Float64() + 0.5) * math.Ldexp(1, rng.IntN(10)-5)
			y := FoldValue(x, 1, d)
			if diff := math.Abs(y - x); diff > rel*math.Abs(x)+abs {
				t.Fatalf("%s: %v rounds to %v, off by more than the bound", d, x, y)
			}
			worst = max(worst, math.Abs(y-x)/math.Abs(x))
		}
		if worst < rel/2 {
			t.Errorf("%s: worst rounding %g, the bound %g is loose", d, worst, rel)
		}
	}
}

// FoldValue rounds the exact product once in the tensor's dtype (numfmt's
// tests prove the rounding itself against math/big on random products).
func TestFoldValueRoundsOnce(t *testing.T) {
	for _, tc := range []struct {
		x, f float64
		d    safetensors.DType
		want float64
	}{
		{1 + 1.0/128, 1.5, safetensors.BF16, 1.515625},          // 1.51171875 is a bf16 tie: to even
		{257.0 / 256 * 2, 1, safetensors.BF16, 2},               // not representable input rounds to even
		{1 + 0x1p-8 + 0x1p-30, 1, safetensors.BF16, 1 + 0x1p-7}, // through float32 it would round twice, to 1
		{1 + 0x1p-11 + 0x1p-40, 1, safetensors.F16, 1 + 0x1p-10},
		{1 + 0x1p-23, 1 + 0x1p-24, safetensors.F32, 1 + 0x1p-22}, // just past an f32 tie: up
		{0x1p-24, 2.5, safetensors.F16, 0x1p-23},                 // subnormal 2.5 steps tie to even 2
		{3 * 0x1p-24, 2.5, safetensors.F16, 0x1p-21},             // 7.5 steps tie to 8
		{3e38, 2.5, safetensors.BF16, math.Inf(1)},
		{60000, 2.5, safetensors.F16, math.Inf(1)},
		{-60000, 2.5, safetensors.F16, math.Inf(-1)},
	} {
		if got := FoldValue(tc.x, tc.f, tc.d); got != tc.want {
			t.Errorf("FoldValue(%v, %v, %s) = %v, want %v", tc.x, tc.f, tc.d, got, tc.want)
		}
	}
}

// The shard writer folds a part chunk by chunk: any element-aligned cut
// must give the bytes of folding it whole, each element FoldValue, and the
// largest relative change must be what the elements themselves give.
func TestFoldInPlaceAnyChunking(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 64))
	for _, tc := range []struct {
		d      safetensors.DType
		factor float64
	}{
		{safetensors.F32, 2.5}, {safetensors.BF16, 2.5}, {safetensors.F16, 2.5},
		{safetensors.F32, 1.0 / 3}, {safetensors.BF16, 1.0 / 3}, // a factor float32 cannot hold
	} {
		d, factor := tc.d, tc.factor
		es := d.Size()
		src := make([]byte, es*1001)
		for i := 0; i < len(src); i += es {
			v := rng.NormFloat64() * 0.02
			switch d {
			case safetensors.F32:
				binary.LittleEndian.PutUint32(src[i:], math.Float32bits(float32(v)))
			case safetensors.BF16:
				binary.LittleEndian.PutUint16(src[i:], numfmt.F64ToBF16(v))
			case safetensors.F16:
				binary.LittleEndian.PutUint16(src[i:], numfmt.F64ToF16(v))
			}
		}
		whole := append([]byte(nil), src...)
		wantMax := FoldInPlace(d, whole, factor)
		if wantMax == 0 {
			t.Fatalf("%s: folding %v into 1001 random values rounded none of them", d, factor)
		}
		for i := 0; i < len(src); i += es {
			x, got := Value(d, src[i:]), Value(d, whole[i:])
			if want := FoldValue(x, factor, d); got != want {
				t.Fatalf("%s x %v element %d: %v folded to %v, want %v", d, factor, i/es, x, got, want)
			}
		}
		for _, chunk := range []int{1, 3, 7, 1000} {
			got := append([]byte(nil), src...)
			maxRel := 0.0
			for off := 0; off < len(got); off += chunk * es {
				maxRel = max(maxRel, FoldInPlace(d, got[off:min(off+chunk*es, len(got))], factor))
			}
			if !bytes.Equal(got, whole) || maxRel != wantMax {
				t.Errorf("%s x %v, chunks of %d elements: bytes equal %v, max change %g want %g", d, factor, chunk, bytes.Equal(got, whole), maxRel, wantMax)
			}
		}
	}
}

// Non-finite values pass through a fold untouched.
func TestFoldInPlaceKeepsNonFinite(t *testing.T) {
	for _, tc := range []struct {
		d    safetensors.DType
		bits []byte
	}{
		{safetensors.F32, binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(math.Inf(-1))))},
		{safetensors.F32, binary.LittleEndian.AppendUint32(nil, 0x7fc00001)},
		{safetensors.BF16, binary.LittleEndian.AppendUint16(nil, 0x7f80)},
		{safetensors.F16, binary.LittleEndian.AppendUint16(nil, 0x7e01)},
	} {
		b := slices.Clone(tc.bits)
		if FoldInPlace(tc.d, b, 2.5); !bytes.Equal(b, tc.bits) {
			t.Errorf("%s %x folded to %x", tc.d, tc.bits, b)
		}
	}
}
