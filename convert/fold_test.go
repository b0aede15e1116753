package convert

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"math/rand"
	"testing"
	"testing/iotest"

	"github.com/moeprep/moeprep/safetensors"
)

// FoldValue rounds the exact product once in the tensor's dtype (numfmt's
// tests prove the rounding itself against math/big on random products).
func TestFoldValueRoundsOnce(t *testing.T) {
	for _, tc := range []struct {
		x, f float64
		d    safetensors.DType
		want float64
	}{
		{1 + 1.0/128, 1.5, safetensors.BF16, 1.515625},          // 1.51171875 is a bf16 tie: to even
		{257.0 / 256 * 2, 1, safetensors.BF16, 2},               // not representable input rounds to even
		{1 + 0x1p-8 + 0x1p-30, 1, safetensors.BF16, 1 + 0x1p-7}, // through float32 it would round twice, to 1
		{1 + 0x1p-11 + 0x1p-40, 1, safetensors.F16, 1 + 0x1p-10},
		{1 + 0x1p-23, 1 + 0x1p-24, safetensors.F32, 1 + 0x1p-22}, // just past an f32 tie: up
		{0x1p-24, 2.5, safetensors.F16, 0x1p-23},                 // subnormal 2.5 steps tie to even 2
		{3 * 0x1p-24, 2.5, safetensors.F16, 0x1p-21},             // 7.5 steps tie to 8
		{3e38, 2.5, safetensors.BF16, math.Inf(1)},
		{60000, 2.5, safetensors.F16, math.Inf(1)},
		{-60000, 2.5, safetensors.F16, math.Inf(-1)},
	} {
		if got := FoldValue(tc.x, tc.f, tc.d); got != tc.want {
			t.Errorf("FoldValue(%v, %v, %s) = %v, want %v", tc.x, tc.f, tc.d, got, tc.want)
		}
	}
}

func TestFoldReaderAnyChunking(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	src := make([]byte, 4*1001)
	for i := 0; i < len(src); i += 4 {
		binary.LittleEndian.PutUint32(src[i:], math.Float32bits(float32(rng.Float64())))
	}
	want := append([]byte(nil), src...)
	foldInPlace(want, safetensors.F32, 2.5)
	for _, chunk := range []int{1, 3, 4, 7, 4096} {
		st := &foldStats{}
		fr, err := newFoldReader(iotest.HalfReader(bytes.NewReader(src)), safetensors.F32, 2.5, st)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		buf := make([]byte, chunk)
		for {
			n, err := fr.Read(buf)
			out.Write(buf[:n])
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(out.Bytes(), want) {
			t.Errorf("chunk %d: folded stream differs", chunk)
		}
	}
	// a stream that ends inside an element is an error, not a short tensor
	fr, _ := newFoldReader(bytes.NewReader(src[:6]), safetensors.F32, 2.5, &foldStats{})
	if _, err := io.ReadAll(fr); err == nil {
		t.Error("truncated element accepted")
	}
}

func TestStridedReaderColumns(t *testing.T) {
	// a 5x12-byte matrix; take byte columns 4..8 of each row
	m := make([]byte, 60)
	for i := range m {
		m[i] = byte(i)
	}
	r := region{src: bytes.NewReader(m), file: "f", tensor: "t", off: 4, rows: 5, rowLen: 4, stride: 12}
	for _, chunk := range []int{1, 3, 4, 100} {
		rd := r.open()
		var out bytes.Buffer
		buf := make([]byte, chunk)
		for {
			n, err := rd.Read(buf)
			out.Write(buf[:n])
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if want := colsOf(m, 5, 12, 4, 4); !bytes.Equal(out.Bytes(), want) {
			t.Errorf("chunk %d: got %v want %v", chunk, out.Bytes(), want)
		}
	}
	short := region{src: bytes.NewReader(m[:50]), file: "f", tensor: "t", off: 4, rows: 5, rowLen: 4, stride: 12}
	if _, err := io.ReadAll(short.open()); err == nil {
		t.Error("short source accepted")
	}
}
