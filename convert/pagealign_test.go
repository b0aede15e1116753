package convert

import (
	"bytes"
	"io"
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// TestPageAlignment checks the tensor order and the data-section phase that
// put copied tensors at their source's offset within a page.
func TestPageAlignment(t *testing.T) {
	f := testkit.Create(t, filepath.Join(t.TempDir(), "src.safetensors"))
	// part is size bytes at absolute offset abs of a source: the plain file
	// behind a section reader (as the planner opens sources), or not a file.
	mk := func(abs, size int64, fold, file bool) part {
		var src io.ReaderAt = io.NewSectionReader(f, 24, 1<<40)
		if !file {
			src = bytes.NewReader(nil)
		}
		return part{region: region{src: src, off: abs - 24, rows: 1, rowLen: size, stride: size}, fold: fold}
	}
	tensor := func(name string, parts ...part) *outTensor {
		t := &outTensor{name: name, parts: parts}
		for _, p := range parts {
			t.size += p.size()
		}
		return t
	}
	cases := []struct {
		name      string
		tensors   []*outTensor
		wantOrder string
		want      int64 // -1: no phase
	}{
		{"copied stacks win over small tensors", []*outTensor{
			tensor("a", mk(24, 4096, false, true), mk(4120, 4096, false, true)), // phase 24 at rel 0
			tensor("n", mk(5000, 100, false, true)),                             // small: moved last
			tensor("b", mk(8216, 3*4096, false, true)),                          // phase 24 again
			tensor("folded", mk(1000, 10*4096, true, true)),                     // not copied: no vote
			tensor("memory", mk(2000, 5*4096, false, false)),                    // not a file: no vote
		}, "a b folded memory n", 24},
		{"the most bytes decide", []*outTensor{
			tensor("x", mk(64, 4096, false, true)),
			tensor("y", mk(4096*9+512, 2*4096, false, true)),
		}, "x y", 512},
		{"ties go to the smaller phase", []*outTensor{
			tensor("x", mk(640, 4096, false, true)),
			tensor("y", mk(4096*9+512, 4096, false, true)),
		}, "x y", 512},
		{"phases off 8 bytes do not vote", []*outTensor{
			tensor("x", mk(4, 4*4096, false, true)),
			tensor("y", mk(4096*9+64, 4096, false, true)),
		}, "x y", 64},
		{"nothing copied", []*outTensor{
			tensor("f", mk(0, 4096, true, true)),
			tensor("m", mk(0, 4096, false, false)),
		}, "f m", -1},
		{"strided parts do not vote", []*outTensor{
			tensor("s", part{region: region{src: io.NewSectionReader(f, 24, 1<<40), off: 40, rows: 4, rowLen: 1024, stride: 2048}}),
		}, "s", -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ordered := pageOrder(c.tensors)
			var names []byte
			for i, t := range ordered {
				if i > 0 {
					names = append(names, ' ')
				}
				names = append(names, t.name...)
			}
			if string(names) != c.wantOrder {
				t.Errorf("order %q, want %q", names, c.wantOrder)
			}
			phase, ok := dataPhase(ordered)
			if !ok {
				phase = -1
			}
			if phase != c.want {
				t.Errorf("phase %d, want %d", phase, c.want)
			}
		})
	}
}
