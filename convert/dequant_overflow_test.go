package convert

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/safetensors"
)

// patchTensor overwrites bytes of tensor name in its shard, at off of its
// data.
func patchTensor(t *testing.T, dir, name string, off int64, b []byte) {
	t.Helper()
	tn, ok := cktest.Open(t, dir).Tensor(name)
	if !ok {
		t.Fatalf("no tensor %s", name)
	}
	h, err := testkit.ReadSTHeader(tn.File)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(tn.File, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, h.DataStart+h.Tensors[name].DataOffsets[0]+off); err != nil {
		t.Fatal(err)
	}
}

// mxfp4Expert0 sets the first 32-element group of expert 0's gate_up
// weight (row 0) of gpt-oss's layer 0: E8M0 scale e, FP4 code at column 1,
// zeros elsewhere.
func mxfp4Expert0(e, code byte) func(t *testing.T, dir string) {
	return func(t *testing.T, dir string) {
		const stack = "model.layers.0.mlp.experts.gate_up_proj"
		patchTensor(t, dir, stack+"_scales", 0, []byte{e})
		group := make([]byte, 16)
		group[0] = code << 4 // column 1: the high nibble
		patchTensor(t, dir, stack+"_blocks", 0, group)
	}
}

// int4Expert0 sets the first 32-column group of Kimi's layer 1 expert 0
// gate weight (row 0): BF16 scale s, q = u - 8 at column 1, zeros
// elsewhere.
func int4Expert0(s uint16, q int) func(t *testing.T, dir string) {
	return func(t *testing.T, dir string) {
		const w = "model.layers.1.mlp.experts.0.gate_proj.weight"
		patchTensor(t, dir, w+"_scale", 0, testkit.U16LE(s))
		words := make([]byte, 16)
		for i := range 4 {
			binary.LittleEndian.PutUint32(words[4*i:], 0x88888888)
		}
		binary.LittleEndian.PutUint32(words, 0x88888808|uint32(q+8)<<4)
		patchTensor(t, dir, w+"_packed", 0, words)
	}
}

// convert --dtype refuses, in every target dtype, a checkpoint holding a
// finite value whose exact dequantisation is past the target (here past
// float32 itself: MXFP4's E8M0 254 times FP4 6.0, INT4's largest bf16
// scale times -8), with one line naming the tensor, row, column and
// value, and leaves nothing that looks complete; the same checkpoints
// with a value the target holds convert, with no infinity or NaN written.
func TestDequantRefusesOverflowEndToEnd(t *testing.T) {
	for _, tc := range []struct {
		name, preset string
		edit         func(t *testing.T, dir string)
		refused      []safetensors.DType
		want         []string // what the refusal names
	}{
		{"mxfp4 E8M0 254 times 6.0", "small-gpt-oss-mxfp4", mxfp4Expert0(254, 7), dequantDTypes,
			[]string{"model.layers.0.mlp.experts.gate_up_proj", "row 0, column 1", "1.0208471007628154e+39"}},
		{"int4 largest bf16 scale times -8", "small-kimi-k2-int4", int4Expert0(0x7f7f, -8), dequantDTypes,
			[]string{"model.layers.1.mlp.experts.0.gate_proj.weight", "row 0, column 1", "-2.7116251114012284e+39"}},
		// finite in bf16 and f32: only f16 refuses, as it always has
		{"mxfp4 E8M0 254 times 1.0", "small-gpt-oss-mxfp4", mxfp4Expert0(254, 2), []safetensors.DType{safetensors.F16},
			[]string{"model.layers.0.mlp.experts.gate_up_proj", "row 0, column 1", "1.7014118e+38"}},
		{"int4 largest bf16 scale times -1", "small-kimi-k2-int4", int4Expert0(0x7f7f, -1), []safetensors.DType{safetensors.F16},
			[]string{"model.layers.1.mlp.experts.0.gate_proj.weight", "row 0, column 1", "-3.3895314e+38"}},
	} {
		src := synthPreset(t, tc.preset)
		tc.edit(t, src)
		for _, to := range dequantDTypes {
			t.Run(tc.name+" "+string(to), func(t *testing.T) {
				dst := filepath.Join(t.TempDir(), "dst")
				_, err := Convert(context.Background(), Options{Src: src, Dst: dst, DType: to})
				refused := false
				for _, d := range tc.refused {
					refused = refused || d == to
				}
				if !refused {
					if err != nil {
						t.Fatal(err)
					}
					noNonFinite(t, dst)
					return
				}
				if err == nil {
					t.Fatalf("converted; want a refusal naming %q", tc.want)
				}
				for _, s := range append(tc.want, "overflows "+string(to)) {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("%v: does not say %q", err, s)
					}
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error spans lines: %q", err)
				}
				assertNothingComplete(t, dst)
			})
		}
	}
}

// dequantDTypes are the dtypes --dtype takes.
var dequantDTypes = []safetensors.DType{safetensors.BF16, safetensors.F16, safetensors.F32}

// noNonFinite: no BF16, F16 or F32 tensor of dir holds an infinity or NaN.
func noNonFinite(t *testing.T, dir string) {
	t.Helper()
	out, _ := readOut(t, dir)
	for name, x := range out {
		var bad bool
		switch x.dtype {
		case safetensors.F32:
			for i := 0; i+4 <= len(x.data); i += 4 {
				v := float64(math.Float32frombits(binary.LittleEndian.Uint32(x.data[i:])))
				bad = bad || math.IsInf(v, 0) || math.IsNaN(v)
			}
		case safetensors.BF16:
			for i := 0; i+2 <= len(x.data); i += 2 {
				bad = bad || binary.LittleEndian.Uint16(x.data[i:])&0x7f80 == 0x7f80
			}
		case safetensors.F16:
			for i := 0; i+2 <= len(x.data); i += 2 {
				bad = bad || binary.LittleEndian.Uint16(x.data[i:])&0x7c00 == 0x7c00
			}
		}
		if bad {
			t.Errorf("%s holds an infinity or NaN", name)
		}
	}
}
