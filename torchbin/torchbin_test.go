package torchbin

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
)

// golden is a testdata/X.json written by gen.py next to X.bin.
type golden struct {
	Tensors []struct {
		Name  string
		DType safetensors.DType
		Shape []int64
		Hex   string
	}
	Skipped []string
}

func readGolden(t *testing.T, bin string) golden {
	t.Helper()
	b := testkit.ReadFile(t, strings.TrimSuffix(bin, filepath.Ext(bin))+".json")
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// readChunked reads r in chunks of varying odd sizes through ReadAt, so
// reads start and stop inside elements and rows.
func readChunked(t *testing.T, r io.ReaderAt, n int64, rng *rand.Rand) []byte {
	t.Helper()
	out := make([]byte, 0, n)
	for off := int64(0); off < n; {
		k := 1 + rng.IntN(7)
		buf := make([]byte, k)
		m, err := r.ReadAt(buf, off)
		if m < k && err == nil {
			t.Fatalf("short ReadAt(%d, %d) = %d without an error", k, off, m)
		}
		if m == 0 {
			t.Fatalf("ReadAt(%d, %d): no progress: %v", k, off, err)
		}
		out = append(out, buf[:m]...)
		off += int64(m)
	}
	return out
}

// TestGolden opens every checkpoint torch (or gen.py) wrote and compares
// names, order, dtypes, shapes and row-major bytes with what torch saw.
func TestGolden(t *testing.T) {
	files := []string{
		"dtypes.bin", "views.bin", "param.bin", "linear.bin", "wrapped.bin", "float8.bin",
		"sharded/pytorch_model-00001-of-00002.bin", "sharded/pytorch_model-00002-of-00002.bin",
		"torch2.bin",
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, name := range files {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", name)
			g := readGolden(t, path)
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if len(f.Tensors) != len(g.Tensors) {
				t.Fatalf("%d tensors, want %d", len(f.Tensors), len(g.Tensors))
			}
			if strings.Join(f.Skipped, ",") != strings.Join(g.Skipped, ",") {
				t.Errorf("skipped %q, want %q", f.Skipped, g.Skipped)
			}
			for i, want := range g.Tensors {
				got := f.Tensors[i]
				if got.Name != want.Name || got.DType != want.DType || !slices.Equal(got.Shape, want.Shape) {
					t.Fatalf("tensor %d = %s %s %v, want %s %s %v", i, got.Name, got.DType, got.Shape, want.Name, want.DType, want.Shape)
				}
				wantBytes, _ := hex.DecodeString(want.Hex)
				if got.NumBytes() != int64(len(wantBytes)) {
					t.Fatalf("%s: NumBytes %d, want %d", got.Name, got.NumBytes(), len(wantBytes))
				}
				all, err := io.ReadAll(io.NewSectionReader(got.Data, 0, got.NumBytes()))
				if err != nil || !bytes.Equal(all, wantBytes) {
					t.Fatalf("%s: bytes %x (%v), want %x", got.Name, all, err, wantBytes)
				}
				if c := readChunked(t, got.Data, got.NumBytes(), rng); !bytes.Equal(c, wantBytes) {
					t.Fatalf("%s: chunked bytes %x, want %x", got.Name, c, wantBytes)
				}
				if n, err := got.Data.ReadAt(make([]byte, 1), got.NumBytes()); n != 0 || err != io.EOF {
					t.Errorf("%s: read at end = %d, %v; want 0, EOF", got.Name, n, err)
				}
			}
		})
	}
}

// TestLayoutChoice: contiguous tensors are plain section readers into the
// file (streamed by offset), tied weights point at the same bytes, and
// views that need gathering are not section readers.
func TestLayoutChoice(t *testing.T) {
	f, err := Open("testdata/views.bin")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	section := func(name string) (*io.SectionReader, bool) {
		tt, ok := f.Lookup(name)
		if !ok {
			t.Fatalf("no tensor %s", name)
		}
		s, ok := tt.Data.(*io.SectionReader)
		return s, ok
	}
	emb, ok1 := section("embed.weight")
	head, ok2 := section("lm_head.weight")
	if !ok1 || !ok2 {
		t.Fatal("tied contiguous weights are not section readers")
	}
	_, eOff, _ := emb.Outer()
	_, hOff, _ := head.Outer()
	if eOff != hOff {
		t.Errorf("tied weights at offsets %d and %d, want the same storage", eOff, hOff)
	}
	slice, ok := section("slice")
	if !ok {
		t.Fatal("slice is not a section reader")
	}
	if _, sOff, n := slice.Outer(); n != 10 || sOff%64 != 4 {
		// torch aligns storage entries to 64 bytes; offset 2 bf16 = 4 bytes.
		t.Errorf("slice section at %d+%d, want storage start + 4, 10 bytes", sOff, n)
	}
	for _, name := range []string{"transposed", "block", "permuted", "every_other", "lm_head_t"} {
		if _, ok := section(name); ok {
			t.Errorf("%s: a non-contiguous view must gather, got a section reader", name)
		}
	}
	// expand(1, 4): stride 0 on a dim of size 1 never steps, so it streams
	// its storage as is.
	if _, ok := section("expanded"); !ok {
		t.Error("expanded: a size-1 expand must be a section reader")
	}
}

// TestBroken: each deliberately broken file is refused with its own
// one-line error naming the file.
func TestBroken(t *testing.T) {
	cases := []struct{ file, want string }{
		{"malicious.bin", "data.pkl: refusing to load class os.system (not in the allowlist for state dicts)"},
		{"malicious_posix.bin", "refusing to load class posix.system"},
		{"legacy.bin", "legacy (pre-1.6) torch.save format is not supported; re-save it with torch.save(torch.load(path), path) on torch >= 1.6, or convert to safetensors"},
		{"torchscript.pt", "TorchScript archive, not a state dict; save model.state_dict() with torch.save"},
		{"compressed.bin", `storage "0": entry good_small/data/0 is compressed (zip method 8)`},
		{"truncated_storage.bin", `storage "0": entry data/0 holds 40 bytes, but the pickle says 16 elements of 4 bytes`},
		{"past_eof.bin", "runs past the end of the file"},
		{"out_of_bounds.bin", `tensor "w": view (offset 1, shape [2 2], stride [2 1]) reaches element 4 of storage "0", which has 4 elements`},
		{"missing_storage.bin", `storage "7": entry missing_storage/data/7 is missing from the archive`},
		{"numel_mismatch.bin", "holds 16 bytes, but the pickle says 5 elements"},
		{"not_a_dict.bin", "top-level object is list, not a dict of tensors"},
		{"list_value.bin", `key "extra" holds a list, not a tensor`},
		{"two_models.bin", `top-level key "optimizer" holds a dict beside "state_dict"`},
		{"big_endian.bin", "big-endian checkpoint"},
		{"bad_storage_key.bin", `storage key "../0" is not a plain entry name`},
		{"not_torch.bin", "not a torch.save zip archive"},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			path := filepath.Join("testdata", c.file)
			f, err := Open(path)
			if err == nil {
				f.Close()
				t.Fatal("opened without an error")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, path+": ") || !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
				t.Errorf("error %q\nwant one line starting %q containing %q", msg, path+": ", c.want)
			}
		})
	}
}

func TestOpenMissingFile(t *testing.T) {
	_, err := Open("testdata/nope.bin")
	if err == nil || !strings.Contains(err.Error(), "testdata/nope.bin") {
		t.Fatalf("error %v does not name the file", err)
	}
}
