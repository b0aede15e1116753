package checkpoint

import (
	"bytes"
	"io"
	"reflect"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// The spans advised for the small tensors: a window from each, by file, in
// order, joined where they overlap or lie a page apart; larger tensors and
// readers that are no file section left out.
func TestSmallSpans(t *testing.T) {
	const w = smallWindowBytes
	a, b := bytes.NewReader(nil), bytes.NewReader(nil)
	at := func(r io.ReaderAt, off int64, elems int64) *Tensor {
		return &Tensor{DType: safetensors.I32, Shape: []int64{elems}, Data: io.NewSectionReader(r, off, elems*4)}
	}
	cases := []struct {
		name string
		ts   []*Tensor
		want map[io.ReaderAt][][2]int64
	}{
		{"far apart, out of order", []*Tensor{at(a, 5<<20, 2), at(a, 1<<20, 2)},
			map[io.ReaderAt][][2]int64{a: {{1 << 20, 1<<20 + w}, {5 << 20, 5<<20 + w}}}},
		{"overlapping windows join", []*Tensor{at(a, 100, 2), at(a, 100+w/2, 2)},
			map[io.ReaderAt][][2]int64{a: {{100, 100 + w/2 + w}}}},
		{"a page apart joins", []*Tensor{at(a, 0, 2), at(a, w+4096, 2)},
			map[io.ReaderAt][][2]int64{a: {{0, 2*w + 4096}}}},
		{"more than a page apart does not", []*Tensor{at(a, 0, 2), at(a, w+4097, 2)},
			map[io.ReaderAt][][2]int64{a: {{0, w}, {w + 4097, 2*w + 4097}}}},
		{"by file", []*Tensor{at(a, 0, 2), at(b, 0, 4)},
			map[io.ReaderAt][][2]int64{a: {{0, w}}, b: {{0, w}}}},
		{"larger than most, empty, not a section", []*Tensor{at(a, 0, 17), at(a, 0, 0),
			{DType: safetensors.I32, Shape: []int64{2}, Data: a}}, map[io.ReaderAt][][2]int64{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := smallSpans(c.ts, 64); !reflect.DeepEqual(got, c.want) {
				t.Errorf("spans %v, want %v", got, c.want)
			}
		})
	}
}
