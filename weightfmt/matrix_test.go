package weightfmt

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// stack is N random [rows, cols] weights of a format and their scale
// grids, laid out as a stack [N, ...] of each, the way a stacked checkpoint
// holds them, with the brute-force address of every element and entry.
type stack struct {
	m              Matrix
	n              int64
	weight, scales []byte
	es, ses        int64 // bytes of an element, of a scale entry
	gr, gc         int64
	bo, bi         int64 // block edges (the whole axis for 0)
}

func newStack(rng *rand.Rand, f Format, n, rows, cols int64) *stack {
	s := &stack{m: Matrix{Format: f, Rows: rows, Cols: cols}, n: n}
	_, s.es = f.Packing()
	s.weight = randomBytes(rng, n*rows*cols*s.es)
	if sc, ok := f.Scale(); ok {
		s.ses = int64(sc.DType.Size())
		s.gr, s.gc = s.m.ScaleShape()
		s.bo, s.bi = sc.Block[0], sc.Block[1]
		if s.bo == 0 {
			s.bo = rows
		}
		if s.bi == 0 {
			s.bi = cols
		}
		s.scales = randomBytes(rng, n*s.gr*s.gc*s.ses)
	}
	return s
}

// randomBytes are n random non-zero bytes.
func randomBytes(rng *rand.Rand, n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(1 + rng.IntN(255))
	}
	return b
}

// element is the bytes of element (r, c) of expert e, addressed by hand.
func (s *stack) element(e, r, c int64) []byte {
	at := ((e*s.m.Rows+r)*s.m.Cols + c) * s.es
	return s.weight[at : at+s.es]
}

// entry is the bytes of grid entry (g, h) of expert e.
func (s *stack) entry(e, g, h int64) []byte {
	at := ((e*s.gr+g)*s.gc + h) * s.ses
	return s.scales[at : at+s.ses]
}

// want is the bytes of rows [r0, r0+nr) x columns [c0, c0+nc) of expert e,
// row by row, and of the grid entries covering them.
func (s *stack) want(e, r0, nr, c0, nc int64) (w, sc []byte) {
	for r := r0; r < r0+nr; r++ {
		for c := c0; c < c0+nc; c++ {
			w = append(w, s.element(e, r, c)...)
		}
	}
	if s.ses == 0 {
		return w, nil
	}
	for g := r0 / s.bo; g*s.bo < r0+nr; g++ {
		for h := c0 / s.bi; h*s.bi < c0+nc; h++ {
			sc = append(sc, s.entry(e, g, h)...)
		}
	}
	return w, sc
}

// gather reads a region's ranges out of b, each shifted by base.
func gather(b []byte, r Region, base int64) []byte {
	var out []byte
	for _, rg := range r.Ranges() {
		out = append(out, b[base+rg[0]:base+rg[1]]...)
	}
	return out
}

func (s *stack) check(t *testing.T, what string, e int64, sl Slice, r0, nr, c0, nc int64) {
	t.Helper()
	ex := s.m.Expert(e)
	w, sc := s.want(e, r0, nr, c0, nc)
	if got := gather(s.weight, sl.Weight, ex.Weight.Off); !bytes.Equal(got, w) || sl.Weight.Size() != int64(len(w)) {
		t.Errorf("%s: weight bytes differ from the elements' (%d bytes, want %d)", what, len(got), len(w))
	}
	if got := gather(s.scales, sl.Scale, ex.Scale.Off); !bytes.Equal(got, sc) || sl.Scale.Size() != int64(len(sc)) {
		t.Errorf("%s: scale bytes differ from the covering entries' (%d bytes, want %d)", what, len(got), len(sc))
	}
}

var sliceFormats = []Format{
	Plain(safetensors.BF16),
	Plain(safetensors.F16),
	Plain(safetensors.F32),
	FP8Block(FP8DefaultBlock, FP8DefaultBlock, false),
	FP8Block(4, 3, false),
	FP8Block(5, 8, true),
	perChannel{},
}

// Every slice a caller cuts (row blocks, column blocks, one expert of a
// stack, the whole) addresses exactly the bytes and scale entries that
// indexing each element by hand gives, for sizes that are and are not
// multiples of the block.
func TestSlicesAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 2))
	for _, f := range sliceFormats {
		for _, size := range [][2]int64{{12, 9}, {13, 10}, {160, 96}, {1, 7}} {
			rows, cols := size[0], size[1]
			s := newStack(rng, f, 3, rows, cols)
			name := fmt.Sprintf("%s %T %dx%d", f, f, rows, cols)
			for e := range s.n {
				ex := s.m.Expert(e)
				whole := s.m.Whole()
				whole.Weight.Off, whole.Scale.Off = 0, 0
				s.check(t, name+" whole", e, whole, 0, rows, 0, cols)
				if ex.Weight.Size() != s.m.Bytes() || ex.Scale.Size() != s.m.ScaleBytes() {
					t.Errorf("%s expert %d: %d+%d bytes, want %d+%d", name, e, ex.Weight.Size(), ex.Scale.Size(), s.m.Bytes(), s.m.ScaleBytes())
				}
				for range 6 {
					r0 := rng.Int64N(rows)
					nr := 1 + rng.Int64N(rows-r0)
					s.check(t, fmt.Sprintf("%s expert %d rows %d+%d", name, e, r0, nr), e, s.m.RowBlock(r0, nr), r0, nr, 0, cols)
					c0 := rng.Int64N(cols)
					nc := 1 + rng.Int64N(cols-c0)
					s.check(t, fmt.Sprintf("%s expert %d cols %d+%d", name, e, c0, nc), e, s.m.ColBlock(c0, nc), 0, rows, c0, nc)
				}
			}
		}
	}
}

// The scale grid is one entry per block, a partial block included, and
// the whole axis where a scale spans it.
func TestScaleShape(t *testing.T) {
	for _, tc := range []struct {
		f                Format
		rows, cols       int64
		wantRows, wantCl int64
	}{
		{FP8Block(128, 128, false), 256, 7168, 2, 56},
		{FP8Block(128, 128, false), 160, 96, 2, 1},
		{FP8Block(128, 128, false), 129, 128, 2, 1},
		{FP8Block(128, 128, false), 1, 1, 1, 1},
		{FP8Block(64, 32, false), 100, 65, 2, 3},
		{perChannel{}, 100, 65, 100, 1},
		{Plain(safetensors.BF16), 100, 65, 0, 0},
	} {
		m := Matrix{Format: tc.f, Rows: tc.rows, Cols: tc.cols}
		if r, c := m.ScaleShape(); r != tc.wantRows || c != tc.wantCl {
			t.Errorf("%s %dx%d: grid %dx%d, want %dx%d", tc.f, tc.rows, tc.cols, r, c, tc.wantRows, tc.wantCl)
		}
		sc, ok := tc.f.Scale()
		if want := tc.wantRows * tc.wantCl * int64(sc.DType.Size()); m.ScaleBytes() != want || ok != (want > 0) {
			t.Errorf("%s %dx%d: %d scale bytes (scaled %v), want %d", tc.f, tc.rows, tc.cols, m.ScaleBytes(), ok, want)
		}
	}
}

// A split is exact where both pieces own whole scale entries: on block
// edges, anywhere for plain weights and along an axis a scale spans.
func TestSplitExact(t *testing.T) {
	fp8 := FP8Block(128, 128, false)
	for _, tc := range []struct {
		f                Format
		at               int64
		wantRow, wantCol bool
	}{
		{fp8, 128, true, true},
		{fp8, 256, true, true},
		{fp8, 32, false, false},
		{fp8, 0, true, true},
		{FP8Block(64, 32, false), 96, false, true},
		{FP8Block(64, 32, false), 64, true, true},
		{Plain(safetensors.BF16), 33, true, true},
		{perChannel{}, 33, true, true},
		{packed{}, 3, true, false},
		{packed{}, 4, true, true},
	} {
		m := Matrix{Format: tc.f, Rows: 512, Cols: 512}
		if got := m.RowSplitExact(tc.at); got != tc.wantRow {
			t.Errorf("%s: row split at %d exact %v, want %v", tc.f, tc.at, got, tc.wantRow)
		}
		if got := m.ColSplitExact(tc.at); got != tc.wantCol {
			t.Errorf("%s: column split at %d exact %v, want %v", tc.f, tc.at, got, tc.wantCol)
		}
	}
}

// Cutting a weight at exact splits and dequantising each piece with the
// scale entries its slice names gives the pieces of the whole weight
// dequantised at once.
func TestDequantisedPiecesMatchWhole(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 4))
	for _, f := range []Format{FP8Block(4, 3, false), FP8Block(FP8DefaultBlock, FP8DefaultBlock, false), Plain(safetensors.BF16)} {
		const rows, cols = 24, 18
		m := Matrix{Format: f, Rows: rows, Cols: cols}
		raw, scale := randomWeight(rng, f, rows*cols), randomScales(rng, m)
		whole := make([]float32, rows*cols)
		if err := f.Dequantise(raw, rows, cols, scale, whole); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, cut := range [][2]int64{{0, 12}, {12, 12}, {4, 8}} {
			if !m.RowSplitExact(cut[0]) || !m.RowSplitExact(cut[0]+cut[1]) {
				continue
			}
			sl := m.RowBlock(cut[0], cut[1])
			piece := make([]float32, cut[1]*cols)
			if err := f.Dequantise(gather(raw, sl.Weight, 0), int(cut[1]), cols, orNil(gather(scale, sl.Scale, 0), scale), piece); err != nil {
				t.Fatalf("%s rows %v: %v", f, cut, err)
			}
			if !slices.Equal(piece, whole[cut[0]*cols:(cut[0]+cut[1])*cols]) {
				t.Errorf("%s rows %d+%d: the piece dequantises differently from the whole", f, cut[0], cut[1])
			}
		}
	}
}

// orNil keeps a plain weight's absent scale absent.
func orNil(b, like []byte) []byte {
	if like == nil {
		return nil
	}
	return b
}

func TestRegionRanges(t *testing.T) {
	for _, tc := range []struct {
		r    Region
		want [][2]int64
	}{
		{Region{Off: 6, Rows: 1, RowLen: 10, Stride: 10}, [][2]int64{{6, 16}}},
		{Region{Off: 0, Rows: 3, RowLen: 4, Stride: 4}, [][2]int64{{0, 12}}},
		{Region{Off: 2, Rows: 3, RowLen: 4, Stride: 9}, [][2]int64{{2, 6}, {11, 15}, {20, 24}}},
	} {
		if got := tc.r.Ranges(); !slices.Equal(got, tc.want) {
			t.Errorf("%+v: ranges %v, want %v", tc.r, got, tc.want)
		}
	}
}

// A packed format's rows, shape and column blocks count whole packing
// units: four elements to two bytes.
func TestPackedColumns(t *testing.T) {
	m := Matrix{Format: packed{}, Rows: 3, Cols: 16}
	if m.RowBytes() != 8 || m.Bytes() != 24 || !slices.Equal(m.Shape(), []int64{3, 8}) {
		t.Errorf("16 columns: %d bytes a row, %d in all, shape %v; want 8, 24, [3 8]", m.RowBytes(), m.Bytes(), m.Shape())
	}
	if got, want := m.ColBlock(4, 8).Weight, (Region{Off: 2, Rows: 3, RowLen: 4, Stride: 8}); got != want {
		t.Errorf("columns 4..12: %+v, want %+v", got, want)
	}
	if got, want := m.RowBlock(1, 2).Weight, (Region{Off: 8, Rows: 1, RowLen: 16, Stride: 16}); got != want {
		t.Errorf("rows 1..3: %+v, want %+v", got, want)
	}
}

// perChannel is a test format with one F32 scale per row (an FP8
// per-channel layout), to check the whole-axis block arithmetic.
type perChannel struct{}

func (perChannel) Quantization() string          { return "test_per_channel" }
func (perChannel) DType() safetensors.DType      { return safetensors.F8E4M3 }
func (perChannel) Packing() (elems, bytes int64) { return 1, 1 }
func (perChannel) Scale() (Scale, bool) {
	return Scale{Suffix: "_scale", DType: safetensors.F32, Block: [2]int64{1, 0}}, true
}
func (perChannel) Dequantise([]byte, int, int, []byte, []float32) error { return nil }
func (perChannel) Fold() FoldRule                                       { return FoldRule{} }
func (perChannel) String() string                                       { return "per-channel" }

// packed is a test format of four elements to a byte pair (an int4 in
// U16 layout), to check that column splits keep whole packing units.
type packed struct{ perChannel }

func (packed) DType() safetensors.DType      { return safetensors.U8 }
func (packed) Packing() (elems, bytes int64) { return 4, 2 }
func (packed) Scale() (Scale, bool)          { return Scale{}, false }
func (packed) String() string                { return "packed" }
