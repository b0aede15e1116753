package weightfmt

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
)

// randomWeight is n random non-zero finite elements of f's dtype.
func randomWeight(rng *rand.Rand, f Format, n int64) []byte {
	switch f.DType() {
	case safetensors.F8E4M3:
		b := make([]byte, n)
		for i := range b {
			for b[i]&0x7F == 0 || b[i]&0x7F == 0x7F { // neither zero nor NaN
				b[i] = byte(rng.IntN(256))
			}
		}
		return b
	case safetensors.BF16, safetensors.F16:
		b := make([]byte, 2*n)
		for i := range n {
			v := float64(1+rng.IntN(1000)) / 256 * float64(1-2*rng.IntN(2))
			h := numfmt.F64ToBF16(v)
			if f.DType() == safetensors.F16 {
				h = numfmt.F64ToF16(v)
			}
			binary.LittleEndian.PutUint16(b[2*i:], h)
		}
		return b
	}
	b := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(rng.NormFloat64()+3)))
	}
	return b
}

// randomScales is a random positive F32 grid for m, nil when unscaled.
func randomScales(rng *rand.Rand, m Matrix) []byte {
	if _, ok := m.Format.Scale(); !ok {
		return nil
	}
	r, c := m.ScaleShape()
	b := make([]byte, 4*r*c)
	for i := range r * c {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(rng.Float64()+0.01)*1e-3))
	}
	return b
}

// Dequantise is the E4M3 value times its block's scale, rounded once to
// float32, for every element, with ragged edge blocks.
func TestFP8DequantiseAgainstNumfmt(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 8))
	for _, tc := range []struct{ bo, bi, rows, cols int64 }{
		{128, 128, 130, 260},
		{128, 128, 96, 160},
		{64, 128, 130, 260},
		{3, 5, 7, 11},
	} {
		f := FP8Block(tc.bo, tc.bi, false)
		m := Matrix{Format: f, Rows: tc.rows, Cols: tc.cols}
		raw, scale := randomWeight(rng, f, tc.rows*tc.cols), randomScales(rng, m)
		_, gc := m.ScaleShape()
		dst := make([]float32, tc.rows*tc.cols)
		if err := f.Dequantise(raw, int(tc.rows), int(tc.cols), scale, dst); err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		for i := range dst {
			r, c := int64(i)/tc.cols, int64(i)%tc.cols
			s := math.Float32frombits(binary.LittleEndian.Uint32(scale[4*((r/tc.bo)*gc+c/tc.bi):]))
			if want := numfmt.E4M3ToF32(raw[i]) * s; dst[i] != want {
				t.Fatalf("%+v: element (%d,%d) = %v, want %v", tc, r, c, dst[i], want)
			}
		}
		if err := f.Dequantise(raw, int(tc.rows), int(tc.cols), scale[:len(scale)-4], dst); err == nil {
			t.Errorf("%+v: a short scale grid was accepted", tc)
		}
	}
}

// The FP8 format reads what family and the contract say: the default
// block, a given one, UE8M0 scales; a malformed block is refused.
func TestNew(t *testing.T) {
	checkNew(t, []newCase{
		{"plain bf16", Spec{Quantization: "none", DType: safetensors.BF16}, Plain(safetensors.BF16), ""},
		{"unset is plain", Spec{DType: safetensors.F16}, Plain(safetensors.F16), ""},
		{"fp8 default block", Spec{Quantization: QuantFP8Block, DType: safetensors.F8E4M3}, FP8Block(128, 128, false), ""},
		{"fp8 contract block", Spec{Quantization: QuantFP8Block, Block: []int64{64, 32}}, FP8Block(64, 32, false), ""},
		{"fp8 ue8m0", Spec{Quantization: QuantFP8Block, ScaleFmt: "ue8m0"}, FP8Block(128, 128, true), ""},
		{"fp8 one-number block", Spec{Quantization: QuantFP8Block, Block: []int64{128}}, nil, "want two positive integers"},
		{"fp8 zero block", Spec{Quantization: QuantFP8Block, Block: []int64{0, 128}}, nil, "want two positive integers"},
		{"fp8 block past the bound", Spec{Quantization: QuantFP8Block, Block: []int64{128, 1 << 62}}, nil, "a block edge is at most 65536"},
		{"unknown", Spec{Quantization: "int4_group_32"}, nil, `"int4_group_32" is not supported`},
	})
}

// A fold goes into the F32 scales of FP8 (by default: float32 rounding),
// into bf16/f16/f32 weights only when asked, and nowhere for UE8M0 scales
// or a dtype the fold cannot round into, with the reason naming the factor.
func TestFoldRules(t *testing.T) {
	checkFold(t, []foldCase{
		{FP8Block(128, 128, false), FoldScales, safetensors.F32, true, ""},
		{FP8Block(128, 128, true), FoldNowhere, "", false, "the FP8 scales are UE8M0 (powers of two) and cannot absorb rsf 2.5 exactly"},
		{Plain(safetensors.BF16), FoldWeights, safetensors.BF16, false, ""},
		{Plain(safetensors.F16), FoldWeights, safetensors.F16, false, ""},
		{Plain(safetensors.F32), FoldWeights, safetensors.F32, false, ""},
		{Plain(safetensors.F64), FoldNowhere, "", false, "cannot fold rsf 2.5 into F64 expert weights"},
		{perChannel{}, FoldNowhere, "", false, "the weights cannot absorb rsf 2.5"},
	})
}

func TestScaledFormats(t *testing.T) {
	got := Scaled()
	if len(got) != 1 || got[0].Quantization() != QuantFP8Block {
		t.Fatalf("Scaled() = %v, want the FP8 block format alone", got)
	}
	if f, ok := ScaledDType(safetensors.F8E4M3); !ok || f.Quantization() != QuantFP8Block {
		t.Errorf("ScaledDType(F8_E4M3) = %v, %v", f, ok)
	}
	if _, ok := ScaledDType(safetensors.BF16); ok {
		t.Error("BF16 is the dtype of no scaled format")
	}
}
