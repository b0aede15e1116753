package weightfmt

import (
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
