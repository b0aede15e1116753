package weightfmt

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
)

func TestDequantE4M3(t *testing.T) {
	// 130 x 260 with 128x128 blocks: a 2x3 scale grid with ragged edges.
	const rows, cols, blk = 130, 260, 128
	r := rand.New(rand.NewPCG(3, 4))
	src := make([]byte, rows*cols)
	for i := range src {
		src[i] = byte(r.IntN(256))
		if src[i]&0x7F == 0x7F { // keep NaNs out of the arithmetic check
			src[i] = 0x38
		}
	}
	sr, sc := (rows+blk-1)/blk, (cols+blk-1)/blk
	if sr != 2 || sc != 3 {
		t.Fatalf("scale grid %d,%d, want 2,3", sr, sc)
	}
	scale := []float32{0.5, 2, 3, 0.25, 1e-3, 7}
	dst := make([]float32, rows*cols)
	if err := DequantE4M3(src, rows, cols, scale, blk, blk, dst); err != nil {
		t.Fatal(err)
	}
	for _, rc := range [][2]int{{0, 0}, {127, 127}, {127, 128}, {128, 127}, {129, 259}, {64, 200}, {129, 0}} {
		i := rc[0]*cols + rc[1]
		want := numfmt.E4M3ToF32(src[i]) * scale[(rc[0]/blk)*sc+rc[1]/blk]
		if dst[i] != want {
			t.Errorf("(%d,%d) = %v, want %v", rc[0], rc[1], dst[i], want)
		}
	}
	for i := range dst {
		want := numfmt.E4M3ToF32(src[i]) * scale[(i/cols/blk)*sc+(i%cols)/blk]
		if dst[i] != want {
			t.Fatalf("element %d = %v, want %v", i, dst[i], want)
		}
	}
	// Non-square blocks (bo 64, bi 128).
	sr, sc = (rows+63)/64, (cols+127)/128
	scale2 := make([]float32, sr*sc)
	for i := range scale2 {
		scale2[i] = float32(i + 1)
	}
	if err := DequantE4M3(src, rows, cols, scale2, 64, 128, dst); err != nil {
		t.Fatal(err)
	}
	if i := 70*cols + 200; dst[i] != numfmt.E4M3ToF32(src[i])*scale2[1*sc+1] {
		t.Errorf("64x128 block (70,200) = %v", dst[i])
	}
	if err := DequantE4M3(src, rows, cols, scale[:5], blk, blk, dst); err == nil {
		t.Error("a short scale grid was accepted")
	}
}

// TestDequantE4M3HostileShape: shapes whose product wraps, and blocks near
// the int limit, are errors, never a panic or a wrong-sized loop.
func TestDequantE4M3HostileShape(t *testing.T) {
	const big = 1 << 62
	cases := []struct {
		name               string
		rows, cols, bo, bi int
		src, dst, scale    int
	}{
		{"rows*cols wraps to 0", big, 4, 128, 128, 0, 0, 1},
		{"rows*cols wraps to the buffer", 1<<62 + 1, 4, 128, 128, 4, 4, 1},
		// Before the wrap check this indexed past src: a panic.
		{"rows*cols wraps, blocks fit the grid", 1<<62 + 1, 4, math.MaxInt / 2, 4, 4, 4, 2},
		{"negative rows", -1, 4, 128, 128, 0, 0, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := DequantE4M3(make([]byte, c.src), c.rows, c.cols, make([]float32, c.scale), c.bo, c.bi, make([]float32, c.dst))
			if err == nil {
				t.Fatal("accepted")
			}
		})
	}
	// A block larger than the weight is one block, however large: the ceil
	// must not wrap (it did at (rows+bo-1)/bo and left dst unwritten).
	dst := []float32{-1, -1, -1, -1}
	if err := DequantE4M3([]byte{0x38, 0x38, 0x38, 0x38}, 2, 2, []float32{2}, math.MaxInt, math.MaxInt, dst); err != nil {
		t.Fatal(err)
	}
	for i, v := range dst {
		if v != 2 { // E4M3 0x38 is 1.0
			t.Errorf("dst[%d] = %v, want 2", i, v)
		}
	}
}
