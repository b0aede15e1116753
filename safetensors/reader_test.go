package safetensors

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// randomBytes is deterministic non-zero-heavy test data.
func randomBytes(seed uint64, n int64) []byte {
	r := rand.New(rand.NewPCG(seed, 0x5afe))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.UintN(255) + 1)
	}
	return b
}

func readSection(t *testing.T, f *File, name string) []byte {
	t.Helper()
	b, err := f.ReadTensor(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readBack opens the safetensors file path (closed when the test ends) and
// checks that it holds meta and entries, in order (entry order is offset
// order), with the bytes each entry's Open gives.
func readBack(t *testing.T, path string, meta map[string]string, entries []Entry) *File {
	t.Helper()
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if !reflect.DeepEqual(f.Metadata, meta) {
		t.Errorf("metadata %v, want %v", f.Metadata, meta)
	}
	if len(f.Tensors) != len(entries) {
		t.Fatalf("%d tensors read, %d written", len(f.Tensors), len(entries))
	}
	for i, e := range entries {
		if ti := f.Tensors[i]; ti.Name != e.Name || ti.DType != e.DType || !reflect.DeepEqual(ti.Shape, e.Shape) {
			t.Errorf("tensor %d: %+v, want %s %s %v", i, ti, e.Name, e.DType, e.Shape)
		}
		r, err := e.Open()
		if err != nil {
			t.Fatal(err)
		}
		want, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := readSection(t, f, e.Name); !bytes.Equal(got, want) {
			t.Errorf("tensor %s: %d bytes read back differ from the %d written", e.Name, len(got), len(want))
		}
	}
	return f
}

// TestOpenHandWritten reads a file not written by our writer: header with
// leading whitespace and trailing padding, keys out of offset order, a
// zero-size tensor, metadata.
func TestOpenHandWritten(t *testing.T) {
	data := randomBytes(1, 12+8)
	header := " \n\t{\"b\":{\"shape\":[2,2],\"dtype\":\"F16\",\"data_offsets\":[12,20]}," +
		"\"__metadata__\":{\"format\":\"pt\",\"note\":\"caf\u00e9\"}," +
		"\"empty\":{\"dtype\":\"F32\",\"shape\":[0,7],\"data_offsets\":[12,12]}," +
		"\"a\":{\"dtype\":\"U8\",\"shape\":[3,4],\"data_offsets\":[0,12]}}   "
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := os.WriteFile(path, rawFile(header, data), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	wantMeta := map[string]string{"format": "pt", "note": "café"}
	if !reflect.DeepEqual(f.Metadata, wantMeta) {
		t.Errorf("metadata %v, want %v", f.Metadata, wantMeta)
	}
	wantTensors := []TensorInfo{
		{Name: "a", DType: U8, Shape: []int64{3, 4}, Begin: 0, End: 12},
		{Name: "empty", DType: F32, Shape: []int64{0, 7}, Begin: 12, End: 12},
		{Name: "b", DType: F16, Shape: []int64{2, 2}, Begin: 12, End: 20},
	}
	if !reflect.DeepEqual(f.Tensors, wantTensors) {
		t.Errorf("tensors %+v\nwant %+v", f.Tensors, wantTensors)
	}
	if want := int64(8 + len(header)); f.DataStart != want {
		t.Errorf("DataStart %d, want %d", f.DataStart, want)
	}
	for _, c := range []struct {
		name string
		want []byte
	}{{"a", data[:12]}, {"empty", []byte{}}, {"b", data[12:]}} {
		if got := readSection(t, f, c.name); !bytes.Equal(got, c.want) {
			t.Errorf("tensor %s: bytes %v, want %v", c.name, got, c.want)
		}
		ti, ok := f.Lookup(c.name)
		if !ok || ti.Name != c.name {
			t.Errorf("Lookup(%s) = %+v, %v", c.name, ti, ok)
		}
	}
	var b [4]byte
	if _, err := f.ReaderAt().ReadAt(b[:], f.DataStart+16); err != nil || !bytes.Equal(b[:], data[16:20]) {
		t.Errorf("ReaderAt read %v, %v; want %v", b, err, data[16:20])
	}
	if _, ok := f.Lookup("nope"); ok {
		t.Error("Lookup found a tensor that is not there")
	}
	if _, err := f.Section("nope"); err == nil || !strings.Contains(err.Error(), path+`: no tensor "nope"`) {
		t.Errorf("Section of a missing tensor: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := f.Section("a"); err == nil {
		t.Error("Section after Close succeeded")
	}
}

// TestOpenAccepts covers headers that are valid though unusual.
func TestOpenAccepts(t *testing.T) {
	for _, c := range []struct {
		name, header string
		dataLen      int
	}{
		{"empty object", `{}`, 0},
		{"null metadata", `{"__metadata__":null}`, 0},
		{"empty metadata", `{"__metadata__":{}}`, 0},
		{"scalar", `{"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}`, 8},
		{"only zero-size", `{"z":{"dtype":"BF16","shape":[0],"data_offsets":[0,0]}}`, 0},
		{"two zero-size", `{"z":{"dtype":"BF16","shape":[0],"data_offsets":[0,0]},"y":{"dtype":"BOOL","shape":[5,0],"data_offsets":[0,0]}}`, 0},
		{"escaped name", `{"a\"b\\c\u00e9":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}`, 1},
		{"whitespace inside", "{ \"a\" : { \"dtype\" : \"U16\" , \"shape\" : [ 1 ] , \"data_offsets\" : [ 0 , 2 ] } }\n", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := readFile(bytes.NewReader(rawFile(c.header, make([]byte, c.dataLen))), int64(8+len(c.header)+c.dataLen))
			if err != nil {
				t.Fatalf("refused %q: %v", c.header, err)
			}
			total := int64(0)
			for _, ti := range f.Tensors {
				total += ti.NumBytes()
			}
			if total != int64(c.dataLen) {
				t.Errorf("tensors hold %d bytes, want %d", total, c.dataLen)
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(filepath.Join(dir, "missing.safetensors")); err == nil || !strings.Contains(err.Error(), "missing.safetensors") {
		t.Errorf("missing file: %v", err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), dir+": a directory, not a regular file") {
		t.Errorf("directory: %v", err)
	}
}

// allDTypeEntries is one tensor of every dtype, with deterministic data.
func allDTypeEntries() []Entry {
	dts := []DType{BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64, F8E4M3, F8E5M2, F8E8M0}
	var entries []Entry
	for i, dt := range dts {
		shape := []int64{int64(i%3 + 1), int64(i + 2)}
		n := int64(dt.Size()) * shape[0] * shape[1]
		data := randomBytes(uint64(100+i), n)
		entries = append(entries, Entry{Name: "t." + strings.ToLower(string(dt)), DType: dt, Shape: shape,
			Open: func() (io.Reader, error) { return bytes.NewReader(data), nil }})
	}
	entries = append(entries, Entry{Name: "zero", DType: BF16, Shape: []int64{4, 0},
		Open: func() (io.Reader, error) { return bytes.NewReader(nil), nil }})
	return entries
}

// TestAllDTypesGolden pins the writer's exact bytes (testdata/good, rewritten
// with -update) and reads every dtype back.
func TestAllDTypesGolden(t *testing.T) {
	if len(dtypeSizes) != 16 {
		t.Fatalf("%d dtypes known, want 16", len(dtypeSizes))
	}
	golden := filepath.Join("testdata", "good", "all-dtypes.safetensors")
	meta := map[string]string{"format": "pt", "written_by": "moeprep test"}
	entries := allDTypeEntries()
	if *update {
		if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := WriteFile(context.Background(), golden, meta, entries, nil); err != nil {
			t.Fatal(err)
		}
	}
	fresh := filepath.Join(t.TempDir(), "all.safetensors")
	if _, err := WriteFile(context.Background(), fresh, meta, entries, nil); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(fresh); !bytes.Equal(got, want) {
		t.Errorf("writer output differs from %s (rerun with -update if the change is intended)", golden)
	}
	f := readBack(t, golden, meta, entries)
	seen := map[DType]bool{}
	for _, ti := range f.Tensors {
		seen[ti.DType] = true
	}
	if len(seen) != 16 {
		t.Errorf("golden file holds %d dtypes, want 16", len(seen))
	}
}
