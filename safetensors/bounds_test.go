package safetensors

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moeprep/moeprep/internal/costtest"
	"github.com/moeprep/moeprep/internal/testkit"
)

// The hostile inputs of issue 26: each must be refused with a one-line error
// naming the file, in bounded memory and time, whatever it claims to hold.
// The files are made at test time; the large ones are sparse (Truncate) or
// a few tens of MB of JSON that is removed with the test's directory.

// writeHeaderFile writes a safetensors file of header and dataLen zero
// bytes of data (sparse: the data costs no disk).
func writeHeaderFile(t *testing.T, path string, header []byte, dataLen int64) {
	t.Helper()
	head := append(binary.LittleEndian.AppendUint64(nil, uint64(len(header))), header...)
	testkit.Sparse(t, path, int64(len(head))+dataLen, head)
}

// zeroTensorsHeader is a header of n empty U8 tensors named by hex number.
func zeroTensorsHeader(n int) []byte {
	b := make([]byte, 0, n*48+2)
	b = append(b, '{')
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = strconv.AppendInt(b, int64(i), 16)
		b = append(b, `":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}`...)
	}
	return append(b, '}')
}

// checkBounded asserts a refusal: err one line, naming path, containing
// want, and what it cost within maxAlloc bytes and testkit.RefusalTime.
func checkBounded(t *testing.T, err error, path, want string, alloc, maxAlloc uint64, took time.Duration) {
	t.Helper()
	testkit.CheckOneLine(t, err, path, want)
	testkit.CheckCost(t, alloc, maxAlloc, took, testkit.RefusalTime)
}

func TestOpenHostileFiles(t *testing.T) {
	dir := t.TempDir()
	million := zeroTensorsHeader(1_000_000)
	overLimit := zeroTensorsHeader(MaxTensorsPerFile + 1)
	shape17 := `{"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}}`
	manyMeta := make([]string, maxMetadataEntries+1)
	for i := range manyMeta {
		manyMeta[i] = fmt.Sprintf(`"k%d":""`, i)
	}
	for _, c := range []struct {
		name string
		make func(path string)
		want string
		// maxAlloc: the red-team case cost 3.1 GB; what is left is the
		// header itself, read whole (MaxHeaderSize at most), plus a little.
		maxAlloc uint64
	}{
		{"1,000,000 zero-size tensors (60 MB header)", func(p string) { writeHeaderFile(t, p, million, 0) },
			"header lists 1000000 tensors, over the limit of 262144 for one file", uint64(len(million)) + 1<<20},
		{"MaxTensorsPerFile+1 tensors", func(p string) { writeHeaderFile(t, p, overLimit, 0) },
			"header lists 262145 tensors, over the limit of 262144", uint64(len(overLimit)) + 1<<20},
		{"sparse 100 MB header of zeros", func(p string) {
			testkit.Sparse(t, p, 8+MaxHeaderSize+1<<30, binary.LittleEndian.AppendUint64(nil, MaxHeaderSize))
		}, `header is not valid JSON: unexpected '\x00' at byte 0`, 1 << 20},
		{"sparse 100 MB header opening with '{'", func(p string) {
			testkit.Sparse(t, p, 8+MaxHeaderSize, append(binary.LittleEndian.AppendUint64(nil, MaxHeaderSize), '{'))
		}, `header is not valid JSON: unexpected '\x00' at byte 1`, MaxHeaderSize + 1<<20},
		{"shape of 17 dimensions", func(p string) { writeHeaderFile(t, p, []byte(shape17), 1) },
			`tensor "a": shape has 17 dimensions, over the limit of 16`, 1 << 20},
		{"shape of a million dimensions", func(p string) {
			writeHeaderFile(t, p, []byte(`{"a":{"dtype":"U8","shape":[`+strings.Repeat("1,", 1_000_000)+`1],"data_offsets":[0,1]}}`), 1)
		}, `tensor "a": shape has 1000001 dimensions, over the limit of 16`, 2<<20 + 1<<20},
		{"metadata of 1025 keys", func(p string) { writeHeaderFile(t, p, []byte(`{"__metadata__":{`+strings.Join(manyMeta, ",")+`}}`), 0) },
			"__metadata__ has more than 1024 keys", 1 << 20},
		{"metadata over 1 MiB", func(p string) {
			writeHeaderFile(t, p, []byte(`{"__metadata__":{"k":"`+strings.Repeat("x", maxMetadataBytes)+`"}}`), 0)
		}, "__metadata__ holds more than 1048576 bytes", 3 << 20},
		{"nested a million deep", func(p string) {
			writeHeaderFile(t, p, []byte(`{"__metadata__":`+strings.Repeat("[", 1_000_000)), 0)
		}, "header nests values more than 1000 deep", 2 << 20},
		{"named pipe", func(p string) {
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Skip("no named pipes here:", err)
			}
		}, "a named pipe (FIFO), not a regular file", 1 << 20},
		{"link to dev-zero", func(p string) {
			if err := os.Symlink("/dev/zero", p); err != nil {
				t.Skip(err)
			}
		}, "a character device, not a regular file", 1 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.NewReplacer(" ", "-", ",", "", "'", "").Replace(c.name)+".safetensors")
			c.make(path)
			var f *File
			var err error
			alloc, took := costtest.Measure(func() { f, err = Open(path) })
			if f != nil {
				f.Close()
			}
			checkBounded(t, err, path, c.want, alloc, c.maxAlloc, took)
		})
	}
}

// TestOpenMaximalHeader measures a header at the limit, which is accepted:
// what it costs is what any file can make the reader spend. Before the
// hand-written scanner, parsing these 262,144 tensors took 1.1 s and 393 MB
// of allocation; now about 0.15 s and 37 MB past the header itself.
func TestOpenMaximalHeader(t *testing.T) {
	path := filepath.Join(t.TempDir(), "max.safetensors")
	header := zeroTensorsHeader(MaxTensorsPerFile)
	writeHeaderFile(t, path, header, 0)
	var f *File
	var err error
	alloc, took := costtest.Measure(func() { f, err = Open(path) })
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Tensors) != MaxTensorsPerFile {
		t.Fatalf("%d tensors, want %d", len(f.Tensors), MaxTensorsPerFile)
	}
	// The header, then about 200 bytes a tensor: the TensorInfo (72), its
	// name and shape, and the by-name map.
	if limit := uint64(len(header)) + 256*MaxTensorsPerFile; alloc > limit {
		t.Errorf("a maximal header allocated %d bytes, want at most %d", alloc, limit)
	}
	if took > 2*testkit.RefusalTime {
		t.Errorf("a maximal header took %v, want at most %v", took, 2*testkit.RefusalTime)
	}
	t.Logf("%d tensors, %d-byte header: %v, %.1f MB allocated", len(f.Tensors), len(header), took, float64(alloc)/1e6)
}

// TestWriterRefusesWhatReaderRefuses: a file the reader would refuse is
// never written.
func TestWriterRefusesWhatReaderRefuses(t *testing.T) {
	many := make([]Entry, MaxTensorsPerFile+1)
	for i := range many {
		many[i] = Entry{Name: strconv.Itoa(i), DType: U8, Shape: []int64{0}}
	}
	meta := map[string]string{}
	for i := range maxMetadataEntries + 1 {
		meta[strconv.Itoa(i)] = ""
	}
	for _, c := range []struct {
		name    string
		meta    map[string]string
		entries []Entry
		want    string
	}{
		{"too many tensors", nil, many, "262145 tensors in one file, over the limit of 262144"},
		{"rank 17", nil, []Entry{{Name: "a", DType: U8, Shape: make([]int64, 17)}}, `tensor "a": shape has 17 dimensions`},
		{"metadata keys", meta, nil, "__metadata__ has 1025 keys"},
		{"metadata bytes", map[string]string{"k": strings.Repeat("x", maxMetadataBytes)}, nil, "__metadata__ holds 1048577 bytes"},
	} {
		if _, err := PlanHeader(c.meta, c.entries); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// weightMapJSON is an index of n tensors over the given number of shards.
func weightMapJSON(n, shards int) []byte {
	b := []byte(`{"metadata":{"total_size":0},"weight_map":{`)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = strconv.AppendInt(b, int64(i), 36)
		b = fmt.Appendf(b, `":"s%d.safetensors"`, i%shards)
	}
	return append(b, "}}"...)
}

func TestReadHostileIndex(t *testing.T) {
	dir := t.TempDir()
	overTensors := weightMapJSON(MaxIndexTensors+1, 1)
	overShards := weightMapJSON(maxShards+1, maxShards+1)
	keys := make([]string, maxIndexKeys+1)
	for i := range keys {
		keys[i] = fmt.Sprintf(`"k%d":0`, i)
	}
	for _, c := range []struct {
		name string
		make func(path string)
		want string
		// built bounds what is allocated past reading the file, which
		// costs up to 2.5 times its size (safeio.ReadFile's io.ReadAll
		// doubles its buffer): the red-team index cost 2.1 GB of RSS.
		built uint64
	}{
		{"sparse 1 GiB", func(p string) { testkit.Sparse(t, p, 1<<30, nil) },
			"1073741824 bytes, over the 67108864-byte limit for " + IndexFileName, 1 << 20},
		{"named pipe", func(p string) {
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Skip("no named pipes here:", err)
			}
		}, "a named pipe (FIFO), not a regular file", 1 << 20},
		{"MaxIndexTensors+1 tensors", func(p string) { os.WriteFile(p, overTensors, 0o644) },
			"weight_map lists 1048577 tensors, over the limit of 1048576", 1 << 20},
		{"maxShards+1 shards", func(p string) { os.WriteFile(p, overShards, 0o644) },
			"weight_map names more than 16384 shard files", 8 << 20},
		{"1025 top-level keys", func(p string) { os.WriteFile(p, []byte("{"+strings.Join(keys, ",")+"}"), 0o644) },
			"index has 1025 top-level keys, over the limit of 1024", 1 << 20},
		{"metadata over 1 MiB", func(p string) {
			os.WriteFile(p, []byte(`{"metadata":{"k":"`+strings.Repeat("x", maxIndexMetadata)+`"},"weight_map":{"a":"a.safetensors"}}`), 0o644)
		}, "metadata is 1048584 bytes, over the limit of 1048576", 1 << 20},
		{"nested a million deep", func(p string) {
			os.WriteFile(p, []byte(`{"x":`+strings.Repeat("[", 1_000_000)), 0o644)
		}, "index nests values more than 1000 deep", 1 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			sub := filepath.Join(dir, strings.NewReplacer(" ", "-", "+", "").Replace(c.name))
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(sub, IndexFileName)
			c.make(path)
			read := uint64(0)
			if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() && st.Size() <= maxIndexSize {
				read = uint64(st.Size()) * 5 / 2
			}
			var s *Sharded
			var err error
			alloc, took := costtest.Measure(func() { s, err = OpenSharded(sub) })
			if s != nil {
				s.Close()
			}
			checkBounded(t, err, path, c.want, alloc, read+c.built, took)
		})
	}
}

// TestOpenShardedRefusesPipeShard: a shard that is a named pipe is refused
// at once instead of blocking the open forever.
func TestOpenShardedRefusesPipeShard(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, IndexFileName), []byte(`{"weight_map":{"a":"s.safetensors"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	shard := filepath.Join(dir, "s.safetensors")
	if err := syscall.Mkfifo(shard, 0o644); err != nil {
		t.Skip("no named pipes here:", err)
	}
	s, err := testkit.Within(t, "OpenSharded on a named pipe", func() (*Sharded, error) { return OpenSharded(dir) })
	if s != nil {
		s.Close()
	}
	checkBounded(t, err, shard, "a named pipe (FIFO), not a regular file", 0, 0, 0)
}

// TestOpenShardedChecksShardsAsOpened: a shard holding tensors the index
// does not list is refused before the next shard is opened, so the shards
// cannot make the reader hold more than the index's bounds allow.
func TestOpenShardedChecksShardsAsOpened(t *testing.T) {
	dir := t.TempDir()
	const s1, s2 = "s1.safetensors", "s2.safetensors"
	if err := os.WriteFile(filepath.Join(dir, IndexFileName), []byte(`{"weight_map":{"0":"`+s1+`","x":"`+s2+`"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	writeHeaderFile(t, filepath.Join(dir, s1), zeroTensorsHeader(1000), 0)
	// s2 is a named pipe, which Open refuses: an error about it would mean
	// s2 was opened before s1's tensors were checked.
	if err := syscall.Mkfifo(filepath.Join(dir, s2), 0o644); err != nil {
		t.Skip("no named pipes here:", err)
	}
	_, err := OpenSharded(dir)
	testkit.CheckOneLine(t, err, filepath.Join(dir, s1), `tensor "1" is missing from the weight_map of `+IndexFileName)
}
