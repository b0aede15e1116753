package layout

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/moeprep/moeprep/internal/costtest"
	"github.com/moeprep/moeprep/internal/testkit"
)

// Hostile manifests and files (issue 26): each is refused with a one-line
// error naming the manifest (and the entry) or the file, in bounded memory
// and time. Large files are sparse (Truncate) and cost no disk.

// manifestOf is a manifest of the given entries (raw JSON by name).
func manifestOf(entries map[string]string) []byte {
	var parts []string
	for name, e := range entries {
		n, _ := json.Marshal(name)
		parts = append(parts, string(n)+":"+e)
	}
	return []byte(`{"version":1,"files":{` + strings.Join(parts, ",") + `}}`)
}

func TestReadManifestHostile(t *testing.T) {
	const entry = `{"size":5000000000,"xxh3_blocks":{"block_size":4194304,"root":"19e684b3f93a2318634c40d66e37f197"}}`
	var many strings.Builder
	many.WriteString(`{"version":1,"files":{`)
	for i := range maxManifestFiles + 1 {
		if i > 0 {
			many.WriteByte(',')
		}
		fmt.Fprintf(&many, `"model-%06d.safetensors":%s`, i, entry)
	}
	many.WriteString("}}")
	for _, c := range []struct {
		name  string
		write func(path string) error
		want  string
		// built bounds what is allocated past reading the file, which costs
		// up to 2.5 times its size (safeio.ReadFile's io.ReadAll doubles
		// its buffer). The red-team manifests cost 2 GB and 2.2 GB of RSS.
		built uint64
	}{
		{"sparse 4 GiB", func(p string) error { return os.Truncate(p, 4<<30) },
			"4294967296 bytes, over the 67108864-byte limit for " + ManifestFileName, 1 << 20},
		{"named pipe", func(p string) error {
			os.Remove(p)
			return syscall.Mkfifo(p, 0o644)
		}, "a named pipe (FIFO), not a regular file", 1 << 20},
		{"262145 entries", func(p string) error { return os.WriteFile(p, []byte(many.String()), 0o644) },
			"lists 262145 files, over the limit of 262144", 1 << 20},
		{"1-byte blocks", func(p string) error {
			return os.WriteFile(p, manifestOf(map[string]string{"model.safetensors": `{"size":500000000,"xxh3_blocks":{"block_size":1,"root":"00"}}`}), 0o644)
		}, "file model.safetensors: xxh3_blocks block size 1 is under the minimum of 512 bytes", 1 << 20},
		{"too many blocks", func(p string) error {
			return os.WriteFile(p, manifestOf(map[string]string{"a": `{"size":1099511627776,"blake3_blocks":{"block_size":4096,"root":"00"}}`}), 0o644)
		}, "file a: blake3_blocks: size 1099511627776 in 4096-byte blocks is 268435456 blocks, over the limit of 1048576", 1 << 20},
		{"duplicate entry", func(p string) error {
			return os.WriteFile(p, []byte(`{"version":1,"files":{"a":{"size":1,"sha256":"00"},"a":{"size":2,"sha256":"00"}}}`), 0o644)
		}, "file a is listed twice", 1 << 20},
		{"size a string", func(p string) error {
			return os.WriteFile(p, manifestOf(map[string]string{"a": `{"size":"1","sha256":"00"}`}), 0o644)
		}, "file a: size is string, want an integer", 1 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, ManifestFileName)
			os.WriteFile(path, nil, 0o644)
			if err := c.write(path); err != nil {
				t.Skip(err)
			}
			read := uint64(0)
			if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() && st.Size() <= maxManifestSize {
				read = uint64(st.Size()) * 5 / 2
			}
			var err error
			alloc, took := costtest.Measure(func() { _, err = ReadManifest(dir) })
			testkit.CheckOneLine(t, err, path, c.want)
			testkit.CheckCost(t, alloc, read+c.built, took, testkit.RefusalTime)
		})
	}
}

// TestReadManifestRefusesBadNames: every entry must be a plain, clean
// relative path inside the directory.
func TestReadManifestRefusesBadNames(t *testing.T) {
	for _, c := range []struct{ name, want string }{
		{"/etc/passwd", "an absolute path"},
		{"../secret", `a ".." path element`},
		{"a/../../b", `a ".." path element`},
		{"..", `a ".." path element`},
		{"a//b", "an empty path element"},
		{"a/", "an empty path element"},
		{"./a", `a "." path element`},
		{"a/./b", `a "." path element`},
		{".", `a "." path element`},
		{"", "empty name"},
		{`a\b`, "holds a backslash"},
		{`..\..\x`, "holds a backslash"},
		{"a\x00b", "holds a control character"},
		{"a\nb", "holds a control character"},
		{"a\x1b[2Jb", "holds a control character"},
		{"a\u0085b", "holds a control character"},
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, ManifestFileName)
		os.WriteFile(path, manifestOf(map[string]string{c.name: `{"size":1,"sha256":"00"}`}), 0o644)
		_, err := ReadManifest(dir)
		testkit.CheckOneLine(t, err, path, fmt.Sprintf("file %q: %s", c.name, c.want))
	}
	// Names moeprep writes pass.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ManifestFileName), manifestOf(map[string]string{
		"config.json": `{"size":1,"sha256":"00"}`, "model-00001-of-00002.safetensors": `{"size":1,"xxh3_blocks":{"block_size":4194304,"root":"00"}}`,
		"original/tokenizer.model": `{"size":1,"sha256":"00"}`, ".gitattributes": `{"size":1,"sha256":"00"}`, "a..b": `{"size":1,"sha256":"00"}`,
	}), 0o644)
	if _, err := ReadManifest(dir); err != nil {
		t.Errorf("plain names refused: %v", err)
	}
}

// TestHashFileRefusesDevices: a manifest entry that is /dev/zero (through a
// link) used to hash forever; it is refused at once.
func TestHashFileRefusesDevices(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "model.safetensors")
	if err := os.Symlink("/dev/zero", link); err != nil {
		t.Skip(err)
	}
	for _, like := range []FileInfo{{Size: 1, SHA256: "00"}, {Size: 1, X3Blocks: BlockDigest{BlockSize: ShardBlockSize, Root: "00"}}} {
		_, err := testkit.Within(t, fmt.Sprintf("%v: hashing /dev/zero", like), func() (FileInfo, error) { return HashFileLike(link, like) })
		testkit.CheckOneLine(t, err, link, "a character device, not a regular file")
		m := &Manifest{Version: ContractVersion, Files: map[string]FileInfo{"model.safetensors": like}}
		testkit.CheckOneLine(t, m.Verify(dir), link, "a character device, not a regular file")
	}
}

// TestHashBounded: hashing in small blocks holds a window of digests, not
// one per block, and a file of more blocks than MaxBlocksPerFile is refused
// before it is read.
func TestHashBounded(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sparse")
	// 256 MiB in 4 KiB blocks: 65,536 digests, 2 MiB if all were held.
	testkit.Sparse(t, path, 256<<20, nil)
	like := FileInfo{X3Blocks: BlockDigest{BlockSize: 4096}}
	var got FileInfo
	var err error
	alloc, took := costtest.Measure(func() { got, err = HashFileLike(path, like) })
	if err != nil {
		t.Fatal(err)
	}
	if alloc > 512<<10 || took > 5*testkit.RefusalTime {
		t.Errorf("hashing 65,536 blocks allocated %d bytes (want at most %d) in %v", alloc, 512<<10, took)
	}
	h := NewHasher(like)
	zero := make([]byte, 1<<20)
	alloc, _ = costtest.Measure(func() {
		for range 256 {
			h.Write(zero)
		}
	})
	if s := h.Sum(); s != got {
		t.Errorf("Hasher %v, HashFileLike %v", s, got)
	}
	if alloc > 64<<10 {
		t.Errorf("streaming 65,536 blocks through a Hasher allocated %d bytes, want at most %d", alloc, 64<<10)
	}
	// 4 GiB in 512-byte blocks: 8 Mi blocks.
	if err := os.Truncate(path, 4<<30); err != nil {
		t.Fatal(err)
	}
	alloc, took = costtest.Measure(func() { _, err = HashFileLike(path, FileInfo{Blocks: BlockDigest{BlockSize: 512}}) })
	testkit.CheckOneLine(t, err, path, "4294967296 bytes in 512-byte blocks is 8388608 blocks, over the limit of 1048576")
	testkit.CheckCost(t, alloc, 64<<10, took, testkit.RefusalTime)
}

// TestVerifySizeFirst: a file whose size differs from the manifest's is
// reported without being read, however large (sparse) it is.
func TestVerifySizeFirst(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	testkit.WriteFile(t, path, "")
	if err := os.Truncate(path, 64<<30); err != nil {
		t.Skip(err)
	}
	m := &Manifest{Version: ContractVersion, Files: map[string]FileInfo{"model.safetensors": {Size: 5, X3Blocks: BlockDigest{BlockSize: ShardBlockSize, Root: "00"}}}}
	var err error
	alloc, took := costtest.Measure(func() { err = m.Verify(dir) })
	testkit.CheckOneLine(t, err, path, "size 68719476736, manifest says size 5")
	testkit.CheckCost(t, alloc, 64<<10, took, testkit.RefusalTime)
}
