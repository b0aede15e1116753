package tensorload

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// ScaledRows tells a band of DST's weight that holds SRC's FP8 codes with
// routed_scaling_factor folded into its float32 scales as convert folds it,
// band by band, and nothing else: not SRC's own scales, a scale an ulp
// off, a code changed, a fold done twice, a fold whose product overflows
// among the subnormals, or a weight with no factor to look for.
// Where it tells one, DST's product is SRC's times the factor within the
// 3u of the magnitudes it states.
func TestScaledRows(t *testing.T) {
	const rows, cols, blk, rsf = 256, 384, 128, 2.5
	rng := rand.New(rand.NewPCG(45, 12))
	codes := make([]byte, rows*cols)
	for i := range codes {
		for codes[i]&0x7F == 0x7F {
			codes[i] = byte(rng.IntN(256))
		}
	}
	gr, gc := rows/blk, cols/blk
	scales := make([]byte, 4*gr*gc)
	for i := range gr * gc {
		binary.LittleEndian.PutUint32(scales[4*i:], math.Float32bits(float32(rng.Float64()*1e-3+1e-4)))
	}
	folded := func(s []byte) []byte {
		s = slices.Clone(s)
		weightfmt.FoldInPlace(safetensors.F32, s, rsf)
		return s
	}
	setScale := func(s []byte, i int, v float32) { binary.LittleEndian.PutUint32(s[4*i:], math.Float32bits(v)) }
	scaleAt := func(s []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(s[4*i:])) }
	for _, tc := range []struct {
		name      string
		srcScales func() []byte
		dstScales func(src []byte) []byte
		dstCode   int // a DST code changed at this element (-1: none)
		factor    float64
		want      [2]bool // bands 0 and 1
	}{
		{"folded", nil, folded, -1, rsf, [2]bool{true, true}},
		{"SRC's scales, not folded", nil, slices.Clone[[]byte], -1, rsf, [2]bool{false, false}},
		{"no factor to look for", nil, folded, -1, 0, [2]bool{false, false}},
		{"a scale of band 1 an ulp off", nil, func(s []byte) []byte {
			d := folded(s)
			setScale(d, gc+1, math.Nextafter32(scaleAt(d, gc+1), 1))
			return d
		}, -1, rsf, [2]bool{true, false}},
		{"a code of band 0 changed", nil, folded, 5*cols + 7, rsf, [2]bool{false, true}},
		{"folded twice", nil, func(s []byte) []byte { return folded(folded(s)) }, -1, rsf, [2]bool{false, false}},
		{"a product among the subnormals", func() []byte {
			s := slices.Clone(scales)
			setScale(s, gc, 1e-39)
			return s
		}, folded, -1, rsf, [2]bool{true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss := scales
			if tc.srcScales != nil {
				ss = tc.srcScales()
			}
			ds := tc.dstScales(ss)
			dc := slices.Clone(codes)
			if tc.dstCode >= 0 {
				dc[tc.dstCode] ^= 0x01
			}
			load := func(c, s []byte, factor float64) *Bands {
				m := cktest.Mem{}
				m.Put("w", safetensors.F8E4M3, []int64{1, rows, cols}, c)
				m.Put("w_scale_inv", safetensors.F32, []int64{1, int64(gr), int64(gc)}, s)
				b, err := LoadBands(m, MatrixRef{Name: "w", Rows: rows, Cols: cols, Scale: "w_scale_inv",
					Format: weightfmt.FP8Block(blk, blk, false), Folded: factor})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(b.Release)
				return b
			}
			src, dst := load(codes, ss, 0), load(dc, ds, tc.factor)
			for band := range 2 {
				r0, r1 := band*blk, (band+1)*blk
				f, ok := dst.ScaledRows(src, r0, r1)
				if ok != tc.want[band] || (ok && f != rsf) {
					t.Fatalf("band %d: ScaledRows %v, %v; want %v", band, f, ok, tc.want[band])
				}
				if _, ok := src.ScaledRows(dst, r0, r1); ok {
					t.Fatalf("band %d: SRC's weight, with no factor, told scaled rows", band)
				}
				if !ok {
					continue
				}
				// DST's product by a token against SRC's times the factor.
				a, b := make([]float32, blk*cols), make([]float32, blk*cols)
				if err := src.Rows(r0, r1, a); err != nil {
					t.Fatal(err)
				}
				if err := dst.Rows(r0, r1, b); err != nil {
					t.Fatal(err)
				}
				for r := range blk {
					var ys, yd, mag float64
					for c := range cols {
						x := rng.NormFloat64()
						ys += float64(a[r*cols+c]) * x
						yd += float64(b[r*cols+c]) * x
						mag += math.Abs(float64(a[r*cols+c]) * x)
					}
					if d := math.Abs(yd - rsf*ys); d > 3*0x1p-24*rsf*mag {
						t.Fatalf("band %d row %d: DST's product %g, SRC's times %g %g: %g apart, over 3u of %g", band, r, yd, rsf, rsf*ys, d, rsf*mag)
					}
				}
			}
		})
	}
}

// A folded scale follows SRC's only where the product is a finite normal
// float32 (or a zero from a zero): an overflow (which loading DST refuses
// first, as it refuses any Inf) and a subnormal are rounded coarser.
func TestFoldedWithin(t *testing.T) {
	for _, tc := range []struct {
		s    float64
		y    float32
		want bool
	}{
		{1e-3, float32(1e-3 * 2.5), true},
		{0, 0, true},
		{math.Copysign(0, -1), float32(math.Copysign(0, -1)), true},
		{-2e-3, float32(-2e-3 * 2.5), true},
		{3e38, float32(math.Inf(1)), false},
		{1e-39, float32(1e-39 * 2.5), false},
		{1e-46, 0, false},
		{math.NaN(), float32(math.NaN()), false},
		{math.Inf(1), float32(math.Inf(1)), false},
		{0x1p-126 / 2.5, float32(0x1p-126), true},
	} {
		if got := foldedWithin(tc.s, tc.y); got != tc.want {
			t.Errorf("foldedWithin(%g, %g) = %v, want %v", tc.s, tc.y, got, tc.want)
		}
	}
}
