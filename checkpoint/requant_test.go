package checkpoint

import (
	"bytes"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// TestRequantisedShared: two callers that requantise the same tensor into
// the same format (validate's byte proof and its CPU reference) get the
// same bytes and quantise it once between them: the plain weight is read
// once, not once per caller, for each format.
func TestRequantisedShared(t *testing.T) {
	const rows, cols = 64, 128
	raw := make([]byte, rows*cols*2)
	for i := 0; i < rows*cols; i++ {
		raw[2*i], raw[2*i+1] = byte(i*7), 0x3c+byte(i%3) // BF16, finite
	}
	sr := &spanReader{r: bytes.NewReader(raw)}
	src := &Tensor{Name: "w", DType: safetensors.BF16, Shape: []int64{rows, cols}, File: "f.safetensors", Data: sr}
	read := func() (n int64) { // plain bytes read since the last call
		for _, sp := range sr.spans {
			n += sp[1] - sp[0]
		}
		sr.spans = nil
		return n
	}
	whole := func(tn *Tensor) []byte {
		b := make([]byte, tn.NumBytes())
		if _, err := tn.Data.ReadAt(b, 0); err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		f        weightfmt.Format
		wantRead int64 // plain bytes read by both callers together
	}{
		{weightfmt.Int4Pack(32, safetensors.BF16), int64(len(raw))},
		{weightfmt.Int4Pack(64, safetensors.BF16), int64(len(raw))},
	}
	for _, tc := range cases {
		read()
		w1, _, err := Requantised(src, tc.f)
		if err != nil {
			t.Fatal(err)
		}
		w2, _, err := Requantised(src, tc.f)
		if err != nil {
			t.Fatal(err)
		}
		a, b := whole(w1), whole(w2)
		if !bytes.Equal(a, b) {
			t.Errorf("%s: two requantisations of one tensor differ", tc.f.Quantization())
		}
		if got := read(); got != tc.wantRead {
			t.Errorf("%s: the plain weight's bytes were read %d times over (%d bytes), want once (%d)", tc.f.Quantization(), got/int64(len(raw)), got, tc.wantRead)
		}
	}
}
