package weightfmt

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// New reads the newer formats' Specs: their defaults, the scale dtype
// and naming a config states, their blocks; and refuses what they cannot
// carry with a line naming it (an asymmetric zero point, weight_g_idx, a
// foreign block, dtype or naming).
func TestNewQuantisedFormats(t *testing.T) {
	checkNew(t, []newCase{
		{"fp8 channel default", Spec{Quantization: QuantFP8Channel}, FP8Channel(bf16), ""},
		{"fp8 channel F32 (vLLM/ModelOpt)", Spec{Quantization: QuantFP8Channel, DType: safetensors.F8E4M3, ScaleDType: f32, Block: []int64{1, 0}}, FP8Channel(f32), ""},
		{"fp8 tensor default", Spec{Quantization: QuantFP8Tensor}, FP8Tensor(f32), ""},
		{"fp8 tensor BF16 (compressed-tensors)", Spec{Quantization: QuantFP8Tensor, ScaleDType: bf16, Naming: NamingCompressedTensors}, FP8Tensor(bf16), ""},
		{"fp8 channel with a block", Spec{Quantization: QuantFP8Channel, Block: []int64{128, 128}}, nil, "weight_block_size [128 128]: want [1 0]"},
		{"fp8 channel E5M2", Spec{Quantization: QuantFP8Channel, DType: safetensors.F8E5M2}, nil, "weight dtype F8_E5M2"},
		{"fp8 channel E8M0 scales", Spec{Quantization: QuantFP8Channel, ScaleDType: safetensors.F8E8M0}, nil, "scale dtype F8_E8M0"},
		{"fp8 tensor gpt-oss naming", Spec{Quantization: QuantFP8Tensor, Naming: NamingGptOss}, nil, `named as "gpt-oss"`},
		{"int4 default group", Spec{Quantization: QuantInt4Pack}, Int4Pack(Int4DefaultGroup, bf16), ""},
		{"int4 Kimi group 32", Spec{Quantization: QuantInt4Pack, DType: safetensors.I32, Block: []int64{1, 32}}, Int4Pack(32, bf16), ""},
		{"int4 channel", Spec{Quantization: QuantInt4Pack, Block: []int64{1, 0}, ScaleDType: safetensors.F16}, Int4Pack(0, safetensors.F16), ""},
		{"int4 asymmetric", Spec{Quantization: QuantInt4Pack, ZeroPoint: true}, nil, "zero point (asymmetric, weight_zero_point) is not supported"},
		{"int4 actorder group", Spec{Quantization: QuantInt4Pack, GroupIndex: true}, nil, "weight_g_idx"},
		{"int4 square block", Spec{Quantization: QuantInt4Pack, Block: []int64{32, 32}}, nil, "want [1, group size]"},
		{"int4 U8 weights", Spec{Quantization: QuantInt4Pack, DType: u8}, nil, "weight dtype U8"},
		{"mxfp4 gpt-oss default", Spec{Quantization: QuantMXFP4}, MXFP4(NamingGptOss, u8, u8), ""},
		{"mxfp4 compressed-tensors", Spec{Quantization: QuantMXFP4, Naming: NamingCompressedTensors, Block: []int64{1, 32}}, MXFP4(NamingCompressedTensors, u8, u8), ""},
		{"mxfp4 DeepSeek-V4", Spec{Quantization: QuantMXFP4, Naming: NamingDeepSeek, DType: safetensors.I8, ScaleDType: safetensors.F8E8M0}, MXFP4(NamingDeepSeek, safetensors.I8, safetensors.F8E8M0), ""},
		{"mxfp4 group 16", Spec{Quantization: QuantMXFP4, Block: []int64{1, 16}}, nil, "want [1 32]"},
		{"mxfp4 asymmetric", Spec{Quantization: QuantMXFP4, ZeroPoint: true}, nil, "zero point"},
		{"nvfp4 modelopt", Spec{Quantization: QuantNVFP4ModelOpt, DType: u8, Block: []int64{1, 16}}, NVFP4ModelOpt(), ""},
		{"nvfp4 compressed-tensors", Spec{Quantization: QuantNVFP4CT, Naming: NamingCompressedTensors}, NVFP4CT(), ""},
		{"nvfp4 compressed-tensors named as modelopt", Spec{Quantization: QuantNVFP4CT, Naming: NamingModelOpt}, nil, `named as "modelopt"`},
		{"nvfp4 BF16 block scales", Spec{Quantization: QuantNVFP4ModelOpt, ScaleDType: bf16}, nil, "scale dtype BF16"},
		{"nvfp4 group 32", Spec{Quantization: QuantNVFP4CT, Block: []int64{1, 32}}, nil, "want [1 16]"},
	})
}

// The tensors of a weight as each producer names them: plain and FP8
// weights keep today's names; compressed-tensors packs x.weight into
// x.weight_packed (compression_param_names), gpt-oss stores the
// gate_up_proj stack as gate_up_proj_blocks/_scales (transformers
// Mxfp4GptOssExperts), DeepSeek-V4 names x.weight's scale x.scale,
// ModelOpt's per-tensor scale is x.weight_scale_2.
func TestTensorsOf(t *testing.T) {
	const w, stack = "model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.1.mlp.experts.gate_up_proj"
	for _, tc := range []struct {
		f      Format
		weight string
		want   Tensors
	}{
		{Plain(bf16), w, Tensors{Weight: w}},
		{FP8Block(128, 128, false), w, Tensors{Weight: w, Scale: w + "_scale_inv"}},
		{FP8Block(128, 128, false), stack, Tensors{Weight: stack, Scale: stack + "_scale_inv"}},
		{FP8Channel(bf16), w, Tensors{Weight: w, Scale: w + "_scale"}},
		{FP8Tensor(f32), w, Tensors{Weight: w, Scale: w + "_scale"}},
		{Int4Pack(32, bf16), w, Tensors{Weight: w + "_packed", Scale: w + "_scale", Shape: w + "_shape"}},
		{MXFP4(NamingGptOss, u8, u8), stack, Tensors{Weight: stack + "_blocks", Scale: stack + "_scales"}},
		{MXFP4(NamingCompressedTensors, u8, u8), w, Tensors{Weight: w + "_packed", Scale: w + "_scale"}},
		{MXFP4(NamingDeepSeek, safetensors.I8, safetensors.F8E8M0), "layers.3.ffn.experts.7.w1.weight",
			Tensors{Weight: "layers.3.ffn.experts.7.w1.weight", Scale: "layers.3.ffn.experts.7.w1.scale"}},
		{MXFP4(NamingDeepSeek, safetensors.I8, safetensors.F8E8M0), stack, Tensors{Weight: stack, Scale: stack + "_scale"}},
		{NVFP4ModelOpt(), w, Tensors{Weight: w, Scale: w + "_scale", Global: w + "_scale_2",
			Input: "model.layers.1.mlp.experts.0.gate_proj.input_scale"}},
		{NVFP4ModelOpt(), stack, Tensors{Weight: stack, Scale: stack + "_scale", Global: stack + "_scale_2", Input: stack + "_input_scale"}},
		{NVFP4CT(), w, Tensors{Weight: w + "_packed", Scale: w + "_scale", Global: w + "_global_scale",
			Input: "model.layers.1.mlp.experts.0.gate_proj.input_global_scale"}},
		{NVFP4CT(), stack, Tensors{Weight: stack + "_packed", Scale: stack + "_scale", Global: stack + "_global_scale",
			Input: stack + "_input_global_scale"}},
	} {
		if got := TensorsOf(tc.f, tc.weight); got != tc.want {
			t.Errorf("%s %s: %+v, want %+v", tc.f, tc.weight, got, tc.want)
		}
	}
}

// Scale.Name keeps naming FP8 blocks' and plain formats' scales, and the
// formats whose names are suffixes of the plain weight name agree with
// TensorsOf (what today's callers and check.go's Scaled loop rely on).
func TestScaleNameAgreesWithTensorsOf(t *testing.T) {
	const w = "x.weight"
	for _, f := range []Format{FP8Block(128, 128, true), FP8Channel(bf16), FP8Tensor(f32), Int4Pack(32, bf16),
		MXFP4(NamingCompressedTensors, u8, u8), NVFP4ModelOpt(), NVFP4CT()} {
		s, _ := f.Scale()
		if got, want := s.Name(w), TensorsOf(f, w).Scale; got != want {
			t.Errorf("%s: Scale.Name %s, TensorsOf %s", f, got, want)
		}
	}
}

// Where a factor goes: the float scales of FP8 per channel/tensor and
// INT4 (by default only when they are F32), nowhere for E8M0 scales or
// NVFP4 (whose exact home, the per-tensor scale, FoldRule cannot name).
func TestNewFormatsFoldRules(t *testing.T) {
	checkFold(t, []foldCase{
		{FP8Channel(bf16), FoldScales, bf16, false, ""},
		{FP8Channel(f32), FoldScales, f32, true, ""},
		{FP8Tensor(f32), FoldScales, f32, true, ""},
		{Int4Pack(32, bf16), FoldScales, bf16, false, ""},
		{MXFP4(NamingGptOss, u8, u8), FoldNowhere, "", false, "the MXFP4 scales are E8M0 (powers of two) and cannot absorb rsf 2.5 exactly"},
		{NVFP4ModelOpt(), FoldNowhere, "", false, "the NVFP4 block scales are E4M3 and would round rsf 2.5; it belongs in the per-tensor weight_scale_2, which moeprep does not fold into yet"},
		{NVFP4CT(), FoldNowhere, "", false, "the NVFP4 block scales are E4M3 and would round rsf 2.5; it belongs in the per-tensor weight_global_scale, which moeprep does not fold into yet"},
	})
	if g, ok := GlobalOf(NVFP4CT()); !ok || !g.Divides || g.DType != f32 {
		t.Errorf("compressed-tensors NVFP4 global scale %+v %v: want an F32 divisor", g, ok)
	}
	if g, ok := GlobalOf(NVFP4ModelOpt()); !ok || g.Divides {
		t.Errorf("ModelOpt NVFP4 global scale %+v %v: want an F32 multiplier", g, ok)
	}
	if _, ok := GlobalOf(FP8Block(128, 128, false)); ok {
		t.Error("FP8 blocks have no global scale")
	}
}

// Shapes, grids and exact splits of the packed formats for a [256, 7168]
// weight (and ragged sizes): the stored tensor counts dtype units, the
// grid whole groups, a column split must keep whole packing units and
// whole groups, a row split is always exact (one scale row per row).
func TestPackedShapesAndSplits(t *testing.T) {
	for _, tc := range []struct {
		f               Format
		rows, cols      int64
		shape           []int64
		gridR, gridC    int64
		colOK, colNotOK []int64
	}{
		{Int4Pack(32, bf16), 256, 7168, []int64{256, 896}, 256, 224, []int64{0, 32, 7136}, []int64{8, 16, 33}},
		{Int4Pack(0, bf16), 256, 7168, []int64{256, 896}, 256, 1, []int64{0, 8, 7160}, []int64{4, 7}},
		{Int4Pack(0, bf16), 3, 12, []int64{3, 2}, 3, 1, []int64{8}, []int64{4}},
		{MXFP4(NamingGptOss, u8, u8), 256, 7168, []int64{256, 3584}, 256, 224, []int64{0, 32, 64}, []int64{2, 16, 48}},
		{NVFP4ModelOpt(), 256, 7168, []int64{256, 3584}, 256, 448, []int64{0, 16, 48}, []int64{2, 8, 17}},
		{FP8Channel(bf16), 256, 7168, []int64{256, 7168}, 256, 1, []int64{1, 100}, nil},
		{FP8Tensor(f32), 256, 7168, []int64{256, 7168}, 1, 1, []int64{1, 100}, nil},
	} {
		m := Matrix{Format: tc.f, Rows: tc.rows, Cols: tc.cols}
		name := fmt.Sprintf("%s %dx%d", tc.f, tc.rows, tc.cols)
		if !slices.Equal(m.Shape(), tc.shape) {
			t.Errorf("%s: shape %v, want %v", name, m.Shape(), tc.shape)
		}
		if r, c := m.ScaleShape(); r != tc.gridR || c != tc.gridC {
			t.Errorf("%s: grid %dx%d, want %dx%d", name, r, c, tc.gridR, tc.gridC)
		}
		for _, r := range []int64{0, 1, 7, 100} {
			if !m.RowSplitExact(r) {
				t.Errorf("%s: row split at %d not exact", name, r)
			}
		}
		for _, c := range tc.colOK {
			if !m.ColSplitExact(c) {
				t.Errorf("%s: column split at %d not exact", name, c)
			}
		}
		for _, c := range tc.colNotOK {
			if m.ColSplitExact(c) {
				t.Errorf("%s: column split at %d called exact", name, c)
			}
		}
	}
}

// Row blocks, column blocks on packing-unit edges, experts and the whole
// of the packed formats address exactly the bytes, scale entries and
// global scale that indexing by hand gives.
func TestPackedSlicesAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 1))
	for _, tc := range []struct {
		f     Format
		sizes [][2]int64
	}{
		{Int4Pack(32, bf16), [][2]int64{{5, 64}, {1, 96}}},
		{Int4Pack(8, f32), [][2]int64{{6, 40}}},
		{Int4Pack(0, bf16), [][2]int64{{4, 12}, {3, 7}}}, // partial last words
		{MXFP4(NamingGptOss, u8, u8), [][2]int64{{4, 96}, {1, 32}}},
		{MXFP4(NamingDeepSeek, safetensors.I8, safetensors.F8E8M0), [][2]int64{{3, 64}}},
		{NVFP4ModelOpt(), [][2]int64{{5, 48}}},
		{NVFP4CT(), [][2]int64{{2, 32}}},
		{FP8Channel(bf16), [][2]int64{{7, 11}}},
		{FP8Tensor(f32), [][2]int64{{7, 11}}},
	} {
		for _, size := range tc.sizes {
			rows, cols := size[0], size[1]
			newStack(rng, tc.f, 3, rows, cols).checkSlices(t, rng, fmt.Sprintf("%s %dx%d", tc.f, rows, cols), 8)
		}
	}
}

// randomPacked is a random weight and scale grid (and global scale) of a
// packed format whose values are finite and non-zero scales.
func randomPacked(rng *rand.Rand, m Matrix) (raw, scale, global []byte) {
	raw = randomBytes(rng, m.Bytes())
	sc, _ := m.Format.Scale()
	gr, gc := m.ScaleShape()
	switch sc.DType {
	case safetensors.F8E4M3: // positive finite E4M3 block scales
		scale = make([]byte, gr*gc)
		for i := range scale {
			scale[i] = byte(0x20 + rng.IntN(0x50))
		}
	case u8, safetensors.F8E8M0: // E8M0 around 1
		scale = make([]byte, gr*gc)
		for i := range scale {
			scale[i] = byte(110 + rng.IntN(30))
		}
	default:
		v := make([]float64, gr*gc)
		for i := range v {
			v[i] = float64(1+rng.IntN(255)) / 1024
		}
		if sc.DType == f32 {
			scale = f32s(func() []float32 {
				out := make([]float32, len(v))
				for i, x := range v {
					out[i] = float32(x)
				}
				return out
			}()...)
		} else {
			scale = bf16s(v...)
		}
	}
	if m.GlobalBytes() > 0 {
		global = f32s(float32(rng.Float64()*3 + 0.1))
	}
	return raw, scale, global
}

// Cutting a packed weight at exact splits (rows, and columns on group
// edges) and dequantising each piece with the scale entries and global
// scale its Slice names gives the pieces of the whole weight dequantised
// at once: the slicing and the arithmetic agree on where every nibble and
// scale sits.
func TestPackedPiecesMatchWhole(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 2))
	for _, f := range []Format{Int4Pack(32, bf16), Int4Pack(0, bf16), MXFP4(NamingGptOss, u8, u8), NVFP4ModelOpt(), NVFP4CT(), FP8Channel(bf16), FP8Tensor(f32)} {
		m := Matrix{Format: f, Rows: 6, Cols: 128}
		raw, scale, global := randomPacked(rng, m)
		checkPieces(t, m, raw, scale, global, [][2]int64{{0, 3}, {3, 3}, {1, 4}}, [][2]int64{{0, 64}, {64, 64}, {32, 64}})
	}
}

// fuzzFormats are the formats the fuzzer picks from.
var fuzzFormats = []Format{
	Int4Pack(32, bf16), Int4Pack(0, f32), MXFP4(NamingGptOss, u8, u8), NVFP4ModelOpt(), NVFP4CT(),
	FP8Channel(bf16), FP8Tensor(f32),
}

// Dequantise of hostile sizes and lengths returns an error or fills
// exactly rows*cols outputs; it never panics.
func FuzzDequantise(f *testing.F) {
	f.Add(uint8(0), 2, 32, make([]byte, 32), bf16s(1, 2), []byte(nil), uint16(64))
	f.Add(uint8(2), 1, 64, make([]byte, 32), []byte{127, 128}, []byte(nil), uint16(64))
	f.Add(uint8(3), 1, 16, make([]byte, 8), []byte{0x38}, f32s(1), uint16(16))
	f.Add(uint8(4), 1<<40, 1<<40, []byte{1}, []byte{2}, f32s(1), uint16(0))
	f.Add(uint8(1), 1<<62, 0, []byte(nil), []byte(nil), []byte(nil), uint16(0))
	f.Add(uint8(5), 3, 5, make([]byte, 15), bf16s(1, 2, 3), []byte(nil), uint16(15))
	f.Add(uint8(6), -1, -7, []byte{1, 2}, []byte{3}, []byte{4}, uint16(7))
	f.Add(uint8(2), 0, math.MaxInt, []byte(nil), []byte(nil), []byte(nil), uint16(0))
	f.Add(uint8(2), 1<<62, 0, []byte(nil), []byte(nil), []byte(nil), uint16(0)) // once a 2^62-row loop
	f.Fuzz(func(t *testing.T, which uint8, rows, cols int, raw, scale, global []byte, ndst uint16) {
		fm := fuzzFormats[int(which)%len(fuzzFormats)]
		dst := make([]float32, ndst)
		err := DequantiseWeight(fm, raw, rows, cols, scale, global, dst)
		if err == nil && (rows < 0 || cols < 0 || rows*cols != len(dst)) {
			t.Fatalf("%s: %dx%d into %d outputs accepted", fm, rows, cols, len(dst))
		}
		if err := fm.Dequantise(raw, rows, cols, scale, dst); err == nil {
			if _, global := GlobalOf(fm); global {
				t.Fatalf("%s: Dequantise without the global scale succeeded", fm)
			}
		}
	})
}

// Scaled keeps listing the formats a weight dtype identifies on its own
// (FP8 blocks: F8_E4M3 with weight_scale_inv), which family's checks and
// validate's loaders name for a checkpoint whose config names none; the
// newer formats share dtypes (U8 is MXFP4 or NVFP4) and are listed by
// AllScaled only, so those callers' refusals of U8 or I32 weights stay as
// they were.
func TestAllScaled(t *testing.T) {
	var got []string
	for _, f := range AllScaled() {
		got = append(got, f.Quantization())
	}
	want := []string{QuantFP8Block, QuantFP8Channel, QuantFP8Tensor, QuantInt4Pack, QuantMXFP4, QuantMXFP8, QuantNVFP4CT, QuantNVFP4ModelOpt}
	if !slices.Equal(got, want) {
		t.Errorf("AllScaled() = %v, want %v", got, want)
	}
	for _, d := range []safetensors.DType{u8, safetensors.I32, safetensors.I8} {
		if f, ok := ScaledDType(d); ok {
			t.Errorf("ScaledDType(%s) = %s: a config must name it", d, f)
		}
	}
}

// BenchmarkDequantise decodes one DeepSeek-sized expert weight [2048, 7168]
// of each format (bytes/s counts the stored weight bytes).
func BenchmarkDequantise(b *testing.B) {
	rng := rand.New(rand.NewPCG(29, 3))
	for _, f := range []Format{Int4Pack(32, bf16), MXFP4(NamingGptOss, u8, u8), NVFP4ModelOpt(), NVFP4CT(), FP8Channel(bf16), FP8Block(128, 128, false)} {
		const rows, cols = 2048, 7168
		m := Matrix{Format: f, Rows: rows, Cols: cols}
		raw, scale, global := randomPacked(rng, m)
		if _, ok := f.(fp8Block); ok {
			scale = f32s(rep(0.01, len(scale)/4)...)
		}
		dst := make([]float32, rows*cols)
		b.Run(f.String(), func(b *testing.B) {
			b.SetBytes(m.Bytes())
			for b.Loop() {
				if err := DequantiseWeight(f, raw, rows, cols, scale, global, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// ContractSpec: what a contract records beyond quantization, dtype and
// block is what differs from the quantization's defaults (gpt-oss's U8
// scales and names for MXFP4); New builds the format again from it.
func TestContractSpec(t *testing.T) {
	for _, tc := range []struct {
		f             Format
		scale, naming string
	}{
		{Plain(bf16), "", ""},
		{FP8Block(128, 128, false), "", ""},
		{MXFP4(NamingGptOss, u8, u8), "", ""},
		{MXFP4(NamingCompressedTensors, u8, u8), "", NamingCompressedTensors},
		{MXFP4(NamingDeepSeek, safetensors.I8, safetensors.F8E8M0), "F8_E8M0", NamingDeepSeek},
		{NVFP4CT(), "", ""},
		{Int4Pack(32, bf16), "", ""},
		{Int4Pack(32, f32), "F32", ""},
		{MXFP8(NamingModelOpt, u8), "", ""},
		{MXFP8(NamingMiniMax, u8), "", NamingMiniMax},
		{MXFP8(NamingMiniMax, safetensors.F8E8M0), "F8_E8M0", NamingMiniMax},
	} {
		sd, n := ContractSpec(tc.f)
		if string(sd) != tc.scale || n != tc.naming {
			t.Errorf("%s: %q %q, want %q %q", tc.f, sd, n, tc.scale, tc.naming)
		}
		b, _ := tc.f.Scale()
		var block []int64
		if _, ok := tc.f.Scale(); ok {
			block = b.Block[:]
		}
		again, err := New(Spec{Quantization: tc.f.Quantization(), DType: tc.f.DType(), Block: block, ScaleDType: sd, Naming: n})
		if err != nil || again != tc.f {
			t.Errorf("%s: New from the contract's fields gives %v (%v)", tc.f, again, err)
		}
	}
}
