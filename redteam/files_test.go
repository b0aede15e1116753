package redteam

import (
	"archive/zip"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// copyTree copies the directory src to dst: regular files by content,
// symbolic links as links.
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		}
		return copyFile(path, to)
	})
	if err != nil {
		t.Fatalf("copying %s: %v", src, err)
	}
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

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

// sameFiles reports the first difference between two files' bytes.
func sameFiles(a, b string) error {
	fa, err := os.Open(a)
	if err != nil {
		return err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return err
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); ; {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return fmt.Errorf("%s and %s differ within bytes %d..%d", a, b, off, off+int64(max(na, nb)))
		}
		off += int64(na)
		if ea != nil || eb != nil {
			return nil
		}
	}
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// editJSON rewrites the JSON object in path through edit.
func editJSON(t testing.TB, path string, edit func(map[string]any)) {
	t.Helper()
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(readFile(t, path)))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	edit(m)
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, append(b, '\n'))
}

// sparse makes path a file of size bytes that starts with head and holds
// nothing else on disk.
func sparse(t testing.TB, path string, size int64, head []byte) {
	t.Helper()
	writeFile(t, path, head)
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
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
	editJSON(t, filepath.Join(dst, manifestName), func(m map[string]any) {
		files, ok := m["files"].(map[string]any)
		if !ok {
			t.Fatalf("%s: no files object", manifestName)
		}
		edit(files)
	})
}

// stTensor is one entry of a safetensors header.
type stTensor struct {
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// stFile is a safetensors file split into its header and data.
type stFile struct {
	tensors  map[string]stTensor
	metadata map[string]string
	data     []byte
}

func readST(t testing.TB, path string) *stFile {
	t.Helper()
	b := readFile(t, path)
	n := binary.LittleEndian.Uint64(b)
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &raw); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	f := &stFile{tensors: map[string]stTensor{}, data: b[8+n:]}
	for k, v := range raw {
		if k == "__metadata__" {
			if err := json.Unmarshal(v, &f.metadata); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var e stTensor
		if err := json.Unmarshal(v, &e); err != nil {
			t.Fatal(err)
		}
		f.tensors[k] = e
	}
	return f
}

// headerBytes is the file's header, padded to 8 bytes as writers do.
func (f *stFile) headerBytes(t testing.TB) []byte {
	t.Helper()
	h := map[string]any{}
	for k, v := range f.tensors {
		h[k] = v
	}
	if f.metadata != nil {
		h["__metadata__"] = f.metadata
	}
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	for len(b)%8 != 0 {
		b = append(b, ' ')
	}
	return b
}

func (f *stFile) write(t testing.TB, path string) {
	t.Helper()
	h := f.headerBytes(t)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(append(out, h...), f.data...)
	writeFile(t, path, out)
}

// rename renames tensor from to to in the file (and nowhere else).
func (f *stFile) rename(t testing.TB, from, to string) {
	t.Helper()
	e, ok := f.tensors[from]
	if !ok {
		t.Fatalf("no tensor %q", from)
	}
	delete(f.tensors, from)
	f.tensors[to] = e
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

// torchZip writes a PyTorch zip checkpoint the way torch.save lays it out:
// archive/data.pkl (here deflated, so a pickle of millions of opcodes is a
// small file), archive/data/<key> stored, archive/version, archive/byteorder.
// The pickle is streamed (writePickle) so that the test process itself never
// holds a hostile pickle in memory: its peak RSS bounds what the children's
// can be measured against (see startMoeprep).
func torchZip(t testing.TB, path string, writePickle func(w io.Writer) error, storages map[string][]byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bw := bufio.NewWriter(f)
	zw := zip.NewWriter(bw)
	add := func(name string, method uint16, write func(io.Writer) error) {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: "archive/" + name, Method: method})
		if err == nil {
			err = write(w)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	bytesOf := func(b []byte) func(io.Writer) error {
		return func(w io.Writer) error { _, err := w.Write(b); return err }
	}
	add("data.pkl", zip.Deflate, writePickle)
	add("byteorder", zip.Store, bytesOf([]byte("little")))
	for _, k := range slices.Sorted(maps.Keys(storages)) {
		add("data/"+k, zip.Store, bytesOf(storages[k]))
	}
	add("version", zip.Store, bytesOf([]byte("3\n")))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
}

// pickleParts streams the concatenation of parts; a part repeated n times
// is {s, n}.
type part struct {
	s string
	n int
}

func pickleParts(parts ...part) func(io.Writer) error {
	return func(w io.Writer) error {
		for _, p := range parts {
			chunk := strings.Repeat(p.s, max(1, min(p.n, (64<<10)/max(1, len(p.s)))))
			for left := p.n; left > 0; {
				k := min(left, len(chunk)/len(p.s))
				if _, err := io.WriteString(w, chunk[:k*len(p.s)]); err != nil {
					return err
				}
				left -= k
			}
		}
		return nil
	}
}

// Pickle protocol 2 builders, enough for a state dict of strided views.
const pickleProto2 = "\x80\x02"

func pkGlobal(module, name string) string { return "c" + module + "\n" + name + "\n" }

func pkStr(s string) string {
	return "X" + string(binary.LittleEndian.AppendUint32(nil, uint32(len(s)))) + s
}

// pkInt is BININT: a signed 32-bit integer.
func pkInt(n int32) string { return "J" + string(binary.LittleEndian.AppendUint32(nil, uint32(n))) }

func pkTuple(items ...string) string { return "(" + strings.Join(items, "") + "t" }

func pkInts(ns ...int32) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = pkInt(n)
	}
	return pkTuple(parts...)
}

// pkView is _rebuild_tensor_v2(storage key, offset, shape, stride) over a
// typed storage of numel elements.
func pkView(class, key string, numel int32, offset int32, shape, stride []int32) string {
	storage := pkTuple(pkStr("storage"), pkGlobal("torch", class), pkStr(key), pkStr("cpu"), pkInt(numel)) + "Q"
	hooks := pkGlobal("collections", "OrderedDict") + ")R"
	return pkGlobal("torch._utils", "_rebuild_tensor_v2") +
		pkTuple(storage, pkInt(offset), pkInts(shape...), pkInts(stride...), "\x89", hooks) + "R"
}

// pkDict is {k: v, ...} from alternating key and value pickles.
func pkDict(kv ...string) string { return "}(" + strings.Join(kv, "") + "u" }

func pickle(body string) []byte { return []byte(pickleProto2 + body + ".") }
