package weightfmt

import (
	"slices"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// Hand-computed NVFP4 values: 0x9C is low 0xC = -2 (the even element,
// llama.cpp _nvfp4_pack: w & 0x0F first; compressed-tensors
// unpack_fp4_from_uint8: low before high), high 9 = -0.5; 0x71 is 0.5, 6.
// E4M3 0x40 = 2, 0x38 = 1, 0x39 = 1.125. ModelOpt multiplies by
// weight_scale_2; compressed-tensors DIVIDES by weight_global_scale
// (forward.py _dequantize: scale = scale / global_scale), so global 4
// there is scale_2 0.25 here, and global 0.25 is scale_2 4.
func TestNVFP4Dequantise(t *testing.T) {
	mo, ct := NVFP4ModelOpt().(GlobalScaled), NVFP4CT().(GlobalScaled)
	for _, tc := range []struct {
		name       string
		f          GlobalScaled
		rows, cols int
		raw, scale []byte
		global     float32
		want       []float32
	}{
		{"modelopt: s * scale_2 = 2 * 0.25", mo, 1, 16, fp4Group(16, 0x9C, 0x71), []byte{0x40}, 0.25,
			outputs(16, -1, -0.25, 0.25, 3)},
		{"compressed-tensors: s / global = 2 / 4", ct, 1, 16, fp4Group(16, 0x9C, 0x71), []byte{0x40}, 4,
			outputs(16, -1, -0.25, 0.25, 3)},
		{"compressed-tensors: the reciprocal, 2 / 0.25", ct, 1, 16, fp4Group(16, 0x9C, 0x71), []byte{0x40}, 0.25,
			outputs(16, -16, -4, 4, 48)},
		{"modelopt: 2 * 4", mo, 1, 16, fp4Group(16, 0x9C, 0x71), []byte{0x40}, 4,
			outputs(16, -16, -4, 4, 48)},
		{"two groups, two rows", mo, 2, 32,
			slices.Concat(fp4Group(16, 0x9C), fp4Group(16, 0x71), fp4Group(16, 0x10), fp4Group(16, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF)), []byte{0x38, 0x40, 0x40, 0xB8}, 1,
			slices.Concat(outputs(16, -2, -0.5), outputs(16, 1, 12), outputs(16, 0, 1), rep(6, 16))},
		// The block's effective scale is rounded to float32 before the
		// E2M1 value multiplies it, as compressed-tensors and vLLM's
		// dequantize_to_dtype compute: 1.5 * f32(1.125 / 5) = 0x3EACCCCC,
		// where the exact 1.5 * 1.125 / 5 rounds to 0x3EACCCCD.
		{"compressed-tensors rounds the effective scale first", ct, 1, 16, fp4Group(16, 0x03), []byte{0x39}, 5,
			outputs(16, 0.33749998)},
	} {
		dst := make([]float32, tc.rows*tc.cols)
		if err := tc.f.DequantiseGlobal(tc.raw, tc.rows, tc.cols, tc.scale, f32s(tc.global), dst); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !sameFloats(dst, tc.want) {
			t.Errorf("%s:\n got %v\nwant %v", tc.name, dst, tc.want)
		}
		// DequantiseWeight dispatches to the same.
		again := make([]float32, len(dst))
		if err := DequantiseWeight(tc.f, tc.raw, tc.rows, tc.cols, tc.scale, f32s(tc.global), again); err != nil || !sameFloats(again, dst) {
			t.Errorf("%s: DequantiseWeight differs (%v)", tc.name, err)
		}
	}
	if got := float32(1.5) * float32(float32(1.125)/5); got != 0.33749998 {
		t.Errorf("the rounding example is off: %v", got)
	}
}

func TestNVFP4Refusals(t *testing.T) {
	mo := NVFP4ModelOpt().(GlobalScaled)
	one := f32s(1)
	for _, tc := range []struct {
		name       string
		rows, cols int
		raw, scale []byte
		global     []byte
		ndst       int
		want       string
	}{
		{"no global scale", 1, 16, fp4Group(16), []byte{0x38}, nil, 16, "global scale"},
		{"short global scale", 1, 16, fp4Group(16), []byte{0x38}, []byte{0, 0, 0x80}, 16, "global scale"},
		{"two global scales", 1, 16, fp4Group(16), []byte{0x38}, f32s(1, 2), 16, "global scale"},
		{"partial group", 1, 24, make([]byte, 12), []byte{0x38, 0x38}, one, 24, "whole number of 16-column"},
		{"odd row", 1, 17, make([]byte, 9), []byte{0x38, 0x38}, one, 17, "whole number of 16-column"},
		{"short weight", 1, 16, make([]byte, 7), []byte{0x38}, one, 16, "weight bytes"},
		{"short grid", 1, 32, make([]byte, 16), []byte{0x38}, one, 32, "scale bytes"},
		{"short output", 1, 16, fp4Group(16), []byte{0x38}, one, 15, "outputs"},
		{"overflowing size", 1 << 40, 1 << 40, nil, nil, one, 0, "outputs"},
	} {
		err := mo.DequantiseGlobal(tc.raw, tc.rows, tc.cols, tc.scale, tc.global, make([]float32, tc.ndst))
		testkit.ErrorContains(t, err, tc.want, tc.name)
	}
	// Without its global scale an NVFP4 weight cannot be dequantised: the
	// plain Dequantise refuses rather than leave the factor out, and
	// DequantiseWeight refuses a global scale for a format without one.
	testkit.ErrorContains(t, mo.Dequantise(fp4Group(16), 1, 16, []byte{0x38}, make([]float32, 16)), "weight_scale_2",
		"Dequantise without the global scale")
	testkit.ErrorContains(t, NVFP4CT().Dequantise(fp4Group(16), 1, 16, []byte{0x38}, make([]float32, 16)), "weight_global_scale",
		"compressed-tensors Dequantise without the global scale")
	if err := DequantiseWeight(MXFP4(NamingGptOss, "U8", "U8"), make([]byte, 16), 1, 32, []byte{127}, one, make([]float32, 32)); err == nil {
		t.Error("a global scale was accepted for MXFP4")
	}
}

// A stack [E, rows, cols/2] of NVFP4 weights has E global scales: expert
// e's is bytes 4e..4e+4 of the [E] (or [E, 1]) F32 tensor, and every piece
// cut from an expert keeps that one.
func TestNVFP4GlobalRegions(t *testing.T) {
	m := Matrix{Format: NVFP4CT(), Rows: 6, Cols: 64}
	if m.GlobalBytes() != 4 {
		t.Fatalf("%d global bytes, want 4", m.GlobalBytes())
	}
	one := Region{Rows: 1, RowLen: 4, Stride: 4}
	for _, tc := range []struct {
		what string
		got  Region
		want Region
	}{
		{"expert 0", m.Expert(0).Global, one},
		{"expert 5", m.Expert(5).Global, Region{Off: 20, Rows: 1, RowLen: 4, Stride: 4}},
		{"whole", m.Whole().Global, one},
		{"rows 2..4", m.RowBlock(2, 2).Global, one},
		{"columns 16..48", m.ColBlock(16, 32).Global, one},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: global %+v, want %+v", tc.what, tc.got, tc.want)
		}
	}
	if (Matrix{Format: FP8Block(128, 128, false), Rows: 6, Cols: 64}).Expert(3).Global != (Region{}) {
		t.Error("FP8 blocks have no global scale region")
	}
}
