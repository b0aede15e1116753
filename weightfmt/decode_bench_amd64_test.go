package weightfmt

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkDecodeKernels decodes one band of rows (what validate's CPU
// path decodes at a time) of each format with the AVX2 kernel and with
// its Go twin.
func BenchmarkDecodeKernels(b *testing.B) {
	rng := rand.New(rand.NewPCG(45, 7))
	for _, tc := range []struct {
		f          Format
		rows, cols int
	}{
		{MXFP4(NamingGptOss, u8, u8), 32, 2880},
		{NVFP4ModelOpt(), 32, 2048},
		{Int4Pack(32, bf16), 32, 2048},
		{FP8Block(128, 128, false), 128, 7168},
		{FP8Block(128, 128, false), 128, 512}, // a band that fits in L2: the decode alone
	} {
		m := Matrix{Format: tc.f, Rows: int64(tc.rows), Cols: int64(tc.cols)}
		raw, scale, global := randomPacked(rng, m)
		if _, ok := tc.f.(fp8Block); ok {
			scale = f32s(rep(0.01, len(scale)/4)...)
		}
		dst := make([]float32, tc.rows*tc.cols)
		for _, avx := range []bool{false, true} {
			name := fmt.Sprintf("%s/%dx%d/go", tc.f, tc.rows, tc.cols)
			if avx {
				name = fmt.Sprintf("%s/%dx%d/avx2", tc.f, tc.rows, tc.cols)
			}
			b.Run(name, func(b *testing.B) {
				defer func(was bool) { useAVX2 = was }(useAVX2)
				useAVX2 = avx && useAVX2
				b.SetBytes(int64(4 * len(dst)))
				for b.Loop() {
					if err := DequantiseWeight(tc.f, raw, tc.rows, tc.cols, scale, global, dst); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
