package weightfmt

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
)

// Requantisation (requant.go): known values by hand, every format against
// a reference written element by element in this file (float64 scale
// arithmetic rounded as the rule says, E4M3 codes found by searching all
// 256 codes, not through numfmt's encoder), the streamed reader against
// the in-memory result through odd-sized reads and column blocks, the
// error bound of half a step, and what is refused.

// int4Codes unpacks a packed INT4 row of n elements to q = u - 8.
func int4Codes(raw []byte, n int) []int {
	out := make([]int, n)
	for c := range out {
		out[c] = int(binary.LittleEndian.Uint32(raw[4*(c/8):])>>(4*(c%8))&0xF) - 8
	}
	return out
}

func TestRequantKnownValues(t *testing.T) {
	cases := []struct {
		name       string
		f          Format
		rows, cols int64
		vals       []float32
		wantScale  []float32
		wantCodes  []float32 // INT4 codes, or E4M3 values
	}{
		{"INT4: amax 7.5 gives scale 1; +7.5 clamps to 7, -7.5 rounds to -8, halves to even",
			Int4Pack(8, bf16), 1, 8, []float32{7.5, -7.5, 2.5, -2.5, 0.5, 1.5, 3.49, 0},
			[]float32{1}, []float32{7, -8, 2, -2, 0, 2, 3, 0}},
		{"INT4: an all-zero group gets scale 2^-23 and codes 0",
			Int4Pack(8, bf16), 1, 16, append(make([]float32, 8), 15, 1, 2, 3, 4, 5, 6, -15),
			[]float32{0x1p-23, 2}, []float32{0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 1, 2, 2, 2, 3, -8}},
		{"INT4: the bf16 scale is amax/7.5 rounded to bf16 and codes divide by it",
			Int4Pack(0, bf16), 1, 4, []float32{1, 0.3, -0.7, 0.05},
			[]float32{numfmt.RoundBF16(1 / 7.5)}, []float32{7, 2, -5, 0}},
		{"E4M3 block: amax 448 gives scale 1, codes the nearest E4M3 values",
			FP8Block(2, 2, false), 2, 2, []float32{448, -300, 1.0625, 17},
			[]float32{1}, []float32{448, -288, 1, 16}},
		{"E4M3 UE8M0: scale 300/448 rounded up to 1",
			FP8Block(2, 2, true), 1, 2, []float32{300, -3},
			[]float32{1}, []float32{288, -3}},
		{"E4M3 per channel, BF16 scales: one per row",
			FP8Channel(bf16), 2, 2, []float32{448, 1, -4.48, 0},
			[]float32{1, numfmt.RoundBF16(4.48 / 448)}, []float32{448, 1, float32(-4.48 / float64(numfmt.RoundBF16(4.48/448))), 0}},
		{"E4M3 per tensor, F32 scale over the whole weight",
			FP8Tensor(f32), 2, 2, []float32{1, 2, -896, 4},
			[]float32{2}, []float32{0.5, 1, -448, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, s, err := Requantise(tc.f, tc.vals, tc.rows, tc.cols)
			if err != nil {
				t.Fatal(err)
			}
			sc, _ := tc.f.Scale()
			gotS := make([]float32, len(s)/sc.DType.Size())
			if err := Decode(e8m0AsF8(sc.DType), s, gotS); err != nil {
				t.Fatal(err)
			}
			if !sameFloats(gotS, tc.wantScale) {
				t.Errorf("scales %v, want %v", gotS, tc.wantScale)
			}
			var codes []float32
			if tc.f.Quantization() == QuantInt4Pack {
				for _, q := range int4Codes(w, int(tc.rows*tc.cols)) {
					codes = append(codes, float32(q))
				}
			} else {
				codes = make([]float32, len(w))
				decodeBytes(numfmt.E4M3ToF32, w, codes)
				for i, v := range tc.wantCodes { // the nearest E4M3 value to the quotient
					tc.wantCodes[i] = numfmt.E4M3ToF32(nearestE4M3(v))
				}
			}
			if !sameFloats(codes, tc.wantCodes) {
				t.Errorf("codes %v, want %v", codes, tc.wantCodes)
			}
		})
	}
}

// e8m0AsF8 is the dtype Decode reads a scale of dtype d as: U8 scales
// (MXFP8's) are E8M0 bytes.
func e8m0AsF8(d safetensors.DType) safetensors.DType {
	if d == u8 {
		return safetensors.F8E8M0
	}
	return d
}

// nearestE4M3 is the E4M3 code nearest to v, found by trying every finite
// code, ties to the even code (the one whose last mantissa bit is 0),
// saturating at +-448.
func nearestE4M3(v float32) byte {
	best, bestD := byte(0), math.Inf(1)
	for c := range 256 {
		b := byte(c)
		x := float64(numfmt.E4M3ToF32(b))
		if math.IsNaN(x) || (x == 0 && b&0x80 != 0 && v >= 0) || (x == 0 && b&0x80 == 0 && v < 0) {
			continue
		}
		d := math.Abs(x - float64(v))
		if d < bestD || d == bestD && b&1 == 0 {
			best, bestD = b, d
		}
	}
	return best
}

// refRequant is the rule of requant.go written out element by element for
// a weight of rows x cols float32 values in format f: each block's scale
// from its amax in float64 arithmetic, then rounded as the rule says, and
// each code searched, not encoded.
func refRequant(f Format, vals []float32, rows, cols int) (scales [][]float32, codes []float32) {
	sc, _ := f.Scale()
	rule := f.(Requantiser).RequantRule()
	bo, bc := int(sc.Block[0]), int(sc.Block[1])
	if bo == 0 {
		bo = rows
	}
	if bc == 0 {
		bc = cols
	}
	gr, gc := (rows+bo-1)/bo, (cols+bc-1)/bc
	scales = make([][]float32, gr)
	for i := range gr {
		scales[i] = make([]float32, gc)
		for j := range gc {
			amax := 0.0
			for r := i * bo; r < min((i+1)*bo, rows); r++ {
				for c := j * bc; c < min((j+1)*bc, cols); c++ {
					amax = math.Max(amax, math.Abs(float64(vals[r*cols+c])))
				}
			}
			s := float32(float32(amax) / float32(rule.Divisor)) // float32 division, as torch's opmath
			switch sc.DType {
			case bf16:
				s = numfmt.BF16ToF32(numfmt.F32ToBF16(s))
			case safetensors.F16:
				s = numfmt.F16ToF32(numfmt.F32ToF16(s))
			}
			s = max(s, float32(rule.MinScale)) // 2^-23; MXFP8's 2^-127 (TestMXFP8RequantModelOpt derives it apart)
			if rule.PowerOfTwo {
				s = float32(math.Pow(2, math.Ceil(math.Log2(float64(s)))))
			}
			scales[i][j] = s
		}
	}
	codes = make([]float32, rows*cols)
	for r := range rows {
		for c := range cols {
			q := vals[r*cols+c] / scales[r/bo][c/bc]
			if f.Quantization() == QuantInt4Pack {
				codes[r*cols+c] = float32(math.RoundToEven(math.Min(math.Max(float64(q), -8), 7)))
			} else {
				codes[r*cols+c] = numfmt.E4M3ToF32(nearestE4M3(q))
			}
		}
	}
	return scales, codes
}

// requantFormats are the formats requantisation writes, at sizes that
// leave partial blocks, partial words and several bands.
var requantFormats = []struct {
	f          Format
	rows, cols int64
}{
	{Int4Pack(32, bf16), 37, 96},
	{Int4Pack(16, safetensors.F16), 9, 48},
	{Int4Pack(0, bf16), 5, 44}, // one scale per row, a partial last word
	{Int4Pack(8, f32), 3, 24},
	{FP8Block(128, 128, false), 300, 200},
	{FP8Block(4, 8, true), 10, 20},
	{FP8Channel(bf16), 7, 33},
	{FP8Channel(safetensors.F16), 3, 5},
	{FP8Tensor(f32), 70, 1100}, // several bands, one scale
	{FP8Tensor(bf16), 3, 7},
	{MXFP8(NamingModelOpt, u8), 9, 96},
	{MXFP8(NamingMiniMax, safetensors.F8E8M0), 3, 4128}, // several bands
}

// plainValues are n bf16 values of a weight-like spread: normal with a
// few outliers and some exact zeros.
func plainValues(rng *rand.Rand, n int64) []float32 {
	v := make([]float32, n)
	for i := range v {
		x := rng.NormFloat64() * 0.02
		switch rng.IntN(50) {
		case 0:
			x *= 20
		case 1:
			x = 0
		}
		v[i] = numfmt.RoundBF16(float32(x))
	}
	return v
}

func bf16Bytes(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], numfmt.F32ToBF16(x))
	}
	return b
}

// eachRequantFormat runs f on every format of requantFormats with random
// plain values (from seed) and what Requantise made of them.
func eachRequantFormat(t *testing.T, seed uint64, f func(t *testing.T, f Format, rows, cols int64, vals []float32, w, s []byte)) {
	rng := rand.New(rand.NewPCG(29, seed))
	for _, tc := range requantFormats {
		t.Run(tc.f.String()+"/"+tc.f.Quantization(), func(t *testing.T) {
			vals := plainValues(rng, tc.rows*tc.cols)
			w, s, err := Requantise(tc.f, vals, tc.rows, tc.cols)
			if err != nil {
				t.Fatal(err)
			}
			f(t, tc.f, tc.rows, tc.cols, vals, w, s)
		})
	}
}

func TestRequantMatchesReference(t *testing.T) {
	eachRequantFormat(t, 3, func(t *testing.T, f Format, rows, cols int64, vals []float32, w, s []byte) {
		scales, codes := refRequant(f, vals, int(rows), int(cols))
		sc, _ := f.Scale()
		var flat []float32
		for _, r := range scales {
			flat = append(flat, r...)
		}
		gotS := make([]float32, len(s)/sc.DType.Size())
		if err := Decode(e8m0AsF8(sc.DType), s, gotS); err != nil {
			t.Fatal(err)
		}
		if !sameFloats(gotS, flat) {
			t.Fatalf("scales differ from the reference:\n got %v\nwant %v", gotS, flat)
		}
		// The codes, through the format's own decode: value = code * scale.
		got := make([]float32, rows*cols)
		if err := f.Dequantise(w, int(rows), int(cols), s, got); err != nil {
			t.Fatal(err)
		}
		// Each value is its code times its block's scale, and within half
		// a step of the weight: |w - q*s| <= s/2, 0.53 s where INT4 clamps
		// +7.5 steps to 7 under a scale rounded down to bf16 (by up to
		// 2^-8); E4M3: 2^-4 of the weight, or half the subnormal step.
		bo, bc := sc.Block[0], sc.Block[1]
		for i, v := range vals {
			r, c := int64(i)/cols, int64(i)%cols
			gr, gcol := int64(0), int64(0)
			if bo > 0 {
				gr = r / bo
			}
			if bc > 0 {
				gcol = c / bc
			}
			s := scales[gr][gcol]
			if want := codes[i] * s; got[i] != want {
				t.Fatalf("element %d (%d,%d): %v, reference %v (value %v)", i, r, c, got[i], want, v)
			}
			bound := 0.53 * float64(s)
			if f.Quantization() != QuantInt4Pack {
				bound = math.Max(math.Abs(float64(v))/16, 0x1p-10*float64(s))
			}
			if d := math.Abs(float64(v) - float64(got[i])); d > bound*(1+1e-6) {
				t.Fatalf("element %d: %v became %v, off by %v > %v", i, v, got[i], d, bound)
			}
		}
	})
}

// TestRequantStreamed: the band-by-band reader over a BF16 tensor gives
// Requantise's bytes through reads of every odd size and through the
// column blocks and row blocks fuse-shared cuts.
func TestRequantStreamed(t *testing.T) {
	eachRequantFormat(t, 4, func(t *testing.T, f Format, rows, cols int64, vals []float32, w, s []byte) {
		q, err := NewRequant(f, "x.weight", bytesReader(bf16Bytes(vals)), bf16, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []struct {
			r interface {
				ReadAt([]byte, int64) (int, error)
			}
			want []byte
		}{{q.Weight(), w}, {q.Scale(), s}} {
			for _, step := range []int{1, 7, 64, 4093, len(v.want)} {
				got := make([]byte, 0, len(v.want))
				for off := 0; off < len(v.want); off += step {
					p := make([]byte, min(step, len(v.want)-off))
					if _, err := v.r.ReadAt(p, int64(off)); err != nil {
						t.Fatalf("read %d at %d: %v", len(p), off, err)
					}
					got = append(got, p...)
				}
				if string(got) != string(v.want) {
					t.Fatalf("reads of %d bytes differ from Requantise", step)
				}
			}
			if n, err := v.r.ReadAt(make([]byte, 2), int64(len(v.want))-1); n != 1 || err == nil {
				t.Fatalf("a read past the end: %d, %v", n, err)
			}
		}
		m := q.Matrix()
		if e, _ := f.Packing(); cols%(2*max(e, 8)) == 0 && m.ColSplitExact(cols/2) {
			cb := m.ColBlock(cols/2, cols/2)
			if got, want := readRegion(t, q.Weight(), cb.Weight), gather(w, cb.Weight, 0); string(got) != string(want) {
				t.Fatal("a column block differs")
			}
			if got, want := readRegion(t, q.Scale(), cb.Scale), gather(s, cb.Scale, 0); string(got) != string(want) {
				t.Fatal("a column block's scales differ")
			}
		}
	})
}

func readRegion(t *testing.T, r interface {
	ReadAt([]byte, int64) (int, error)
}, rg Region) []byte {
	t.Helper()
	var out []byte
	for _, x := range rg.Ranges() {
		p := make([]byte, x[1]-x[0])
		if _, err := r.ReadAt(p, x[0]); err != nil {
			t.Fatal(err)
		}
		out = append(out, p...)
	}
	return out
}

func TestRequantRefusals(t *testing.T) {
	nan := bf16Bytes([]float32{1, float32(math.NaN()), 2, 3, 0, 0, 0, 0})
	big := bf16Bytes([]float32{4e7, 1, 2, 3, 0, 0, 0, 0})
	cases := []struct {
		name string
		f    Format
		src  []byte
		sd   safetensors.DType
		cols int64
		want string
	}{
		{"into plain weights", Plain(bf16), nan, bf16, 8, "no format to requantise into"},
		{"into NVFP4", NVFP4ModelOpt(), nan, bf16, 8, "requantising into NVFP4"},
		{"into MXFP4", MXFP4(NamingGptOss, u8, u8), nan, bf16, 8, "requantising into MXFP4"},
		{"from an FP8 weight", FP8Channel(bf16), nan[:8], safetensors.F8E4M3, 8, "reads BF16, F16 or F32"},
		{"a NaN weight", Int4Pack(8, bf16), nan, bf16, 8, "element 1 is NaN"},
		{"an F16 scale that overflows", FP8Channel(safetensors.F16), big, bf16, 8, "overflows a F16 scale"},
		{"a partial INT4 group", Int4Pack(16, bf16), nan, bf16, 8, "not a whole number of 16-column scale groups"},
		{"a short source", Int4Pack(8, bf16), nan[:10], bf16, 8, "reading rows 0..1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, err := NewRequant(tc.f, "x.weight", bytesReader(tc.src), tc.sd, 1, tc.cols)
			if err == nil {
				_, _, err = q.Bytes()
			}
			testkit.WantErr(t, err, tc.want)
		})
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r bytesReader
	n atomic.Int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.n.Add(int64(len(p)))
	return c.r.ReadAt(p, off)
}

// TestRequantCache: reading a weight again (a stack's next replica) reads
// no source byte while its bands are cached; the cache stays within its
// bound when a weight is larger than it, and what is evicted is computed
// again to the same bytes.
func TestRequantCache(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 5))
	for _, tc := range []struct {
		f          Format
		rows, cols int64
		limit      int64
	}{
		{Int4Pack(32, bf16), 64, 256, 1 << 20},
		{FP8Block(128, 128, false), 300, 200, 1 << 20},
		{Int4Pack(32, bf16), 600, 256, 16 << 10}, // 75 kB of codes through a 16 kB cache
		{FP8Channel(bf16), 900, 100, 8 << 10},
	} {
		old := requantCacheBytes
		requantCacheBytes = tc.limit
		vals := plainValues(rng, tc.rows*tc.cols)
		want, wantS, err := Requantise(tc.f, vals, tc.rows, tc.cols)
		if err != nil {
			t.Fatal(err)
		}
		src := &countingReader{r: bytesReader(bf16Bytes(vals))}
		q, err := NewRequant(tc.f, "x.weight", src, bf16, tc.rows, tc.cols)
		if err != nil {
			t.Fatal(err)
		}
		for round := range 3 {
			before := src.n.Load()
			w, s, err := q.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			if string(w) != string(want) || string(s) != string(wantS) {
				t.Fatalf("%s: round %d differs", tc.f, round)
			}
			fits := int64(len(want)+len(wantS)) <= tc.limit
			if read := src.n.Load() - before; round > 0 && fits && read != 0 {
				t.Errorf("%s: round %d read %d source bytes again with every band cached", tc.f, round, read)
			}
			requantCache.Lock()
			over := requantCache.bytes > tc.limit && requantCache.order.Len() > 1
			requantCache.Unlock()
			if over {
				t.Errorf("%s: the cache holds %d bytes, over its %d", tc.f, requantCache.bytes, tc.limit)
			}
		}
		requantCacheBytes = old
	}
}

// TestRequantReadSpanningBands: a read that spans many bands computes them
// together (prefetch) and gives Requantise's bytes, reading each plain byte
// once; where a band cannot be computed (a NaN in its rows), the read stops
// before it with the error a read of that band alone gives.
func TestRequantReadSpanningBands(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 7))
	for _, tc := range []struct {
		f          Format
		rows, cols int64
		nanRow     int64 // -1: none
	}{
		{Int4Pack(32, bf16), 160, 2048, -1},
		{FP8Block(128, 128, false), 1280, 256, -1},
		{Int4Pack(32, bf16), 160, 2048, 70},
		{FP8Channel(bf16), 1024, 256, 600},
	} {
		vals := plainValues(rng, tc.rows*tc.cols)
		if tc.nanRow >= 0 {
			vals[tc.nanRow*tc.cols+5] = float32(math.NaN())
		}
		src := &countingReader{r: bytesReader(bf16Bytes(vals))}
		q, err := NewRequant(tc.f, "x.weight", src, bf16, tc.rows, tc.cols)
		if err != nil {
			t.Fatal(err)
		}
		if q.m.Rows/q.band < 3 {
			t.Fatalf("%s: %d bands: the case does not span bands", tc.f, q.m.Rows/q.band)
		}
		got := make([]byte, q.m.Bytes())
		n, err := q.Weight().ReadAt(got, 0)
		if tc.nanRow < 0 {
			want, _, werr := Requantise(tc.f, vals, tc.rows, tc.cols)
			if werr != nil || err != nil || string(got) != string(want) {
				t.Fatalf("%s: a whole read: %v (Requantise: %v), equal %v", tc.f, err, werr, string(got) == string(want))
			}
			if read := src.n.Load(); read != tc.rows*tc.cols*2 {
				t.Errorf("%s: read %d plain bytes, want each of %d once", tc.f, read, tc.rows*tc.cols*2)
			}
			continue
		}
		bad := tc.nanRow / q.band // the band that fails
		rowBytes := q.m.RowBytes()
		_, alone := q.Weight().ReadAt(make([]byte, 1), bad*q.band*rowBytes)
		if err == nil || alone == nil || err.Error() != alone.Error() || int64(n) != bad*q.band*rowBytes {
			t.Errorf("%s: a whole read stopped at %d with %v; want %d with %v", tc.f, n, err, bad*q.band*rowBytes, alone)
		}
	}
}

// roundSmall rounds as math.RoundToEven does over the INT4 codes' range
// and past it: every half-way point (the ties), their neighbours one ulp
// either side, and random values.
func TestRoundSmall(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	var xs []float32
	for h := -20.5; h <= 20.5; h++ {
		x := float32(h)
		xs = append(xs, x, math.Nextafter32(x, -100), math.Nextafter32(x, 100), float32(math.Round(h)))
	}
	xs = append(xs, 0, float32(math.Copysign(0, -1)), 0x1p-30, -0x1p-30, 0x1.fffffep21, -0x1.fffffep21)
	for range 200000 {
		xs = append(xs, float32(r.Float64()*40-20))
	}
	for _, x := range xs {
		if got, want := roundSmall(x), int32(math.RoundToEven(float64(x))); got != want {
			t.Fatalf("roundSmall(%v) = %d, want %d", x, got, want)
		}
	}
}

// encodeRow's codes are the rule's (requant.go) element by element: each
// value divided by its group's scale in float32, clamped to [-8, 7] and
// rounded to the nearest code, ties to even; for groups of whole words
// and for groups that split them.
func TestInt4EncodeRowCodes(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 10))
	for _, bc := range []int{8, 32, 128, 12, 20} {
		const cols = 2048 + 4 // a last partial word
		vals := make([]float32, cols)
		for i := range vals {
			vals[i] = float32(r.NormFloat64() * 2)
			if i%7 == 0 { // a tie at some scale below
				vals[i] = float32(r.IntN(31)-15) * 0.25
			}
		}
		scales := make([]float32, (cols+bc-1)/bc)
		for i := range scales {
			scales[i] = []float32{0.5, 0.25, 0.37, 1}[i%4]
		}
		dst := make([]byte, 4*((cols+7)/8))
		int4Pack{}.encodeRow(vals, scales, bc, dst)
		for i, v := range vals {
			want := uint32(int32(math.RoundToEven(float64(min(max(v/scales[i/bc], -8), 7))))+8) & 15
			got := binary.LittleEndian.Uint32(dst[4*(i/8):]) >> (4 * (i % 8)) & 15
			if got != want {
				t.Fatalf("group %d, element %d (%v / %v): code %d, want %d", bc, i, v, scales[i/bc], got, want)
			}
		}
		if pad := binary.LittleEndian.Uint32(dst[len(dst)-4:]) >> (4 * (cols % 8)); pad != 0 {
			t.Errorf("group %d: the last word's padding %#x, want 0", bc, pad)
		}
	}
}

// The INT4 encoding of one 2048-column row (Kimi-K2's I) of random
// normals in groups of 32: what fuse-shared --requantize-shared and
// validate's prediction of a requantised shared expert spend a weight
// (BENCHMARKS.md, issue 45 session 13). go test -run X -bench Int4EncodeRow
func BenchmarkInt4EncodeRow(b *testing.B) {
	r := rand.New(rand.NewPCG(11, 11))
	const cols, group = 2048, 32
	vals := make([]float32, cols)
	for i := range vals {
		vals[i] = float32(r.NormFloat64())
	}
	scales := make([]float32, cols/group)
	for i := range scales {
		scales[i] = float32(0.3 + r.Float64())
	}
	dst := make([]byte, cols/2)
	b.SetBytes(cols) // elements a row, as bytes: MB/s reads as M elements a second
	for b.Loop() {
		int4Pack{}.encodeRow(vals, scales, group, dst)
	}
}
