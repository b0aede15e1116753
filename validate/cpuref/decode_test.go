package cpuref

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

func TestDecode(t *testing.T) {
	le16 := func(v ...uint16) []byte {
		b := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(b[2*i:], x)
		}
		return b
	}
	f32 := make([]byte, 8)
	binary.LittleEndian.PutUint32(f32, math.Float32bits(1.25))
	binary.LittleEndian.PutUint32(f32[4:], math.Float32bits(-3))
	f64 := make([]byte, 8)
	binary.LittleEndian.PutUint64(f64, math.Float64bits(0.5))
	tests := []struct {
		dt   safetensors.DType
		in   []byte
		want []float32
	}{
		{safetensors.BF16, le16(0x3F80, 0xC000), []float32{1, -2}},
		{safetensors.F16, le16(0x3C00, 0x3800), []float32{1, 0.5}},
		{safetensors.F32, f32, []float32{1.25, -3}},
		{safetensors.F64, f64, []float32{0.5}},
		{safetensors.F8E4M3, []byte{0x38, 0x7E, 0x01}, []float32{1, 448, float32(math.Ldexp(1, -9))}},
		{safetensors.F8E5M2, []byte{0x3C, 0xC0}, []float32{1, -2}},
		{safetensors.F8E8M0, []byte{127, 130}, []float32{1, 8}},
	}
	for _, tt := range tests {
		got := make([]float32, len(tt.want))
		if err := Decode(tt.dt, tt.in, got); err != nil {
			t.Fatalf("%s: %v", tt.dt, err)
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%s[%d] = %v, want %v", tt.dt, i, got[i], tt.want[i])
			}
		}
	}
	if err := Decode(safetensors.BF16, []byte{1, 2, 3}, make([]float32, 2)); err == nil {
		t.Error("a short buffer decoded")
	}
	if err := Decode(safetensors.I32, make([]byte, 4), make([]float32, 1)); err == nil {
		t.Error("I32 decoded as a float")
	}
}

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
	sr, sc := ScaleDims(rows, cols, blk, blk)
	if sr != 2 || sc != 3 {
		t.Fatalf("ScaleDims = %d,%d, want 2,3", sr, sc)
	}
	scale := []float32{0.5, 2, 3, 0.25, 1e-3, 7}
	dst := make([]float32, rows*cols)
	if err := weightfmt.DequantE4M3(src, rows, cols, scale, blk, blk, dst); err != nil {
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
	sr, sc = ScaleDims(rows, cols, 64, 128)
	scale2 := make([]float32, sr*sc)
	for i := range scale2 {
		scale2[i] = float32(i + 1)
	}
	if err := weightfmt.DequantE4M3(src, rows, cols, scale2, 64, 128, dst); err != nil {
		t.Fatal(err)
	}
	if i := 70*cols + 200; dst[i] != numfmt.E4M3ToF32(src[i])*scale2[1*sc+1] {
		t.Errorf("64x128 block (70,200) = %v", dst[i])
	}
	if err := weightfmt.DequantE4M3(src, rows, cols, scale[:5], blk, blk, dst); err == nil {
		t.Error("a short scale grid was accepted")
	}
}
