package safetensors

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

func bytesEntry(name string, dt DType, shape []int64, data []byte) Entry {
	return Entry{Name: name, DType: dt, Shape: shape, Open: func() (io.Reader, error) { return bytes.NewReader(data), nil }}
}

// TestRoundTrip writes random tensors (one larger than the copy buffer, so
// chunking is exercised) and reads every byte back.
func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	dts := []DType{BF16, F32, F8E4M3, I64, F16, U8}
	var entries []Entry
	data := map[string][]byte{}
	for i := range 12 {
		dt := dts[r.IntN(len(dts))]
		shape := []int64{int64(r.IntN(5)), int64(r.IntN(40) + 1)}
		if i == 3 {
			shape = []int64{copyBufSize/2 + 3, 2} // > 1 MiB of BF16, not a multiple of the buffer
			dt = BF16
		}
		n, _ := byteSize(dt, shape)
		name := "model.layers." + string(rune('a'+i)) + ".weight"
		data[name] = randomBytes(uint64(i), n)
		entries = append(entries, bytesEntry(name, dt, shape, data[name]))
	}
	meta := map[string]string{"format": "pt", "z": "last", "a": "first"}
	path := filepath.Join(t.TempDir(), "rt.safetensors")
	var progressed int64
	res, err := WriteFile(context.Background(), path, meta, entries, func(n int64) { progressed += n })
	if err != nil {
		t.Fatal(err)
	}
	raw := testkit.ReadFile(t, path)
	sum := sha256.Sum256(raw)
	if res.Path != path || res.Size != int64(len(raw)) || res.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("result %+v; file is %d bytes, sha256 %x", res, len(raw), sum)
	}
	if _, err := os.Stat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s.tmp left behind: %v", path, err)
	}
	f := readBack(t, path, meta, entries)
	if progressed != int64(len(raw))-f.DataStart {
		t.Errorf("progress reported %d bytes, data section is %d", progressed, int64(len(raw))-f.DataStart)
	}
}

// TestPlanHeader checks padding, key order and that the header parses back.
func TestPlanHeader(t *testing.T) {
	for nameLen := range 10 {
		name := strings.Repeat("w", nameLen)
		entries := []Entry{
			{Name: "z" + name, DType: F32, Shape: []int64{2, 3}},
			{Name: "a" + name, DType: BF16, Shape: []int64{5}},
		}
		meta := map[string]string{"format": "pt"}
		block, err := PlanHeader(meta, entries)
		if err != nil {
			t.Fatal(err)
		}
		n := binary.LittleEndian.Uint64(block)
		js := block[8:]
		if uint64(len(js)) != n || n%8 != 0 {
			t.Errorf("name length %d: header length %d (field %d), want a multiple of 8", nameLen, len(js), n)
		}
		trimmed := bytes.TrimRight(js, " ")
		if !bytes.HasSuffix(trimmed, []byte("}")) || len(js)-len(trimmed) >= 8 {
			t.Errorf("header %q is not JSON padded with fewer than 8 spaces", js)
		}
		want := `{"__metadata__":{"format":"pt"},"z` + name + `":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"a` + name + `":{"dtype":"BF16","shape":[5],"data_offsets":[24,34]}}`
		if string(trimmed) != want {
			t.Errorf("header\n%s\nwant\n%s", trimmed, want)
		}
		gotMeta, tensors, err := ParseHeader(js, 34)
		if err != nil || !reflect.DeepEqual(gotMeta, meta) || len(tensors) != 2 || tensors[0].Name != "z"+name {
			t.Errorf("header does not parse back: %v %v %+v", err, gotMeta, tensors)
		}
	}
	block, err := PlanHeader(nil, nil)
	if err != nil || string(block[8:]) != "{}      " {
		t.Errorf("empty header %q, %v", block, err)
	}
	// Names with characters JSON must escape, and HTML characters kept as is.
	block, err = PlanHeader(nil, []Entry{{Name: "a\"<b>\\\n", DType: U8, Shape: []int64{1}}})
	if err != nil || !strings.Contains(string(block), `"a\"<b>\\\n":`) {
		t.Errorf("escaped name: %q, %v", block, err)
	}
}

func TestPlanHeaderRefuses(t *testing.T) {
	for _, c := range []struct {
		name    string
		meta    map[string]string
		entries []Entry
		want    string
	}{
		{"duplicate", nil, []Entry{{Name: "a", DType: U8}, {Name: "a", DType: U8}}, `tensor "a": written twice`},
		{"reserved", nil, []Entry{{Name: "__metadata__", DType: U8}}, `tensor "__metadata__": name is reserved`},
		{"dtype", nil, []Entry{{Name: "a", DType: "F4"}}, `tensor "a": unknown dtype "F4"`},
		{"negative", nil, []Entry{{Name: "a", DType: U8, Shape: []int64{3, -1}}}, `tensor "a": shape [3,-1] has a negative dimension`},
		{"overflow", nil, []Entry{{Name: "a", DType: F32, Shape: []int64{1 << 62}}}, `tensor "a": shape [4611686018427387904] F32 needs more bytes`},
		{"sum overflow", nil, []Entry{{Name: "a", DType: U8, Shape: []int64{1 << 62}}, {Name: "b", DType: U8, Shape: []int64{1 << 62}}}, `tensor "b": data section would exceed int64`},
		{"utf8 name", nil, []Entry{{Name: "a\xff", DType: U8}}, "name is not valid UTF-8"},
		{"utf8 meta", map[string]string{"k": "\xfe"}, nil, `__metadata__: key "k" or its value is not valid UTF-8`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := PlanHeader(c.meta, c.entries)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want %q", err, c.want)
			}
		})
	}
}

// TestPlanHeaderAt checks that the padded header puts the data section at the
// asked offset within a page, stays valid JSON that parses back to the same
// tensors, and refuses phases that would break 8-byte alignment.
func TestPlanHeaderAt(t *testing.T) {
	entries := []Entry{
		{Name: "w", DType: BF16, Shape: []int64{64, 32}},
		{Name: "norm", DType: F32, Shape: []int64{3}},
	}
	meta := map[string]string{"format": "pt"}
	plain, err := PlanHeader(meta, entries)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ phase, page int64 }{
		{0, 4096}, {8, 4096}, {2816, 4096}, {4088, 4096}, {int64(len(plain)), 4096}, {16, 64},
	} {
		block, err := PlanHeaderAt(meta, entries, c.phase, c.page)
		if err != nil {
			t.Fatalf("phase %d page %d: %v", c.phase, c.page, err)
		}
		if got := int64(len(block)) % c.page; got != c.phase {
			t.Errorf("phase %d page %d: data section starts at %d (phase %d)", c.phase, c.page, len(block), got)
		}
		if extra := int64(len(block) - len(plain)); extra < 0 || extra >= c.page {
			t.Errorf("phase %d page %d: %d bytes of padding, want fewer than a page", c.phase, c.page, extra)
		}
		js := block[8:]
		if n := binary.LittleEndian.Uint64(block); n != uint64(len(js)) || !bytes.HasPrefix(js, bytes.TrimRight(plain[8:], " ")) {
			t.Errorf("phase %d: length field %d for %d bytes, or the JSON changed", c.phase, n, len(js))
		}
		if _, tensors, err := ParseHeader(js, 64*32*2+12); err != nil || len(tensors) != 2 || tensors[1].Name != "norm" {
			t.Errorf("phase %d: padded header does not parse back: %v %+v", c.phase, err, tensors)
		}
	}
	for _, c := range []struct{ phase, page int64 }{{4, 4096}, {-8, 4096}, {4096, 4096}, {0, 0}, {0, 100}} {
		if _, err := PlanHeaderAt(meta, entries, c.phase, c.page); err == nil || !strings.Contains(err.Error(), "multiples of 8") {
			t.Errorf("phase %d page %d: error %v, want a refusal", c.phase, c.page, err)
		}
	}
}

// closeCounter records that WriteFile closed the source.
type closeCounter struct {
	io.Reader
	closed *int
}

func (c closeCounter) Close() error { *c.closed++; return nil }

// TestWriteFileRefusesBadSources: a source with the wrong byte count, a
// failing source, or a cancelled context leaves neither the file nor .tmp.
func TestWriteFileRefusesBadSources(t *testing.T) {
	good := bytesEntry("good", F32, []int64{4}, randomBytes(1, 16))
	ctx, cancel := context.WithCancel(context.Background())
	big := randomBytes(2, 3*copyBufSize)
	cancelling := Entry{Name: "big", DType: U8, Shape: []int64{3 * copyBufSize}, Open: func() (io.Reader, error) {
		return io.MultiReader(bytes.NewReader(big[:copyBufSize]), readerFunc(func(p []byte) (int, error) {
			cancel()
			return copy(p, big[copyBufSize:copyBufSize+10]), nil
		}), bytes.NewReader(big[copyBufSize+10:])), nil
	}}
	closed := 0
	for _, c := range []struct {
		name  string
		ctx   context.Context
		entry Entry
		want  string
	}{
		{"too few", context.Background(), bytesEntry("x.weight", BF16, []int64{3, 2}, make([]byte, 10)), `tensor "x.weight": source yielded 10 bytes, shape [3,2] BF16 needs 12`},
		{"too many", context.Background(), bytesEntry("x.weight", BF16, []int64{3, 2}, make([]byte, 13)), `tensor "x.weight": source yielded more than the 12 bytes shape [3,2] BF16 needs`},
		{"too many, closed", context.Background(), Entry{Name: "c", DType: U8, Shape: []int64{1}, Open: func() (io.Reader, error) {
			return closeCounter{bytes.NewReader([]byte{1, 2}), &closed}, nil
		}}, `tensor "c": source yielded more than`},
		{"open fails", context.Background(), Entry{Name: "o", DType: U8, Shape: []int64{1}, Open: func() (io.Reader, error) {
			return nil, errors.New("boom")
		}}, `tensor "o": opening source: boom`},
		{"read fails", context.Background(), Entry{Name: "r", DType: U8, Shape: []int64{4}, Open: func() (io.Reader, error) {
			return io.MultiReader(bytes.NewReader([]byte{1}), readerFunc(func([]byte) (int, error) { return 0, errors.New("bad sector") })), nil
		}}, `tensor "r": reading source: bad sector`},
		{"no Open", context.Background(), Entry{Name: "n", DType: U8, Shape: []int64{1}}, `tensor "n": entry has no Open function`},
		{"cancelled", ctx, cancelling, "context canceled"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.safetensors")
			_, err := WriteFile(c.ctx, path, nil, []Entry{good, c.entry}, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "bad.safetensors") {
				t.Errorf("error %v, want it to name the file and say %q", err, c.want)
			}
			for _, p := range []string{path, path + ".tmp"} {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left behind (%v)", p, err)
				}
			}
		})
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Error("the cancelling source never ran")
	}
	if closed != 1 {
		t.Errorf("source closed %d times, want 1", closed)
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestWriteFileReplacesStaleTmp: a .tmp left by a crash is truncated, not appended to.
func TestWriteFileReplacesStaleTmp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	testkit.WriteFile(t, path+".tmp", randomBytes(3, 4096))
	data := randomBytes(4, 6)
	if _, err := WriteFile(context.Background(), path, nil, []Entry{bytesEntry("a", I16, []int64{3}, data)}, nil); err != nil {
		t.Fatal(err)
	}
	readBack(t, path, nil, []Entry{bytesEntry("a", I16, []int64{3}, data)})
}

// TestDiskFull writes to /dev/full, which fails every write with ENOSPC.
func TestDiskFull(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full:", err)
	}
	defer full.Close()
	w := &hashingWriter{f: full, h: sha256.New()}
	err = w.write([]byte("x"))
	if err == nil || !strings.Contains(err.Error(), "disk full") || !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("error %v, want it to say the disk is full", err)
	}
}
