package convert

import (
	"bytes"
	"math/rand"
	"strings"
	"testing"
)

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
