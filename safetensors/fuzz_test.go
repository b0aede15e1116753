package safetensors

import (
	"bytes"
	"encoding/binary"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// testdataFiles returns every file under testdata/broken and testdata/good,
// the fuzzers' seeds.
func testdataFiles(f *testing.F) map[string][]byte {
	out := map[string][]byte{}
	for _, root := range []string{"testdata/broken", "testdata/good"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			out[path] = b
			return err
		})
		if err != nil {
			f.Fatal(err)
		}
	}
	return out
}

// FuzzParseHeader: no header may panic the parser, and whatever it accepts
// must tile the data section exactly and survive a write/parse round trip.
func FuzzParseHeader(f *testing.F) {
	for _, b := range testdataFiles(f) {
		if len(b) >= 8 {
			if n := binary.LittleEndian.Uint64(b); n <= uint64(len(b)-8) {
				f.Add(b[8:8+n], int64(len(b)-8-int(n)))
				continue
			}
		}
		f.Add(b, int64(0))
	}
	f.Fuzz(func(t *testing.T, header []byte, dataLen int64) {
		meta, tensors, err := ParseHeader(header, dataLen)
		if err != nil {
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		end := int64(0)
		entries := make([]Entry, len(tensors))
		for i, ti := range tensors {
			need, err := byteSize(ti.DType, ti.Shape)
			if err != nil || ti.Begin != end || ti.NumBytes() != need {
				t.Fatalf("accepted tensor %+v after end %d (needs %d, %v)", ti, end, need, err)
			}
			end = ti.End
			entries[i] = Entry{Name: ti.Name, DType: ti.DType, Shape: ti.Shape}
		}
		if end != dataLen {
			t.Fatalf("accepted tensors ending at %d, data section %d", end, dataLen)
		}
		block, err := PlanHeader(meta, entries)
		if err != nil {
			t.Fatalf("accepted header cannot be rewritten: %v", err)
		}
		meta2, tensors2, err := ParseHeader(block[8:], dataLen)
		if err != nil {
			t.Fatalf("rewritten header refused: %v\n%q", err, block[8:])
		}
		if len(meta) == 0 && len(meta2) == 0 {
			meta, meta2 = nil, nil
		}
		if !reflect.DeepEqual(meta, meta2) || !reflect.DeepEqual(tensors, tensors2) {
			t.Fatalf("round trip changed the header:\n%v %+v\n%v %+v", meta, tensors, meta2, tensors2)
		}
	})
}

// FuzzOpen drives Open's logic over whole file bytes; accepted files must
// keep every tensor inside the file.
func FuzzOpen(f *testing.F) {
	for _, b := range testdataFiles(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := readFile(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		for _, ti := range file.Tensors {
			if ti.Begin < 0 || file.DataStart+ti.End > int64(len(data)) {
				t.Fatalf("tensor %+v outside the %d-byte file", ti, len(data))
			}
		}
	})
}

// FuzzParseIndex: no index may panic the reader; accepted names are plain.
func FuzzParseIndex(f *testing.F) {
	for path, b := range testdataFiles(f) {
		if filepath.Base(path) == IndexFileName {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"metadata":{"total_size":3},"weight_map":{"a":"m.safetensors"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		idx, err := parseIndex(data)
		if err != nil {
			return
		}
		for name, file := range idx.WeightMap {
			if filepath.Base(file) != file || strings.Contains(file, "..") || !strings.HasSuffix(file, ".safetensors") {
				t.Fatalf("tensor %q: accepted shard name %q", name, file)
			}
		}
	})
}
