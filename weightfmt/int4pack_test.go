package weightfmt

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// le32 is little-endian I32 words, as weight_packed stores them.
func le32(words ...uint32) []byte {
	b := make([]byte, 0, 4*len(words))
	for _, w := range words {
		b = binary.LittleEndian.AppendUint32(b, w)
	}
	return b
}

// The word 0x1F087E39 holds, LSB first, the nibbles u = 9, 3, 14, 7, 8, 0,
// 15, 1 of elements 0..7 (compressed-tensors pack_quantized/helpers.py:
// element i at bits 4i..4i+3), which are q = u - 8 = 1, -5, 6, -1, 0, -8,
// 7, -7 (the offset 2^(bits-1) that pack_to_int32 adds). Read from the top
// nibble down, the same word would give -7, 7, -8, 0, -1, 6, -5, 1.
const int4Word = 0x1F087E39

var int4WordQ = []float32{1, -5, 6, -1, 0, -8, 7, -7}

func times(q []float32, s float32) []float32 {
	out := make([]float32, len(q))
	for i, v := range q {
		out[i] = v * s
	}
	return out
}

func TestInt4PackDequantise(t *testing.T) {
	checkDequantise(t, []dequantCase{
		{"one word: nibble order and the offset of 8", Int4Pack(8, safetensors.BF16), 1, 8,
			le32(int4Word), bf16s(0.5),
			[]float32{0.5, -2.5, 3, -0.5, 0, -4, 3.5, -3.5}},
		{"negative scale", Int4Pack(8, safetensors.BF16), 1, 8,
			le32(int4Word), bf16s(-2),
			[]float32{-2, 10, -12, 2, 0, 16, -14, 14}},
		// Group 8 over 16 columns: word j of a row takes scale j.
		// 0x76543210 is u = 0..7 (q = -8..-1), 0xFFFFFFFF all q = 7, 0 all q = -8.
		{"two groups, two rows", Int4Pack(8, safetensors.BF16), 2, 16,
			le32(int4Word, 0x76543210, 0xFFFFFFFF, 0x00000000), bf16s(0.5, 2, -0.25, 1),
			slices.Concat(times(int4WordQ, 0.5), []float32{-16, -14, -12, -10, -8, -6, -4, -2},
				rep(-1.75, 8), rep(-8, 8))},
		// strategy "channel": one scale per row, and 12 columns end in a
		// half-used word whose top four nibbles (0xABCD) are padding.
		{"channel, partial last word", Int4Pack(0, safetensors.BF16), 2, 12,
			le32(int4Word, 0xABCD6789, 0x00000008, 0xFFFF0000), bf16s(0.5, 0.125),
			slices.Concat(times(int4WordQ, 0.5), []float32{0.5, 0, -0.5, -1},
				[]float32{0}, rep(-1, 7), rep(-1, 4))},
		// A group of 4 splits a word (compressed-tensors allows any group
		// size that divides the row).
		{"group of 4 inside a word", Int4Pack(4, safetensors.BF16), 1, 8,
			le32(int4Word), bf16s(0.5, 2),
			[]float32{0.5, -2.5, 3, -0.5, 0, -16, 14, -14}},
		{"F32 scales", Int4Pack(8, safetensors.F32), 1, 8,
			le32(int4Word), f32s(0.1),
			times(int4WordQ, 0.1)},
	})
}

// Wrong sizes are refused with an error, never a panic: a group that does
// not divide the row (compressed-tensors' _process_group raises), short or
// long weights and grids, hostile dimensions.
func TestInt4PackRefusals(t *testing.T) {
	g8 := Int4Pack(8, safetensors.BF16)
	checkRefusals(t, []refusal{
		{"partial group", g8, 1, 12, le32(1, 2), bf16s(1, 1), 12, "whole number of 8-column"},
		{"row narrower than a group", Int4Pack(32, safetensors.BF16), 1, 8, le32(1), bf16s(1), 8, "whole number of 32-column"},
		{"short weight", g8, 2, 8, le32(1), bf16s(1, 1), 16, "weight bytes"},
		{"long weight", g8, 1, 8, le32(1, 2), bf16s(1), 8, "weight bytes"},
		{"unaligned weight", g8, 1, 8, []byte{1, 2, 3}, bf16s(1), 8, "weight bytes"},
		{"short grid", g8, 1, 16, le32(1, 2), bf16s(1), 16, "scale bytes"},
		{"grid of F32 for BF16", g8, 1, 8, le32(1), f32s(1), 8, "scale bytes"},
		{"short output", g8, 1, 8, le32(1), bf16s(1), 7, "outputs"},
		{"negative rows", g8, -1, 8, nil, nil, 0, "outputs"},
		{"overflowing size", g8, 1 << 40, 1 << 40, nil, nil, 0, "outputs"},
		{"overflowing grid", Int4Pack(0, safetensors.BF16), 1 << 62, 0, nil, nil, 0, "scale bytes"},
	})
}
