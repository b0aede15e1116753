package weightfmt

import (
	"encoding/binary"
	"fmt"

	"github.com/moeprep/moeprep/safetensors"
)

// QuantInt4Pack is the quantization of compressed-tensors' pack-quantized
// 4-bit integer weights (W4A16: Kimi-K2-Thinking and K2.5's routed
// experts, llm-compressor's W4A16 releases).
const QuantInt4Pack = "int4_pack"

// Int4DefaultGroup is the group size of llm-compressor's W4A16 preset
// (compressed-tensors quantization/quant_scheme.py, _int_wnam: group_size
// 128); Kimi's releases use 32, which their config states.
const Int4DefaultGroup = 128

// int4Pack is compressed-tensors' pack-quantized INT4, symmetric, from
// compressors/pack_quantized/ (base.py and helpers.py):
//
//   - weight_packed is I32 [rows, ceil(cols/8)]: pack_to_int32 adds
//     2^(bits-1) = 8 to each signed value q in [-8, 7] and packs the
//     unsigned u = q + 8 densely along the row, element i at bits
//     [4i, 4i+4) of the row's bit string, LSB first: element 8j+k of a row
//     is bits 4k..4k+3 of word j. A last partial word is padded with u = 0
//     (the padding is ignored here). unpack_from_int32 reverses it and
//     subtracts 8; llama.cpp's convert_hf_to_gguf.py dequant_packed
//     shifts by 0, 4, ..., 28 the same way.
//   - weight_scale [rows, cols/group] (strategy "group") or [rows, 1]
//     ("channel"), in the model's dtype (lifecycle/initialize.py:
//     scale_dtype = observed_dtype; BF16 for Kimi).
//   - weight_shape I64 [2], the unpacked [rows, cols].
//   - w = q * s[r, c/group] = (u - 8) * s (forward.py _dequantize:
//     x_q * scale, the zero point dropped for symmetric weights by
//     _remove_symmetric_zp).
//
// A group must divide the row: initialize_qparams only warns
// (strategy_cdiv), but _process_group raises when dequantising, so
// Dequantise refuses a partial group. Asymmetric weights (weight_zero_point,
// itself packed 8 to an I32 along the ROWS, pack_to_int32(packed_dim=0):
// w = (u - z) * s) and actorder "group" (weight_g_idx) are refused by New.
type int4Pack struct {
	group int64 // 0: one scale per row (strategy "channel")
	scale safetensors.DType
}

// Int4Pack is compressed-tensors' symmetric pack-quantized INT4 with
// groups of group columns (0: one scale per row) and scales of dtype scale.
func Int4Pack(group int64, scale safetensors.DType) Format {
	return int4Pack{group: max(group, 0), scale: scale}
}

func init() {
	c := specCheck{name: "compressed-tensors pack-quantized INT4", dtypes: []safetensors.DType{safetensors.I32},
		scales:  []safetensors.DType{safetensors.BF16, safetensors.F16, safetensors.F32},
		namings: []string{NamingCompressedTensors}}
	registerByConfig(QuantInt4Pack, func(s Spec) (Format, error) {
		_, sd, _, err := c.read(s)
		if err != nil {
			return nil, err
		}
		g := int64(Int4DefaultGroup)
		if s.Block != nil {
			// [1, group] for strategy "group", [1, 0] for "channel".
			if len(s.Block) != 2 || s.Block[0] != 1 || s.Block[1] < 0 {
				return nil, fmt.Errorf("%s weight_block_size %v: want [1, group size] or [1, 0] for one scale per row", c.name, s.Block)
			}
			g = s.Block[1]
		}
		return Int4Pack(g, sd), nil
	})
}

func (f int4Pack) Quantization() string     { return QuantInt4Pack }
func (f int4Pack) DType() safetensors.DType { return safetensors.I32 }

// Packing: eight 4-bit elements to an I32 word.
func (f int4Pack) Packing() (elems, bytes int64) { return 8, 4 }
func (f int4Pack) String() string                { return "INT4" }

func (f int4Pack) Scale() (Scale, bool) {
	return Scale{Suffix: "_scale", DType: f.scale, Block: [2]int64{1, f.group}}, true
}

// TensorsOf: x.weight is stored as x.weight_packed, x.weight_scale and
// x.weight_shape (compression_param_names).
func (f int4Pack) TensorsOf(weight string) Tensors {
	return Tensors{Weight: weight + "_packed", Scale: weight + "_scale", Shape: weight + "_shape"}
}

// Fold multiplies the scales (the packed integers cannot take a factor):
// by default only where they are F32.
func (f int4Pack) Fold() FoldRule {
	return FoldRule{Into: FoldScales, DType: f.scale, ByDefault: f.scale == safetensors.F32}
}

// Dequantise is (u - 8) times its group's scale, exact in float32 (a
// 4-bit integer times a bf16 or f16 scale fits; an F32 scale rounds once).
// compressed-tensors computes it in the scale's dtype, so its bf16 result
// is this value rounded once to bf16.
func (f int4Pack) Dequantise(raw []byte, rows, cols int, scale []byte, dst []float32) error {
	m := Matrix{Format: f, Rows: int64(rows), Cols: int64(cols)}
	if err := checkSizes(m, raw, scale, len(dst)); err != nil {
		return err
	}
	if err := wholeGroups(f, cols, f.group); err != nil || len(dst) == 0 {
		return err
	}
	_, gc := m.ScaleShape()
	s := make([]float32, len(scale)/f.scale.Size())
	if err := Decode(f.scale, scale, s); err != nil {
		return err
	}
	g := cols // the group of a "channel" scale is the whole row
	if f.group > 0 {
		g = int(f.group)
	}
	if n := rows * cols; useAVX2 && cols%8 == 0 && g%8 == 0 && cols%g == 0 && n/rows == cols &&
		len(raw) >= n/2 && len(s) >= n/g && len(dst) >= n {
		// Whole words to a group and whole groups to a row: the band is
		// rows*cols/g groups in a row (lengths checked again here for the
		// kernel, which reads and writes exactly those).
		int4Groups(&raw[0], &s[0], &dst[0], n/g, g/8)
		return nil
	}
	words := (cols + 7) / 8
	for r := range rows {
		row := raw[r*words*4 : (r+1)*words*4]
		out := dst[r*cols : (r+1)*cols]
		rs := s[r*int(gc) : (r+1)*int(gc)]
		if g%8 != 0 && g != cols {
			// A group that splits words (never written in practice):
			// element by element.
			for c := range cols {
				u := binary.LittleEndian.Uint32(row[4*(c/8):]) >> (4 * (c % 8)) & 0xF
				out[c] = float32(int32(u)-8) * rs[c/g]
			}
			continue
		}
		// Whole words to a group: the 16 values of its nibbles, one
		// lookup per element.
		var tab [16]float32
		for q, sc := range rs {
			for u := range tab {
				tab[u] = float32(u-8) * sc
			}
			c1 := min((q+1)*g, cols)
			for j := q * g / 8; j*8 < c1; j++ {
				w := binary.LittleEndian.Uint32(row[4*j:])
				if 8*j+8 > cols { // the row's last, partial word
					for k := range cols - 8*j {
						out[8*j+k] = tab[w>>(4*k)&0xF]
					}
					continue
				}
				o := out[8*j : 8*j+8 : 8*j+8]
				o[0], o[1], o[2], o[3] = tab[w&0xF], tab[w>>4&0xF], tab[w>>8&0xF], tab[w>>12&0xF]
				o[4], o[5], o[6], o[7] = tab[w>>16&0xF], tab[w>>20&0xF], tab[w>>24&0xF], tab[w>>28]
			}
		}
	}
	return nil
}

// exactValues is (u - 8) times its group's scale in float64, where the
// largest bf16 scale times -8 is a value, not float32's infinity; finite
// unless the scale is not (exactDequantiser).
func (f int4Pack) exactValues(raw []byte, rows, cols int, scale, _ []byte) (func(int) (float64, bool), error) {
	m := Matrix{Format: f, Rows: int64(rows), Cols: int64(cols)}
	if err := checkSizes(m, raw, scale, rows*cols); err != nil {
		return nil, err
	}
	if err := wholeGroups(f, cols, f.group); err != nil {
		return nil, err
	}
	_, gc := m.ScaleShape()
	s := make([]float32, len(scale)/f.scale.Size())
	if err := Decode(f.scale, scale, s); err != nil {
		return nil, err
	}
	g := max(int(f.group), 1)
	if f.group == 0 {
		g = max(cols, 1) // "channel": one scale a row
	}
	words := (cols + 7) / 8
	return func(i int) (float64, bool) {
		r, c := i/cols, i%cols
		u := binary.LittleEndian.Uint32(raw[4*(r*words+c/8):]) >> (4 * (c % 8)) & 0xF
		k := s[r*int(gc)+c/g]
		return float64(int32(u)-8) * float64(k), finite32(k)
	}, nil
}

// RequantRule is compressed-tensors' symmetric INT4 rule (requant.go):
// scale = amax / 7.5 per group, codes in [-8, 7].
func (f int4Pack) RequantRule() RequantRule {
	return RequantRule{Name: "absmax-int4", Divisor: 7.5, Lo: -8, Hi: 7, MinScale: MinRequantScale, Rounding: RoundingNearestEven}
}

// encodeRow packs the row's codes, u = q + 8, eight to a word, the last
// partial word padded with u = 0 as pack_to_int32 pads. A word's eight
// share one scale where groups are whole words (every group size
// compressed-tensors writes), found once a word rather than by a division
// an element.
func (f int4Pack) encodeRow(vals, scales []float32, bc int, dst []byte) {
	for j := 0; 8*j < len(vals); j++ {
		var word uint32
		word8 := vals[8*j : min(8*j+8, len(vals))]
		if bc%8 == 0 {
			s := scales[8*j/bc]
			for k, v := range word8 {
				word |= uint32(roundSmall(clamp32(v/s, -8, 7))+8) << (4 * k)
			}
		} else {
			for k, v := range word8 {
				word |= uint32(roundSmall(clamp32(v/scales[(8*j+k)/bc], -8, 7))+8) << (4 * k)
			}
		}
		binary.LittleEndian.PutUint32(dst[4*j:], word)
	}
}

// roundSmall is x rounded to the nearest integer, ties to even, for |x| <
// 2^22 (a clamped INT4 code): adding 1.5 x 2^23 in float32 leaves no
// fraction bits, so the addition rounds x as the FPU rounds, to nearest
// even, and subtracting it again is exact. math.RoundToEven's result, at a
// fraction of its cost (TestRoundSmall).
func roundSmall(x float32) int32 {
	const magic = 0x1.8p23
	return int32((x + magic) - magic)
}
