package weightfmttest

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// Each format's rule, as its producer defines it, is stated once below
// (the value functions passed to build), on the element and scale codes
// of values.go. A case's Want is that rule's value rounded once to
// float32.

var (
	negZero = math.Copysign(0, -1)
	inf     = math.Inf(1)
	nan     = math.NaN()
)

// scaleSpecials are the scale values every scaled format's cases try,
// where the scale dtype holds them: signs and zeros, infinities and NaN,
// values whose products tie in bf16 and f16, and subnormal scales of each
// dtype (with products that are subnormal or vanish in float32). Every
// product of a finite element with them is finite in f16, so that a
// decoder that refuses an overflow (Decoder) still has every value of
// these cases compared; overflowScales have cases of their own.
var scaleSpecials = []float64{
	1, -1, 0, negZero, inf, math.Inf(-1), nan,
	1 + 0x1p-8, 1 + 3*0x1p-8, 1 + 0x1p-7, 1 + 0x1p-10, -3.0 / 128, 96,
	0x1p-14, 0x1p-20, 0x1p-24, 0x1p-133, 0x1p-140, 0x1p-149,
}

// overflowScales are large scales whose products overflow: f16 (256 and
// 65504 times E4M3's 448), bf16 but not float32 (448 times the last), and
// float32 (448 times 2^126; -8 times bf16's largest value).
var overflowScales = []float64{256, 65504, 0x1p126, 0x1.fep127, float64(float32(3.40e38 / 448))}

// randomScale is a scale every float scale dtype holds exactly: an 8-bit
// significand times a power of two around 2^lo .. 2^(lo+span).
func randomScale(r *rand.Rand, lo, span int) float64 {
	v := math.Ldexp(float64(128+r.IntN(128)), lo-7+r.IntN(span))
	if r.IntN(4) == 0 {
		v = -v
	}
	return v
}

// scaleGrid stores n scale values as d: specials first (those d holds),
// then random ones.
func scaleGrid(r *rand.Rand, d safetensors.DType, n int, specials []float64) ([]byte, []float64) {
	b := make([]byte, n*d.Size())
	vals := make([]float64, 0, n)
	for _, x := range specials {
		if len(vals) == n {
			break
		}
		if encodeExact(d, x, b, len(vals)) {
			vals = append(vals, x)
		}
	}
	for len(vals) < n {
		x := randomScale(r, -10, 12)
		if !encodeExact(d, x, b, len(vals)) {
			panic("weightfmttest: a random scale is not exact")
		}
		vals = append(vals, x)
	}
	return b, vals
}

// held is how many of xs dtype d holds exactly.
func held(d safetensors.DType, xs []float64) int {
	b := make([]byte, 8)
	n := 0
	for _, x := range xs {
		if encodeExact(d, x, b, 0) {
			n++
		}
	}
	return n
}

// build makes a case from its weight and value(r, c): element (r, c)'s
// exact value and whether the stored values it comes from are finite.
func build(name string, w Weight, value func(r, c int) (float64, bool)) Case {
	c := Case{Name: name, Weight: w, Want: make([]float32, w.Rows*w.Cols), Finite: make([]bool, w.Rows*w.Cols)}
	for r := range w.Rows {
		for col := range w.Cols {
			x, fin := value(r, col)
			c.Want[r*w.Cols+col], c.Finite[r*w.Cols+col] = f32(x), fin
		}
	}
	return c
}

// everyCodeBytes is rows rows of n bytes: each row's first 256 bytes are
// every byte value, rotated by 37 a row (so that every code meets every
// row's scales), the rest random.
func everyCodeBytes(r *rand.Rand, rows, n int) []byte {
	b := make([]byte, rows*n)
	for i := range rows {
		for j := range n {
			b[i*n+j] = byte(r.IntN(256))
			if j < 256 {
				b[i*n+j] = byte(j + 37*i)
			}
		}
	}
	return b
}

// plainCase is a weight of the codes of plain dtype d (padded with
// zeros to rows of 256), each decoding to its value.
func plainCase(name string, d safetensors.DType, codes []uint32) Case {
	const cols = 256
	rows := (len(codes) + cols - 1) / cols
	es := d.Size()
	raw := make([]byte, rows*cols*es)
	for i, c := range codes {
		if es == 4 {
			binary.LittleEndian.PutUint32(raw[4*i:], c)
		} else {
			binary.LittleEndian.PutUint16(raw[2*i:], uint16(c))
		}
	}
	w := Weight{Format: weightfmt.Plain(d), Rows: rows, Cols: cols, Raw: raw}
	return build(name, w, func(r, c int) (float64, bool) {
		var v float64
		switch i := 2 * (r*cols + c); d {
		case safetensors.BF16:
			v = bf16(binary.LittleEndian.Uint16(raw[i:]))
		case safetensors.F16:
			v = f16(binary.LittleEndian.Uint16(raw[i:]))
		default:
			v = float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[2*i:])))
		}
		return v, finite(v)
	})
}

// PlainCases: every BF16 and every F16 code; F32 values at zero, the
// subnormals' edges, the infinities and NaN, and values at the ties of
// BF16 and F16; values that overflow F16, or BF16, when rounded to them,
// in cases of their own.
func PlainCases() []Case {
	var cs []Case
	var small, large []uint32 // BF16 codes finite in F16 (or not finite), and past it
	f16Max := float64(65520)  // half a step past 65504 rounds to infinity
	for c := range uint32(1 << 16) {
		if v := bf16(uint16(c)); finite(v) && math.Abs(v) >= f16Max {
			large = append(large, c)
		} else {
			small = append(small, c)
		}
	}
	all16 := make([]uint32, 1<<16)
	for c := range all16 {
		all16[c] = uint32(c)
	}
	r := rand.New(rand.NewPCG(1, 2))
	edges := []uint32{
		0, 0x80000000, 0x3f800000, 0xbf800000, // 0, -0, 1, -1
		0x00000001, 0x007fffff, 0x00800000, 0x80000001, // subnormal edges, smallest normal
		0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, // infinities, NaNs
		0x3f808000, 0x3f818000, 0x3f801000, 0x3f803000, // 1 + 2^-8, 1 + 3*2^-8 (bf16 ties), 1 + 2^-11, 1 + 3*2^-11 (f16 ties)
		0x477fefff, 0xc77fefff, // just below 65520: f16's 65504
		0x33000000, 0x33400000, 0x03800000, 0x01000000, // 2^-25, 3*2^-26 (f16 subnormal ties), bf16 subnormal and beyond
	}
	for range 40 {
		edges = append(edges, r.Uint32()&0x807fffff|uint32(120+r.IntN(16))<<23) // random, 2^-7 <= |v| < 2^9
	}
	return append(cs,
		plainCase("BF16 codes finite in F16", safetensors.BF16, small),
		plainCase("BF16 codes past F16", safetensors.BF16, large),
		plainCase("F16 every code", safetensors.F16, all16),
		plainCase("F32 edges", safetensors.F32, edges),
		plainCase("F32 past F16", safetensors.F32, []uint32{0x477ff000, 0xc77ff000, 0x7f7f7fff}),                          // 65520, -65520, bf16's largest below its halfway
		plainCase("F32 past BF16", safetensors.F32, []uint32{0x7f7fffff, 0xff7fffff, 0x7f7f8000, 0x7f7f8001, 0x7f7f0000}), // float32's largest, bf16's halfway and past
	)
}

// fp8Case is an E4M3 weight whose element (r, c) is scaled by entry
// [r/bo][c/bi] of its scale grid, stored as d: the value is the E4M3
// code's value times the scale's (DeepSeek's weight_scale_inv,
// compressed-tensors' and ModelOpt's weight_scale: all multiply).
func fp8Case(name string, f weightfmt.Format, rows, cols, bo, bi int, codes, scale []byte, d safetensors.DType) Case {
	gc := (cols + bi - 1) / bi
	w := Weight{Format: f, Rows: rows, Cols: cols, Raw: codes, Scale: scale}
	return build(name, w, func(r, c int) (float64, bool) {
		x, s := e4m3(codes[r*cols+c]), scaleValue(d, scale, r/bo*gc+c/bi)
		return x * s, finite(x) && finite(s)
	})
}

// FP8ScaledCases: per channel, every scale dtype, a row per special scale
// (every E4M3 code in it), ragged and long rows, and a weight of one row
// per overflowing scale; per tensor, a weight per special and
// overflowing scale, and a long one.
func FP8ScaledCases() []Case {
	r := rand.New(rand.NewPCG(3, 4))
	var cs []Case
	for _, d := range []safetensors.DType{safetensors.F32, safetensors.BF16, safetensors.F16} {
		ch := weightfmt.FP8Channel(d)
		for _, sz := range [][2]int{{held(d, scaleSpecials) + 2, 256}, {held(d, scaleSpecials), 7}, {3, 4104}, {2, 2053}} {
			rows, cols := sz[0], sz[1]
			scale, _ := scaleGrid(r, d, rows, scaleSpecials)
			cs = append(cs, fp8Case(fmt.Sprintf("channel/%s/%dx%d", d, rows, cols), ch, rows, cols, 1, cols,
				everyCodeBytes(r, rows, cols), scale, d))
		}
		te := weightfmt.FP8Tensor(d)
		for _, x := range append(append(scaleSpecials, overflowScales...), randomScale(r, -8, 4)) {
			scale := make([]byte, d.Size())
			if !encodeExact(d, x, scale, 0) {
				continue
			}
			cs = append(cs, fp8Case(fmt.Sprintf("tensor/%s/scale %g", d, x), te, 2, 256, 2, 256, everyCodeBytes(r, 2, 256), scale, d))
			if slices.Contains(overflowScales, x) {
				cs = append(cs, fp8Case(fmt.Sprintf("channel/%s/scale %g", d, x), ch, 1, 256, 1, 256, everyCodeBytes(r, 1, 256), scale, d))
			}
		}
		scale, _ := scaleGrid(r, d, 1, nil)
		cs = append(cs, fp8Case(fmt.Sprintf("tensor/%s/3x4104", d), te, 3, 4104, 3, 4104, everyCodeBytes(r, 3, 4104), scale, d))
	}
	return cs
}

// FP8BlockCases: 128x128 blocks (F32 weight_scale_inv, UE8M0 or not) with
// ragged edge blocks, small blocks, and DeepSeek-V4's E8M0 x.scale with
// E8M0's extremes (0: 2^-127, 255: NaN; 254: 2^127, which overflows, in a
// weight of its own as every overflowing scale).
func FP8BlockCases() []Case {
	r := rand.New(rand.NewPCG(5, 6))
	var cs []Case
	f32Scales := func(xs ...float64) []byte {
		b := make([]byte, 4*len(xs))
		for i, x := range xs {
			if !encodeExact(safetensors.F32, x, b, i) {
				panic(fmt.Sprintf("weightfmttest: F32 scale %g", x))
			}
		}
		return b
	}
	cs = append(cs,
		fp8Case("128x128/130x260", weightfmt.FP8Block(128, 128, false), 130, 260, 128, 128, everyCodeBytes(r, 130, 260),
			f32Scales(1+0x1p-8, 0x1p-140, -0.5, inf, 0, 96), safetensors.F32),
		fp8Case("128x128 ue8m0/130x260", weightfmt.FP8Block(128, 128, true), 130, 260, 128, 128, everyCodeBytes(r, 130, 260),
			f32Scales(0x1p-10, 0x1p-127, 0x1p6, 1, 0.5, negZero), safetensors.F32),
		fp8Case("2x4/5x10", weightfmt.FP8Block(2, 4, false), 5, 10, 2, 4, everyCodeBytes(r, 5, 10),
			f32Scales(1, negZero, nan, 0x1p-133, 0x1p-149, 0.25, -3.0/128, 1+0x1p-7, 2), safetensors.F32),
	)
	for _, x := range overflowScales {
		cs = append(cs, fp8Case(fmt.Sprintf("128x128/2x256/scale %g", x), weightfmt.FP8Block(128, 128, false), 2, 256, 128, 128,
			everyCodeBytes(r, 2, 256), f32Scales(x, 1), safetensors.F32))
	}
	for _, d := range []safetensors.DType{safetensors.F8E8M0, safetensors.U8} {
		f := weightfmt.FP8BlockDeepSeek(128, 128, d)
		cs = append(cs,
			fp8Case(fmt.Sprintf("deepseek %s/130x260", d), f, 130, 260, 128, 128, everyCodeBytes(r, 130, 260), []byte{0, 1, 127, 133, 255, 120}, d),
			fp8Case(fmt.Sprintf("deepseek %s/2x256/scale codes 254, 200", d), f, 2, 256, 128, 128, everyCodeBytes(r, 2, 256), []byte{254, 200}, d))
	}
	return append(cs, squareBlockCases()...)
}

// squareBlockCases: FP8 in 32x32 and 64x64 blocks (DeepSeek-V4.1's, and
// weight_block_size [64, 64]) with F32 scales (every special the dtype
// holds, then random ones) and E8M0 x.scale codes (0: 2^-127, 1, 127: 1,
// 255: NaN, then random ones; 254 overflows, in a weight of its own):
// ragged edge blocks in both directions, rows whose length is and is not
// a multiple of 8 (a device decoder's vector and element paths), and
// three weights of one shape each, which stack.
func squareBlockCases() []Case {
	r := rand.New(rand.NewPCG(7, 8))
	var cs []Case
	for _, b := range []int{32, 64} {
		for _, sz := range [][2]int{{2*b + 6, 3*b + 4}, {b + b/4, 3 * b}} {
			rows, cols := sz[0], sz[1]
			n := ((rows + b - 1) / b) * ((cols + b - 1) / b)
			scale, _ := scaleGrid(r, safetensors.F32, n, scaleSpecials)
			cs = append(cs, fp8Case(fmt.Sprintf("%dx%d/%dx%d", b, b, rows, cols), weightfmt.FP8Block(int64(b), int64(b), true),
				rows, cols, b, b, everyCodeBytes(r, rows, cols), scale, safetensors.F32))
			for _, d := range []safetensors.DType{safetensors.F8E8M0, safetensors.U8} {
				f := weightfmt.FP8BlockDeepSeek(int64(b), int64(b), d)
				for k := range 3 {
					codes := []byte{0, 1, 127, 255}
					for len(codes) < n {
						codes = append(codes, byte(100+r.IntN(40)))
					}
					codes = codes[:n]
					r.Shuffle(len(codes), func(i, j int) { codes[i], codes[j] = codes[j], codes[i] })
					cs = append(cs, fp8Case(fmt.Sprintf("deepseek %s %dx%d/%dx%d/%d", d, b, b, rows, cols, k), f, rows, cols, b, b,
						everyCodeBytes(r, rows, cols), codes, d))
				}
			}
		}
		f := weightfmt.FP8BlockDeepSeek(int64(b), int64(b), safetensors.F8E8M0)
		cs = append(cs, fp8Case(fmt.Sprintf("deepseek F8_E8M0 %dx%d/2x%d/scale codes 254, 200", b, b, 2*b), f, 2, 2*b, b, b,
			everyCodeBytes(r, 2, 2*b), []byte{254, 200}, safetensors.F8E8M0))
	}
	return cs
}

// int4Words is rows rows of words little-endian I32 words: row 0's word j
// holds nibble (j+k) % 16 at bits 4k..4k+3, so that every nibble value
// sits at every position of a word; the other rows are random.
func int4Words(r *rand.Rand, rows, words int) []byte {
	b := make([]byte, 4*rows*words)
	for j := range rows * words {
		w := r.Uint32()
		if j < words {
			w = 0
			for k := range 8 {
				w |= uint32((j+k)%16) << (4 * k)
			}
		}
		binary.LittleEndian.PutUint32(b[4*j:], w)
	}
	return b
}

// Int4PackCases: compressed-tensors' symmetric pack-quantized INT4, each
// scale dtype, groups of whole words, groups that split a word (12, and
// 40: a whole row), one scale a row with a partial last word, and long
// rows. Element 8j+k of a row is bits 4k..4k+3 of its little-endian I32
// word j, stored offset by 8: its value is (u - 8) times its group's
// scale.
func Int4PackCases() []Case {
	r := rand.New(rand.NewPCG(7, 8))
	var cs []Case
	for _, d := range []safetensors.DType{safetensors.F32, safetensors.BF16, safetensors.F16} {
		one := func(rows, cols, group int, specials []float64) Case {
			f := weightfmt.Int4Pack(int64(group), d)
			g := group
			if g == 0 {
				g = cols
			}
			words := (cols + 7) / 8
			raw := int4Words(r, rows, words)
			gc := cols / g
			scale, _ := scaleGrid(r, d, rows*gc, specials)
			w := Weight{Format: f, Rows: rows, Cols: cols, Raw: raw, Scale: scale}
			return build(fmt.Sprintf("%s/%dx%d/group %d", d, rows, cols, group), w, func(row, col int) (float64, bool) {
				word := binary.LittleEndian.Uint32(raw[4*(row*words+col/8):])
				u := int(word >> (4 * (col % 8)) & 0xf)
				s := scaleValue(d, scale, row*gc+col/g)
				return float64(u-8) * s, finite(s)
			})
		}
		for _, c := range []struct{ rows, cols, group int }{
			{4, 128, 8}, {3, 48, 12}, {3, 40, 40}, {4, 256, 32}, {3, 4224, 128}, {held(d, scaleSpecials), 13, 0}, {3, 2053, 0},
		} {
			cs = append(cs, one(c.rows, c.cols, c.group, scaleSpecials))
		}
		for _, x := range overflowScales {
			if held(d, []float64{x}) == 1 {
				c := one(1, 128, 0, []float64{x})
				c.Name += fmt.Sprintf("/scale %g", x)
				cs = append(cs, c)
			}
		}
	}
	return cs
}

// fp4Code is element c of a row of E2M1 codes packed two to a byte, the
// even element in the low nibble.
func fp4Code(row []byte, c int) byte { return row[c/2] >> (4 * (c % 2)) & 0xf }

// MXFP4Cases: each producer's MXFP4 (the bytes are the same; the dtypes
// and names differ), every byte value and every E8M0 scale code, and
// long rows. Element c's value is its E2M1 code's value times its group
// of 32's E8M0 scale.
func MXFP4Cases() []Case {
	r := rand.New(rand.NewPCG(9, 10))
	var cs []Case
	for _, f := range []weightfmt.Format{
		weightfmt.MXFP4(weightfmt.NamingGptOss, safetensors.U8, safetensors.U8),
		weightfmt.MXFP4(weightfmt.NamingCompressedTensors, safetensors.U8, safetensors.U8),
		weightfmt.MXFP4(weightfmt.NamingDeepSeek, safetensors.I8, safetensors.F8E8M0),
	} {
		one := func(name string, rows, cols int, scale []byte) Case {
			raw := everyCodeBytes(r, rows, cols/2)
			return mxCase(f, name, rows, cols, raw, scale, func(row, c int) (float64, bool) {
				return e2m1Values[fp4Code(raw[row*cols/2:], c)], true
			})
		}
		// Scale codes past 140 overflow f16 (6 * 2^14), past 252 float32
		// (6 * 2^126 is 1.5 * 2^128): cases of their own.
		cs = append(cs,
			one("scale codes 0..140, 255", 9, 512, codes(9*16, func(i int) byte {
				if i == 141 {
					return 255
				}
				return byte(min(i, 140))
			})),
			one("scale codes 141..252", 7, 512, codes(7*16, func(i int) byte { return byte(141 + i) })),
			one("scale codes 253, 254", 1, 64, []byte{253, 254}),
			one("random", 3, 4160, codes(3*130, func(int) byte { return byte(110 + r.IntN(30)) })),
		)
	}
	return cs
}

// mxCase is a case of the MX format f (E8M0 scales, one a group of 32
// along a row): element c of row is elem's value times its group's scale,
// 2^(e - 127), finite where elem's is and the scale code is not 255 (NaN).
func mxCase(f weightfmt.Format, name string, rows, cols int, raw, scale []byte, elem func(row, c int) (float64, bool)) Case {
	sd, _ := f.Scale()
	gc := cols / 32
	w := Weight{Format: f, Rows: rows, Cols: cols, Raw: raw, Scale: scale}
	return build(fmt.Sprintf("%s %s %s/%dx%d/%s", f, sd.DType, f.(weightfmt.Named).Naming(), rows, cols, name), w, func(row, c int) (float64, bool) {
		x, ok := elem(row, c)
		code := scale[row*gc+c/32]
		return x * e8m0(code), ok && code != 255
	})
}

// codes is n scale codes, code i picked by pick.
func codes(n int, pick func(i int) byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = pick(i)
	}
	return b
}

// MXFP8Cases: ModelOpt's (U8 weight_scale) and MiniMax's (U8 or F8_E8M0
// weight_scale_inv) MXFP8, every E4M3 code under every E8M0 scale code,
// and long rows. Element c's value is its E4M3 code's value times its
// group of 32's E8M0 scale, 2^(e - 127).
func MXFP8Cases() []Case {
	r := rand.New(rand.NewPCG(13, 14))
	var cs []Case
	for _, f := range []weightfmt.Format{
		weightfmt.MXFP8(weightfmt.NamingModelOpt, safetensors.U8),
		weightfmt.MXFP8(weightfmt.NamingMiniMax, safetensors.U8),
		weightfmt.MXFP8(weightfmt.NamingMiniMax, safetensors.F8E8M0),
	} {
		one := func(name string, rows, cols int, scale []byte) Case {
			raw := everyCodeBytes(r, rows, cols)
			return mxCase(f, name, rows, cols, raw, scale, func(row, c int) (float64, bool) {
				x := e4m3(raw[row*cols+c])
				return x, finite(x)
			})
		}
		// Every E4M3 value (448 the largest) times a scale code up to 134
		// (2^7) is finite in f16; past 252 (448 * 2^126 = 1.75 * 2^134)
		// it overflows float32: cases of their own. A row of 256 columns
		// holds every code, rotated a row, under 8 scales.
		cs = append(cs,
			one("scale codes 0..134, 255", 17, 256, codes(17*8, func(i int) byte {
				if i == 135 {
					return 255
				}
				return byte(min(i, 134))
			})),
			one("scale codes 135..252", 15, 256, codes(15*8, func(i int) byte { return byte(min(135+i, 252)) })),
			one("scale codes 253, 254", 1, 256, codes(8, func(i int) byte { return byte(253 + i%2) })),
			one("random", 3, 4160, codes(3*130, func(int) byte { return byte(110 + r.IntN(30)) })),
		)
	}
	return cs
}

// NVFP4Cases: ModelOpt's and compressed-tensors' NVFP4, every byte value
// and every E4M3 block scale code under global scales of 1, a tie, a
// subnormal product, an overflowing product, zero, a negative, infinity
// and NaN; and long rows. Element c's value is its E2M1 code's value times
// the block's effective scale, rounded to float32 as the producers'
// dequantisers compute it: ModelOpt multiplies the E4M3 block scale by
// weight_scale_2 in float32, compressed-tensors divides it by
// weight_global_scale in float32; the E2M1 value then multiplies that.
func NVFP4Cases() []Case {
	r := rand.New(rand.NewPCG(11, 12))
	var cs []Case
	for _, f := range []weightfmt.Format{weightfmt.NVFP4ModelOpt(), weightfmt.NVFP4CT()} {
		divides := f.Quantization() == weightfmt.QuantNVFP4CT
		// Global scales: 1, a tie, one that makes the effective scales
		// subnormal, one that makes them overflow (and 0 times them NaN),
		// zero (compressed-tensors: a division by zero), a negative,
		// infinity, NaN and a typical one.
		globals := []float64{1, 1 + 0x1p-8, 0x1p-130, float64(float32(3e35)), 0, -2, inf, nan, float64(float32(0.003))}
		typical := float64(float32(0.003))
		if divides {
			globals = []float64{1, 1 + 0x1p-8, 0x1p127, 0x1p-125, 0, -2, inf, nan, 333}
			typical = 333
		}
		one := func(name string, rows, cols int, raw, scale []byte, g float64) Case {
			gb := make([]byte, 4)
			if !encodeExact(safetensors.F32, g, gb, 0) {
				panic(fmt.Sprintf("weightfmttest: global scale %g", g))
			}
			gc := cols / 16
			w := Weight{Format: f, Rows: rows, Cols: cols, Raw: raw, Scale: scale, Global: gb}
			return build(name, w, func(row, c int) (float64, bool) {
				s := e4m3(scale[row*gc+c/16])
				eff := float64(f32(s * g))
				if divides {
					eff = float64(f32(s / g))
				}
				return e2m1Values[fp4Code(raw[row*cols/2:], c)] * eff, finite(s) && finite(g)
			})
		}
		for _, g := range globals {
			scale := make([]byte, 256)
			for i := range scale {
				scale[i] = byte(i)
			}
			cs = append(cs, one(fmt.Sprintf("%s/16x256/global %g", f, g), 16, 256, everyCodeBytes(r, 16, 128), scale, g))
		}
		scale := make([]byte, 3*4128/16)
		for i := range scale {
			scale[i] = byte(0x20 + r.IntN(0x50))
		}
		cs = append(cs, one(fmt.Sprintf("%s/3x4128", f), 3, 4128, everyCodeBytes(r, 3, 4128/2), scale, typical))
	}
	return cs
}

// AllCases is every format's cases.
func AllCases() []Case {
	var cs []Case
	for _, f := range []func() []Case{PlainCases, FP8BlockCases, FP8ScaledCases, Int4PackCases, MXFP4Cases, MXFP8Cases, NVFP4Cases} {
		cs = append(cs, f()...)
	}
	return cs
}
