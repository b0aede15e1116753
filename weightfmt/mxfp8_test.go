package weightfmt

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
)

// Hand-computed MXFP8 values: E4M3 codes (0x38 = 1, 0x40 = 2, 0xC0 = -2,
// 0x7E = 448, 0x01 = 2^-9, the smallest subnormal; 0x7F is NaN) times
// 2^(e - 127) of their group's scale byte e (ModelOpt's dequantize:
// q * exp2(scale - 127)).
func TestMXFP8Dequantise(t *testing.T) {
	f := MXFP8(NamingModelOpt, u8)
	group := func(head ...byte) []byte { return padded(32, head...) }
	checkDequantise(t, []dequantCase{
		{"scale 128 doubles", f, 1, 32, group(0x38, 0x40, 0xC0, 0x7E, 0x01), []byte{128},
			outputs(32, 2, 4, -4, 896, 0x1p-8)},
		{"two groups of a row take their own scales", f, 1, 64,
			slices.Concat(group(0x38, 0xC0), group(0x40, 0x7E)), []byte{127, 125},
			slices.Concat(outputs(32, 1, -2), outputs(32, 0.5, 112))},
		{"two rows", f, 2, 32, slices.Concat(group(0x38), group(0x40)), []byte{126, 130},
			slices.Concat(outputs(32, 0.5), outputs(32, 16))},
		{"smallest scale: 2^-127 and 2^-9 * 2^-127 are float32 subnormals", f, 1, 32, group(0x38, 0x01), []byte{0},
			outputs(32, 0x1p-127, 0x1p-136)},
		{"scale 0xFF is NaN (OCP MX E8M0)", f, 1, 32, group(0x38), []byte{0xFF},
			rep(float32(math.NaN()), 32)},
		{"code 0x7F is NaN", f, 1, 32, group(0x7F, 0x38), []byte{127},
			outputs(32, float32(math.NaN()), 1)},
	})
	// MiniMax's naming and F8_E8M0 scales hold the same bytes.
	mm := MXFP8(NamingMiniMax, safetensors.F8E8M0)
	dst := make([]float32, 32)
	if err := mm.Dequantise(group(0xC0), 1, 32, []byte{129}, dst); err != nil || !sameFloats(dst, outputs(32, -8)) {
		t.Errorf("MiniMax naming: %v %v", dst[:2], err)
	}
}

func TestMXFP8Refusals(t *testing.T) {
	f := MXFP8(NamingModelOpt, u8)
	checkRefusals(t, mxRefusals(f, 32, "bytes"))
}

// TestMXFP8Names: ModelOpt's x.weight_scale and MiniMax's
// x.weight_scale_inv, a stack's named after it; New reads the config's
// block and naming and refuses other blocks.
func TestMXFP8Names(t *testing.T) {
	for _, tc := range []struct {
		naming, weight, scale string
	}{
		{NamingModelOpt, "model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.1.mlp.experts.0.gate_proj.weight_scale"},
		{NamingMiniMax, "model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv"},
		{NamingModelOpt, "model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.gate_up_proj_scale"},
	} {
		f, err := New(Spec{Quantization: QuantMXFP8, Block: []int64{1, 32}, Naming: tc.naming})
		if err != nil {
			t.Fatal(err)
		}
		if got := TensorsOf(f, tc.weight); got != (Tensors{Weight: tc.weight, Scale: tc.scale}) {
			t.Errorf("%s: %+v, want scale %s", tc.naming, got, tc.scale)
		}
	}
	if f, err := New(Spec{Quantization: QuantMXFP8}); err != nil || f.(Named).Naming() != NamingModelOpt {
		t.Errorf("default naming: %v %v", f, err)
	}
	for _, s := range []Spec{
		{Quantization: QuantMXFP8, Block: []int64{32, 32}},
		{Quantization: QuantMXFP8, ScaleDType: safetensors.F32},
		{Quantization: QuantMXFP8, DType: safetensors.U8},
		{Quantization: QuantMXFP8, Naming: NamingDeepSeek},
	} {
		if f, err := New(s); err == nil {
			t.Errorf("%+v: built %s, want a refusal", s, f)
		}
	}
	if _, ok := ScaledDType(safetensors.F8E4M3); !ok {
		t.Fatal("F8_E4M3 names no format")
	} else if f, _ := ScaledDType(safetensors.F8E4M3); f.Quantization() != QuantFP8Block {
		t.Errorf("F8_E4M3 alone is %s, want FP8 blocks (MXFP8 only where a config names it)", f.Quantization())
	}
}

// TestMXFP8RequantModelOpt: requantising a plain weight into MXFP8 gives
// ModelOpt's bytes, derived here from mxfp8_tensor.py's arithmetic in
// float64 apart from requant.go's: e = ceil(log2(amax / 448)) clamped to
// [-127, 127] (amax 0: -127), byte e + 127, element the nearest E4M3
// value to clamp(w * 2^-e, -448, 448). The edges: a zero group (byte 0,
// codes 0), an amax of exactly 448 * 2^-8 (e = -8, the element 448), a
// group below 2^-127 * 448 (clamped to byte 0; its elements round to 0
// or the smallest subnormals), and weight-like values.
func TestMXFP8RequantModelOpt(t *testing.T) {
	const rows, cols = 6, 64
	rng := rand.New(rand.NewPCG(31, 7))
	vals := plainValues(rng, rows*cols)
	copy(vals[0:96], make([]float32, 96))
	vals[32], vals[33] = 1.75, -0.3
	vals[64], vals[65] = 0x1p-140, -0x1p-135
	vals[96] = 0x1p-125
	for _, d := range []safetensors.DType{u8, safetensors.F8E8M0} {
		f := MXFP8(NamingModelOpt, d)
		w, s, err := Requantise(f, vals, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		for g := range rows * cols / 32 {
			amax := 0.0
			for _, v := range vals[g*32 : (g+1)*32] {
				amax = math.Max(amax, math.Abs(float64(v)))
			}
			e := -127.0
			if descale := float64(float32(amax) / 448); descale > 0 {
				e = math.Max(-127, math.Min(127, math.Ceil(math.Log2(descale))))
			}
			if want := byte(e + 127); s[g] != want {
				t.Fatalf("%s group %d (amax %g): scale byte %d, want %d", d, g, amax, s[g], want)
			}
			for i := g * 32; i < (g+1)*32; i++ {
				x := math.Max(-448, math.Min(448, float64(vals[i])*math.Pow(2, -e)))
				if want := nearestE4M3(float32(x)); numfmt.E4M3ToF32(w[i]) != numfmt.E4M3ToF32(want) {
					t.Fatalf("%s element %d (%g, e %g): code %#x, want %#x", d, i, vals[i], e, w[i], want)
				}
			}
		}
		if s[0] != 0 || s[1] != 119 || w[32] != 0x7E || s[2] != 0 {
			t.Errorf("%s edges: scale bytes %v, element 32 %#x", d, s[:4], w[32])
		}
	}
}
