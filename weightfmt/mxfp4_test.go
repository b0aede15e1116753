package weightfmt

import (
	"math"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// Hand-computed MXFP4 values. The even element is the LOW nibble
// (transformers integrations/mxfp4.py: idx_lo fills columns 0::2;
// compressed-tensors pack_fp4_to_uint8: indices[:, 0] | indices[:, 1] <<
// 4; DeepSeek-V4 convert.py: low stacked before high), and the scale byte
// e means 2^(e-127) (convert_moe_packed_tensors: ldexp(v, scales - 127)).
//
// 0x2A: low 0xA = -1, high 0x2 = 1; 0xF7: low 7 = 6, high 0xF = -6;
// 0x10: low 0 = 0, high 1 = 0.5; 0x9B: low 0xB = -1.5, high 9 = -0.5.
// With the nibbles swapped 0x2A would give 1, -1.
func TestMXFP4Dequantise(t *testing.T) {
	f := MXFP4(NamingGptOss, safetensors.U8, safetensors.U8)
	checkDequantise(t, []dequantCase{
		{"nibble order, scale 2", f, 1, 32, fp4Group(32, 0x2A, 0xF7, 0x10), []byte{128},
			outputs(32, -2, 2, 12, -12, 0, 1)},
		{"two groups of a row take their own scales", f, 1, 64,
			slices.Concat(fp4Group(32, 0x2A), fp4Group(32, 0x9B)), []byte{127, 125},
			slices.Concat(outputs(32, -1, 1), outputs(32, -0.375, -0.125))},
		{"two rows", f, 2, 32, slices.Concat(fp4Group(32, 0xF7), fp4Group(32, 0x2A)), []byte{126, 130},
			slices.Concat(outputs(32, 3, -3), outputs(32, -8, 8))},
		{"smallest scale: 0.5 * 2^-127 is a float32 subnormal", f, 1, 32, fp4Group(32, 0x01), []byte{0},
			outputs(32, 0x1p-128, 0)},
		{"scale 0xFF is NaN (OCP MX E8M0)", f, 1, 32, fp4Group(32, 0x2A), []byte{0xFF},
			rep(float32(math.NaN()), 32)},
	})
	// DeepSeek-V4 stores the same bytes as I8 with F8_E8M0 scales.
	ds := MXFP4(NamingDeepSeek, safetensors.I8, safetensors.F8E8M0)
	dst := make([]float32, 32)
	if err := ds.Dequantise(fp4Group(32, 0x2A), 1, 32, []byte{128}, dst); err != nil || !sameFloats(dst, outputs(32, -2, 2)) {
		t.Errorf("DeepSeek-V4 naming: %v %v", dst[:2], err)
	}
}

// gpt-oss stacks an expert's blocks as [rows, cols/32, 16] and its scales
// as [rows, cols/32]: byte j of group g of row r is byte g*16+j of the row
// of a [rows, cols/2] matrix, so an expert of the stack is Matrix.Expert
// and its shapes are the matrix's.
func TestMXFP4GptOssLayout(t *testing.T) {
	const experts, rows, cols = 3, 4, 96 // gate_up [E, 2I, H] with H = 96: 3 groups
	m := Matrix{Format: MXFP4(NamingGptOss, safetensors.U8, safetensors.U8), Rows: rows, Cols: cols}
	if !slices.Equal(m.Shape(), []int64{rows, cols / 2}) {
		t.Errorf("shape %v, want [%d %d]", m.Shape(), rows, cols/2)
	}
	if r, c := m.ScaleShape(); r != rows || c != cols/32 {
		t.Errorf("grid %dx%d, want %dx%d", r, c, rows, cols/32)
	}
	// blocks[e][r][g][j] sits at ((e*rows+r)*3+g)*16+j of the stack.
	ex := m.Expert(2)
	if want := (Region{Off: 2 * rows * 3 * 16, Rows: 1, RowLen: rows * 3 * 16, Stride: rows * 3 * 16}); ex.Weight != want {
		t.Errorf("expert 2 blocks %+v, want %+v", ex.Weight, want)
	}
	if want := (Region{Off: 2 * rows * 3, Rows: 1, RowLen: rows * 3, Stride: rows * 3}); ex.Scale != want {
		t.Errorf("expert 2 scales %+v, want %+v", ex.Scale, want)
	}
	if ex.Global != (Region{}) {
		t.Errorf("MXFP4 has no global scale, got %+v", ex.Global)
	}
	// Columns 32..64 of every row are group 1: bytes 16..32 of each row.
	if got, want := m.ColBlock(32, 32), (Slice{
		Weight: Region{Off: 16, Rows: rows, RowLen: 16, Stride: 48},
		Scale:  Region{Off: 1, Rows: rows, RowLen: 1, Stride: 3},
	}); got != want {
		t.Errorf("group 1: %+v, want %+v", got, want)
	}
}

func TestMXFP4Refusals(t *testing.T) {
	f := MXFP4(NamingCompressedTensors, safetensors.U8, safetensors.U8)
	checkRefusals(t, append(mxRefusals(f, 16, "weight bytes"),
		refusal{"overflowing size", f, 1 << 33, 1 << 33, nil, nil, 0, "outputs"}))
}
