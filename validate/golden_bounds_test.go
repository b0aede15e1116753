package validate

import (
	"encoding/binary"
	"encoding/json"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/moeprep/moeprep/internal/costtest"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
)

// Hostile golden files (issue 26): a sparse moe-layer-L.safetensors whose
// tensors claimed 4 GiB cost 3.1 GB of RSS. Shapes are checked before any
// data is read; the error names the file and the tensor.

// goldenTensorDecl is one tensor of a hand-made golden header.
type goldenTensorDecl struct {
	name  string
	dtype safetensors.DType
	shape []int64
}

// sparseGoldenFile writes a safetensors file declaring tensors whose data is
// a hole: it costs no disk whatever the shapes claim.
func sparseGoldenFile(t *testing.T, path string, tensors []goldenTensorDecl) {
	t.Helper()
	header := map[string]any{}
	off := int64(0)
	for _, d := range tensors {
		n := int64(d.dtype.Size())
		for _, s := range d.shape {
			n *= s
		}
		header[d.name] = map[string]any{"dtype": d.dtype, "shape": d.shape, "data_offsets": []int64{off, off + n}}
		off += n
	}
	hb, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	head := append(binary.LittleEndian.AppendUint64(nil, uint64(len(hb))), hb...)
	testkit.Sparse(t, path, int64(len(head))+off, head)
}

func TestReadGoldenBounds(t *testing.T) {
	f32, i32 := safetensors.F32, safetensors.I32
	xy := func(t, h int64) []goldenTensorDecl {
		return []goldenTensorDecl{{"x", f32, []int64{t, h}}, {"y", f32, []int64{t, h}}}
	}
	with := func(base []goldenTensorDecl, more ...goldenTensorDecl) []goldenTensorDecl {
		return append(append([]goldenTensorDecl{}, base...), more...)
	}
	for _, c := range []struct {
		name    string
		tensors []goldenTensorDecl // nil: a named pipe
		wantH   int
		want    string
	}{
		{"4 GiB of tokens (3.1 GB before)", xy(8388608, 64), 64, "tensor x: 8388608 tokens, over the limit of 4096"},
		{"too many values", xy(4096, 65536), 65536, "tensor x: [4096,65536] is 268435456 values, over the limit of 8388608"},
		{"hidden size, unchecked layer", xy(32, 1<<20), 0, "tensor x: hidden size 1048576, over the limit of 65536"},
		{"hidden size of the layer", xy(32, 1<<20), 64, "x is [32,1048576], the layer's hidden size is 64"},
		{"huge K", with(xy(32, 64), goldenTensorDecl{"topk_ids", i32, []int64{32, 1 << 24}}, goldenTensorDecl{"topk_weights", f32, []int64{32, 1 << 24}}), 64,
			"tensor topk_ids: K=16777216, over the limit of 1024"},
		{"topk_ids as floats", with(xy(32, 64), goldenTensorDecl{"topk_ids", f32, []int64{32, 2}}, goldenTensorDecl{"topk_weights", f32, []int64{32, 2}}), 64,
			"tensor topk_ids is F32, want I32 or I64"},
		{"huge input_ids", with(xy(32, 64), goldenTensorDecl{"input_ids", safetensors.I64, []int64{1 << 30}}), 64, "input_ids [1073741824] must be [32]"},
		{"4 GiB beside the golden", with(xy(32, 64), goldenTensorDecl{"junk", safetensors.U8, []int64{4 << 30}}), 64,
			"tensor junk: the file holds over 16777216 bytes of tensors besides x, y, topk_ids, topk_weights, input_ids and token_type_ids"},
		{"named pipe", nil, 64, "a named pipe (FIFO), not a regular file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), GoldenFileName(1))
			if c.tensors == nil {
				if err := syscall.Mkfifo(path, 0o644); err != nil {
					t.Skip("no named pipes here:", err)
				}
			} else {
				sparseGoldenFile(t, path, c.tensors)
			}
			var err error
			alloc, took := costtest.Measure(func() { _, err = ReadGolden(path, c.wantH) })
			testkit.CheckOneLine(t, err, path, c.want)
			// Refused from the header alone: nothing is read or built.
			testkit.CheckCost(t, alloc, 1<<20, took, testkit.RefusalTime)
		})
	}
}

// TestReadGoldenAtTheLimit: a golden of maxGoldenElems values in x and y is
// read holding little more than the widened values: 32 MB each, plus one
// 1 MiB chunk (it used to hold the raw bytes beside them, 64 MB more).
func TestReadGoldenAtTheLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), GoldenFileName(1))
	const tokens, hidden = 1024, 8192 // maxGoldenElems values
	sparseGoldenFile(t, path, []goldenTensorDecl{{"x", safetensors.F32, []int64{tokens, hidden}}, {"y", safetensors.F32, []int64{tokens, hidden}},
		{"topk_ids", safetensors.I64, []int64{tokens, 8}}, {"topk_weights", safetensors.BF16, []int64{tokens, 8}}})
	var g *Golden
	var err error
	alloc, took := costtest.Measure(func() { g, err = ReadGolden(path, hidden) })
	if err != nil {
		t.Fatal(err)
	}
	if g.T != tokens || g.H != hidden || g.K != 8 || len(g.X) != tokens*hidden || len(g.IDs) != tokens*8 {
		t.Fatalf("read T=%d H=%d K=%d, %d values", g.T, g.H, g.K, len(g.X))
	}
	if limit := uint64(2*4*tokens*hidden + 8<<20); alloc > limit {
		t.Errorf("allocated %d bytes, want at most %d", alloc, limit)
	}
	if took > 2*time.Second {
		t.Errorf("took %v", took)
	}
	t.Logf("%d x %d golden: %.1f MB allocated, %v", tokens, hidden, float64(alloc)/1e6, took)
}
