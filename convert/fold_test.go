package convert

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
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

// The shard writer folds a part chunk by chunk: any element-aligned cut
// must give the bytes of folding it whole, each element FoldValue, and the
// largest relative change must be what the elements themselves give.
func TestFoldInPlaceAnyChunking(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	for _, d := range []safetensors.DType{safetensors.F32, safetensors.BF16, safetensors.F16} {
		es := d.Size()
		src := make([]byte, es*1001)
		for i := 0; i < len(src); i += es {
			v := float32(rng.NormFloat64() * 0.02)
			switch d {
			case safetensors.F32:
				binary.LittleEndian.PutUint32(src[i:], math.Float32bits(v))
			case safetensors.BF16:
				binary.LittleEndian.PutUint16(src[i:], numfmt.F64ToBF16(float64(v)))
			case safetensors.F16:
				binary.LittleEndian.PutUint16(src[i:], numfmt.F64ToF16(float64(v)))
			}
		}
		whole := append([]byte(nil), src...)
		wantMax := foldInPlace(whole, d, 2.5)
		if d != safetensors.F32 && wantMax == 0 {
			t.Fatalf("%s: folding 2.5 into 1001 random values changed none of them", d)
		}
		for i := 0; i < len(src); i += es {
			x, got := decode(src[i:], d), decode(whole[i:], d)
			if want := FoldValue(x, 2.5, d); got != want {
				t.Fatalf("%s element %d: %v folded to %v, want %v", d, i/es, x, got, want)
			}
		}
		for _, chunk := range []int{1, 3, 7, 1000} {
			got := append([]byte(nil), src...)
			maxRel := 0.0
			for off := 0; off < len(got); off += chunk * es {
				maxRel = max(maxRel, foldInPlace(got[off:min(off+chunk*es, len(got))], d, 2.5))
			}
			if !bytes.Equal(got, whole) || maxRel != wantMax {
				t.Errorf("%s, chunks of %d elements: bytes equal %v, max change %g want %g", d, chunk, bytes.Equal(got, whole), maxRel, wantMax)
			}
		}
	}
}

// region.readAt reads any range of a region's stream: whole tensors, row
// blocks and column blocks, from any position and length, and calls a
// short source an error that names the file and tensor.
func TestRegionReadAt(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	m := make([]byte, 60) // a 5x12-byte matrix
	rng.Read(m)
	for _, tc := range []struct {
		name string
		r    region
		want []byte
	}{
		{"columns 4..8", region{off: 4, rows: 5, rowLen: 4, stride: 12}, colsOf(m, 5, 12, 4, 4)},
		{"rows 1..3", region{off: 12, rows: 1, rowLen: 36, stride: 36}, m[12:48]},
		{"contiguous rows", region{off: 24, rows: 3, rowLen: 12, stride: 12}, m[24:60]},
	} {
		tc.r.src, tc.r.file, tc.r.tensor = bytes.NewReader(m), "f", "t"
		for pos := int64(0); pos < tc.r.size(); pos++ {
			for n := int64(1); pos+n <= tc.r.size(); n += 3 {
				got := make([]byte, n)
				if err := tc.r.readAt(got, pos); err != nil || !bytes.Equal(got, tc.want[pos:pos+n]) {
					t.Fatalf("%s: bytes %d..%d: %v %v, want %v", tc.name, pos, pos+n, got, err, tc.want[pos:pos+n])
				}
			}
		}
	}
	short := region{src: bytes.NewReader(m[:50]), file: "f.safetensors", tensor: "w", off: 4, rows: 5, rowLen: 4, stride: 12}
	err := short.readAt(make([]byte, 20), 0)
	if err == nil || !strings.Contains(err.Error(), "f.safetensors") || !strings.Contains(err.Error(), "tensor w") {
		t.Errorf("short source: %v", err)
	}
}
