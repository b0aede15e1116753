package redteam

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	pk "github.com/moeprep/moeprep/internal/testkit/pickle"
)

// tree is a directory's content: every entry by relative path, as
// "file <sha256>", "link <target>" or "dir". Links are not followed.
type tree map[string]string

func snapshot(t testing.TB, dir string) tree {
	t.Helper()
	out := tree{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		switch {
		case d.IsDir():
			out[rel] = "dir"
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			out[rel] = "link " + target
		case d.Type().IsRegular():
			sum, err := sha256File(path)
			if err != nil {
				return err
			}
			out[rel] = "file " + sum
		default:
			out[rel] = d.Type().String()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s: %v", dir, err)
	}
	return out
}

// assertUnchanged fails for every entry of dir that differs from before.
func assertUnchanged(t testing.TB, dir string, before tree) {
	t.Helper()
	if _, err := os.Lstat(dir); err != nil {
		t.Errorf("%s is gone: %v", dir, err)
		return
	}
	after := snapshot(t, dir)
	for _, p := range slices.Sorted(maps.Keys(before)) {
		if a, ok := after[p]; !ok {
			t.Errorf("%s: %s was removed", dir, p)
		} else if a != before[p] {
			t.Errorf("%s: %s changed (%s, was %s)", dir, p, a, before[p])
		}
	}
	for _, p := range slices.Sorted(maps.Keys(after)) {
		if _, ok := before[p]; !ok {
			t.Errorf("%s: %s appeared", dir, p)
		}
	}
}

// assertAbsent fails if any of paths exists.
func assertAbsent(t testing.TB, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s exists after the failed run", p)
		}
	}
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// sameFiles reports whether two files hold the same bytes, by their
// SHA-256 (sha256File, as the snapshots of a tree compare).
func sameFiles(a, b string) error {
	ha, err := sha256File(a)
	if err != nil {
		return err
	}
	hb, err := sha256File(b)
	if err != nil {
		return err
	}
	if ha != hb {
		return fmt.Errorf("%s and %s differ (SHA-256 %s and %s)", a, b, ha, hb)
	}
	return nil
}

const manifestName = "moeprep-manifest.json"

// rehash rewrites the manifest entries of files (paths relative to dst,
// "/"-separated) as an attacker who changed them would: size and SHA-256 of
// what is there now; a file that no longer exists loses its entry.
func rehash(t testing.TB, dst string, files ...string) {
	t.Helper()
	editManifest(t, dst, func(entries map[string]any) {
		for _, f := range files {
			p := filepath.Join(dst, filepath.FromSlash(f))
			st, err := os.Stat(p)
			if err != nil {
				delete(entries, f)
				continue
			}
			sum, err := sha256File(p)
			if err != nil {
				t.Fatal(err)
			}
			entries[f] = map[string]any{"size": st.Size(), "sha256": sum}
		}
	})
}

// editManifest rewrites dst's manifest's "files" object through edit.
func editManifest(t testing.TB, dst string, edit func(entries map[string]any)) {
	t.Helper()
	testkit.EditJSON(t, filepath.Join(dst, manifestName), func(m map[string]any) {
		files, ok := m["files"].(map[string]any)
		if !ok {
			t.Fatalf("%s: no files object", manifestName)
		}
		edit(files)
	})
}

// stFile is a safetensors file split into its header and data.
type stFile struct {
	*testkit.STHeader
	data []byte
}

func readST(t testing.TB, path string) *stFile {
	t.Helper()
	b := testkit.ReadFile(t, path)
	h, err := testkit.ParseSTHeader(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &stFile{h, b[h.DataStart:]}
}

func (f *stFile) write(t testing.TB, path string) {
	t.Helper()
	b, err := f.Bytes(f.data)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, path, b)
}

// add appends a tensor of these bytes (which need not fit its shape).
func (f *stFile) add(name, dtype string, shape []int64, data []byte) {
	end := int64(len(f.data))
	f.Tensors[name] = testkit.STTensor{DType: dtype, Shape: shape, DataOffsets: [2]int64{end, end + int64(len(data))}}
	f.data = append(f.data, data...)
}

// rename renames tensor from to to in the file (and nowhere else).
func (f *stFile) rename(t testing.TB, from, to string) {
	t.Helper()
	e, ok := f.Tensors[from]
	if !ok {
		t.Fatalf("no tensor %q", from)
	}
	delete(f.Tensors, from)
	f.Tensors[to] = e
}

// onlyFile returns the one file of dir whose name matches pattern.
func onlyFile(t testing.TB, dir, pattern string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil || len(m) != 1 {
		t.Fatalf("%s: want one %s, have %v (%v)", dir, pattern, m, err)
	}
	return m[0]
}

// torchZip writes a PyTorch zip checkpoint the way torch.save lays it out
// (see pk.Zip), its pickle streamed from parts (see pk.Stream), so that the
// test process itself never holds a hostile pickle in memory: its peak RSS
// bounds what the children's can be measured against (see startMoeprep).
func torchZip(t testing.TB, path string, parts []any, storages map[string][]byte) {
	t.Helper()
	testkit.WriteStream(t, path, func(w io.Writer) error { return pk.Zip(w, "archive", pk.Stream(parts...), storages) })
}
