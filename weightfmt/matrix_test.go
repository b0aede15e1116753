package weightfmt

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

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
			newStack(rng, f, 3, rows, cols).checkSlices(t, rng, fmt.Sprintf("%s %T %dx%d", f, f, rows, cols), 6)
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
		m := Matrix{Format: f, Rows: 24, Cols: 18}
		checkPieces(t, m, randomWeight(rng, f, m.Rows*m.Cols), randomScales(rng, m), nil, [][2]int64{{0, 12}, {12, 12}, {4, 8}}, nil)
	}
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
