package weightfmt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// TestDecodeKernelsMatchTwins decodes every format that has an AVX2 kernel
// (and bf16, widened by one) twice, through the kernel and through its Go
// twin (useAVX2 off), and
// wants the same bits for every value. The stored bytes and the scales
// are random bytes, so every code meets NaN, infinite, zero, subnormal
// and huge scales; the shapes take the kernels' whole-unit paths, their
// fallbacks (an FP8 block edge that is not a multiple of 8, a group that
// splits a word, a last partial scale block) and a single row.
func TestDecodeKernelsMatchTwins(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2 on this CPU: only the Go twins run")
	}
	rng := rand.New(rand.NewPCG(45, 6))
	type shape struct{ rows, cols int }
	cases := []struct {
		f      Format
		shapes []shape
	}{
		{MXFP4(NamingGptOss, u8, u8), []shape{{1, 32}, {3, 64}, {17, 2880}, {128, 7168}}},
		{MXFP4(NamingDeepSeek, safetensors.I8, safetensors.F8E8M0), []shape{{5, 96}}},
		{NVFP4ModelOpt(), []shape{{1, 16}, {7, 48}, {64, 2048}}},
		{NVFP4CT(), []shape{{9, 112}}},
		{Int4Pack(32, bf16), []shape{{1, 32}, {6, 64}, {64, 2048}}},
		{Int4Pack(128, bf16), []shape{{4, 256}}},
		{Int4Pack(8, safetensors.F16), []shape{{3, 24}}},
		{Int4Pack(32, f32), []shape{{5, 96}}},
		{Int4Pack(0, bf16), []shape{{3, 40}, {2, 12}}},
		{Int4Pack(12, bf16), []shape{{2, 24}}}, // a group that splits words: the Go loop
		{FP8Block(128, 128, false), []shape{{1, 128}, {130, 300}, {256, 7168}}},
		{FP8Block(128, 128, true), []shape{{129, 256}}},
		{FP8Block(64, 12, false), []shape{{70, 36}}}, // an edge that is not a multiple of 8: the Go loop
		{FP8Channel(bf16), []shape{{6, 64}, {3, 20}}},
		{FP8Tensor(f32), []shape{{4, 72}}},
		{MXFP8("", u8), []shape{{3, 64}}},
		{Plain(bf16), []shape{{1, 7}, {3, 21}, {16, 2048}}}, // bf16 widening, with a Go tail
	}
	for _, tc := range cases {
		for _, sh := range tc.shapes {
			t.Run(fmt.Sprintf("%s/%dx%d", tc.f, sh.rows, sh.cols), func(t *testing.T) {
				m := Matrix{Format: tc.f, Rows: int64(sh.rows), Cols: int64(sh.cols)}
				raw := randomBytes(rng, m.Bytes())
				var scale, global []byte
				if sc, ok := tc.f.Scale(); ok {
					gr, gc := m.ScaleShape()
					scale = randomBytes(rng, gr*gc*int64(sc.DType.Size()))
				}
				if _, ok := tc.f.(GlobalScaled); ok {
					global = binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(0.37)))
				}
				// Half the scale entries random bits, half ordinary values,
				// so most values are finite too.
				for i := 0; i+4 <= len(scale)/2; i += 4 {
					copy(scale[i:], binary.LittleEndian.AppendUint32(nil, 0x3C003C00|uint32(rng.IntN(0x300))))
				}
				decode := func(avx bool) []byte {
					defer func(was bool) { useAVX2 = was }(useAVX2)
					useAVX2 = avx
					dst := make([]float32, sh.rows*sh.cols)
					if err := DequantiseWeight(tc.f, raw, sh.rows, sh.cols, scale, global, dst); err != nil {
						t.Fatalf("avx2 %v: %v", avx, err)
					}
					out := make([]byte, 0, 4*len(dst))
					for _, v := range dst {
						out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
					}
					return out
				}
				want, got := decode(false), decode(true)
				if !bytes.Equal(got, want) {
					for i := 0; i < len(got); i += 4 {
						if !bytes.Equal(got[i:i+4], want[i:i+4]) {
							t.Fatalf("value %d (row %d, col %d): kernel %#08x, Go %#08x", i/4, i/4/sh.cols, i/4%sh.cols,
								binary.LittleEndian.Uint32(got[i:]), binary.LittleEndian.Uint32(want[i:]))
						}
					}
				}
				nan := 0
				for i := 0; i < len(got); i += 4 {
					if math.IsNaN(float64(math.Float32frombits(binary.LittleEndian.Uint32(got[i:])))) {
						nan++
					}
				}
				if nan == len(got)/4 {
					t.Errorf("every value NaN: the comparison proved little")
				}
			})
		}
	}
}
