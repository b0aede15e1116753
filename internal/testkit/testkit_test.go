package testkit

import (
	"errors"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Only tests import testkit and the packages beside it: no file of the
// module that is not a test names them.
func TestOnlyTestsImportIt(t *testing.T) {
	root := filepath.Join("..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		if strings.HasPrefix(filepath.ToSlash(path), "../../internal/testkit/") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return nil // a file mid-edit elsewhere is not this test's business
		}
		n++
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, "github.com/moeprep/moeprep/internal/testkit") {
				t.Errorf("%s imports %s: only tests may", path, p)
			}
		}
		return nil
	})
	if err != nil || n < 50 {
		t.Fatalf("read %d files: %v", n, err)
	}
}

func TestFiles(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a", "b.json")
	WriteFile(t, p, `{"n": 1.50, "s": "x"}`)
	EditJSON(t, p, func(m map[string]any) { m["s"] = "y" })
	if got := string(ReadFile(t, p)); got != "{\n  \"n\": 1.50,\n  \"s\": \"y\"\n}\n" {
		t.Errorf("edited JSON %q: the number's text must be kept", got)
	}
	if m := ReadJSON(t, p); m["n"] != 1.5 || m["s"] != "y" {
		t.Errorf("read %v", m)
	}
	if err := os.Symlink("b.json", filepath.Join(dir, "a", "link")); err != nil {
		t.Fatal(err)
	}
	CopyDir(t, dir, filepath.Join(dir+"2"))
	if got := ListDir(t, filepath.Join(dir+"2", "a")); !slices.Equal(got, []string{"b.json", "link"}) {
		t.Errorf("copy holds %v", got)
	}
	if target, err := os.Readlink(filepath.Join(dir+"2", "a", "link")); err != nil || target != "b.json" {
		t.Errorf("link copied as %q, %v", target, err)
	}

	old := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	before := KeepTimes(t, p, func() { FlipBits(t, p, -1, 0x01) })
	st, err := os.Stat(p)
	if err != nil || !st.ModTime().Equal(old) || st.Size() != before.Size() {
		t.Errorf("after FlipBits in KeepTimes: %v, %v", st, err)
	}
	if b := ReadFile(t, p); b[len(b)-1] != '\n'^0x01 {
		t.Errorf("last byte %q", b[len(b)-1])
	}

	Sparse(t, filepath.Join(dir, "sparse"), 1<<30, []byte("head"))
	if st, err := os.Stat(filepath.Join(dir, "sparse")); err != nil || st.Size() != 1<<30 {
		t.Errorf("sparse file: %v, %v", st, err)
	}
}

func TestSafetensors(t *testing.T) {
	h := &STHeader{Tensors: map[string]STTensor{"w": {DType: "BF16", Shape: []int64{2}, DataOffsets: [2]int64{0, 4}}},
		Metadata: map[string]string{"format": "pt"}}
	b, err := h.Bytes([]byte{1, 2, 3, 4})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "m.safetensors")
	WriteFile(t, p, b)
	got, err := ReadSTHeader(p)
	if err != nil {
		t.Fatal(err)
	}
	if (got.DataStart-8)%8 != 0 || got.DataStart+4 != int64(len(b)) || got.Metadata["format"] != "pt" || got.Tensors["w"].DataOffsets[1] != 4 {
		t.Errorf("read back %+v from %d bytes", got, len(b))
	}
	if _, err := ParseSTHeader(b[:10]); err == nil {
		t.Error("a cut header parsed")
	}
}

func TestEncoding(t *testing.T) {
	if got := U16LE(0x3F80, 1); !slices.Equal(got, []byte{0x80, 0x3F, 1, 0}) {
		t.Errorf("U16LE: % x", got)
	}
	if got := F32LE(1); !slices.Equal(got, []byte{0, 0, 0x80, 0x3F}) {
		t.Errorf("F32LE: % x", got)
	}
}

func TestChecks(t *testing.T) {
	// The passing cases only: a failing one would fail this test.
	if WantErr(t, nil, "") || !WantErr(t, errors.New("f: it broke"), "broke") {
		t.Error("WantErr reported the wrong case")
	}
	CheckOneLine(t, errors.New("f: it broke"), "f", "broke")
	CheckCost(t, 10, 10, time.Millisecond, RefusalTime)
	if v, err := Within(t, "a quick call", func() (int, error) { return 7, errors.New("seven") }); v != 7 || err == nil || err.Error() != "seven" {
		t.Errorf("Within handed back %v, %v", v, err)
	}
	// ErrorContains fails (and goes on) for no error and for another one.
	for _, tc := range []struct {
		err  error
		want bool
	}{{errors.New("f: it broke"), true}, {errors.New("f: it bent"), false}, {nil, false}} {
		r := &errorRecorder{TB: t}
		if got := ErrorContains(r, tc.err, "broke", "case"); got != tc.want || r.failed == tc.want {
			t.Errorf("ErrorContains(%v, \"broke\") = %v, failed %v", tc.err, got, r.failed)
		}
	}
}

// errorRecorder is a testing.TB whose Errorf records the failure instead
// of failing the test.
type errorRecorder struct {
	testing.TB
	failed bool
}

func (r *errorRecorder) Helper()               {}
func (r *errorRecorder) Errorf(string, ...any) { r.failed = true }
