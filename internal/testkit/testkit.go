// Package testkit holds the helpers that tests in several packages of
// moeprep would otherwise each write again: files written, read, copied,
// flipped and edited in place, JSON read and rewritten, safetensors headers
// read and written without moeprep's own reader, and the shape of a refusal
// (one line naming the file) and its cost. It imports only the standard
// library, so a package's own tests can import it without a cycle. Beside
// it, pickle writes torch.save archives by hand and cktest opens
// checkpoints through moeprep's reader. Only tests import them.
package testkit

import (
	"bufio"
	"encoding/binary"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// WriteFile writes data to path, making its directory first.
func WriteFile[T ~string | ~[]byte](t testing.TB, path string, data T) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Sparse makes path a file of size bytes that starts with head and holds
// nothing else on disk: the rest is a hole, however large.
func Sparse(t testing.TB, path string, size int64, head []byte) {
	t.Helper()
	WriteFile(t, path, head)
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

// WriteStream writes path, making its directory first, through write
// (buffered): for files too large to build in memory.
func WriteStream(t testing.TB, path string, write func(w io.Writer) error) {
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
	if err := write(bw); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// ReadFile is os.ReadFile that fails t.
func ReadFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Open opens path to read; it is closed when the test ends.
func Open(t testing.TB, path string) *os.File {
	t.Helper()
	return openFile(t, path, os.O_RDONLY)
}

// Create creates path, or empties it, to write; it is closed when the test
// ends.
func Create(t testing.TB, path string) *os.File {
	t.Helper()
	return openFile(t, path, os.O_RDWR|os.O_CREATE|os.O_TRUNC)
}

// openFile is os.OpenFile (mode 0o666 before the umask, as os.Create's)
// that fails t and closes the file when the test ends.
func openFile(t testing.TB, path string, flag int) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, flag, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// HubCache points HF_HUB_CACHE at an empty temporary folder for the test
// and returns it: a Hugging Face cache that holds only what the test puts
// in it (models--ORG--NAME/refs, snapshots).
func HubCache(t testing.TB) string {
	t.Helper()
	cache := t.TempDir()
	t.Setenv("HF_HUB_CACHE", cache)
	return cache
}

// FlipBits XORs mask into the byte at off of path (off < 0 counts from
// the end), in place: the file keeps its size.
func FlipBits(t testing.TB, path string, off int64, mask byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if off < 0 {
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		off += st.Size()
	}
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatalf("%s: byte %d: %v", path, off, err)
	}
	b[0] ^= mask
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// CopyFile copies the bytes of from to to, making to's directory. It
// streams: a copy costs no memory however large the file.
func CopyFile(t testing.TB, from, to string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(from, to); err != nil {
		t.Fatal(err)
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

// CopyDir copies the directory from to to: regular files by content,
// symbolic links as links.
func CopyDir(t testing.TB, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		dst := filepath.Join(to, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		case d.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, dst)
		}
		return copyFile(path, dst)
	})
	if err != nil {
		t.Fatalf("copying %s: %v", from, err)
	}
}

// ListDir is the names in dir, sorted.
func ListDir(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// KeepTimes runs change, which rewrites path, then gives path back the
// access and modification times it had, so that nothing that looks only
// at times sees the change. It returns what path was before.
func KeepTimes(t testing.TB, path string, change func()) os.FileInfo {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	atime := st.ModTime()
	if a, ok := accessTime(st); ok {
		atime = a
	}
	change()
	if err := os.Chtimes(path, atime, st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if st2, err := os.Stat(path); err != nil || !st2.ModTime().Equal(st.ModTime()) {
		t.Fatalf("%s: mtime not kept: %v", path, err)
	}
	return st
}

// U16LE is v in little-endian bytes.
func U16LE(v ...uint16) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], x)
	}
	return b
}

// F32LE is v as little-endian float32s.
func F32LE(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// WantErr checks err against a table case's want: "" wants no error (any
// fails t at once), anything else must be part of err's message. It
// reports whether want asked for an error: the case is done then.
func WantErr(t testing.TB, err error, want string) bool {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatal(err)
		}
		return false
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want one containing %q", err, want)
	}
	return true
}

// ErrorContains fails t, and goes on, unless err is an error whose message
// contains want; what names the call or the table case in the failure. It
// is WantErr's check for a loop over cases that reports every case that
// fails, not only the first. It reports whether err held want.
func ErrorContains(t testing.TB, err error, want, what string) bool {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: error %v, want one containing %q", what, err, want)
		return false
	}
	return true
}

// RefusalTime is what refusing one hostile input may take (the bound the
// red-team suite holds moeprep to). The real cost is milliseconds, so only
// a blow-up (a loop sized by a hostile number) fails it; it is loose so that a loaded CI machine cannot
// flake it: the allocation bounds are the tight ones.
const RefusalTime = 5 * time.Second

// HangTime is how long Within waits for a call before it calls it hung. A
// call that opens a device or a named pipe where it should refuse it
// blocks forever, so only that fails it; it is a minute so that a whole
// validate run on a loaded CI machine cannot flake it.
const HangTime = time.Minute

// Within runs call and returns what it returns, failing t at once when it
// has not returned within HangTime: a call that blocks on a device or a
// named pipe would otherwise hang the test instead of failing it. what
// names the call in the failure.
func Within[T any](t testing.TB, what string, call func() (T, error)) (T, error) {
	t.Helper()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := call()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-time.After(HangTime):
		t.Fatalf("%s did not return in %v: it opened something that blocks", what, HangTime)
		var zero T
		return zero, nil
	}
}

// CheckOneLine fails t unless err is a one-line error that starts with
// prefix (a file, usually) and ": ", and contains want.
func CheckOneLine(t testing.TB, err error, prefix, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted, want an error containing %q", want)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, prefix+": ") || !strings.Contains(msg, want) || strings.ContainsAny(msg, "\n\r") {
		t.Errorf("error %q, want one line starting %q and containing %q", msg, prefix+": ", want)
	}
}

// CheckCost fails t when a call (measured with costtest.Measure) allocated
// more than maxAlloc bytes or took longer than maxTook.
func CheckCost(t testing.TB, alloc, maxAlloc uint64, took, maxTook time.Duration) {
	t.Helper()
	t.Logf("cost: %.2f MB allocated (bound %.2f MB), %v", float64(alloc)/1e6, float64(maxAlloc)/1e6, took)
	if alloc > maxAlloc {
		t.Errorf("allocated %d bytes, want at most %d", alloc, maxAlloc)
	}
	if took > maxTook {
		t.Errorf("took %v, want at most %v", took, maxTook)
	}
}
