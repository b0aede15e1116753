package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"github.com/moeprep/moeprep/internal/costtest"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// fuzzBudget is what one call may cost on an input of n bytes: allocation
// in proportion to the input (a tensor of the smallest header entry, 50
// bytes, costs about 200 bytes of structures) plus a fixed 64 KiB, and a
// second, far above the milliseconds these inputs take, so that only a
// blow-up fails.
func fuzzBudget(n int) (uint64, time.Duration) { return 64<<10 + 8*uint64(n), 5 * time.Second }

// checkCost fails t when a call cost more than fuzzBudget allows.
func checkCost(t *testing.T, n int, alloc uint64, took time.Duration) {
	t.Helper()
	maxAlloc, maxTime := fuzzBudget(n)
	if alloc > maxAlloc || took > maxTime {
		t.Fatalf("a %d-byte input cost %d bytes of allocation (budget %d) and %v (budget %v)", n, alloc, maxAlloc, took, maxTime)
	}
}

// isSyntaxError reports an error that says the JSON itself is broken.
func isSyntaxError(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "is not valid JSON") || strings.Contains(err.Error(), "JSON ends early") ||
		strings.Contains(err.Error(), "trailing data") || strings.Contains(err.Error(), "is empty, not a JSON object"))
}

// agreesOnJSON fails t unless the parser, which returned err for in (what),
// agrees with encoding/json on whether in is JSON at all.
func agreesOnJSON(t *testing.T, what string, in []byte, err error) {
	t.Helper()
	valid := utf8.Valid(in) && json.Valid(in)
	if !valid && err == nil {
		t.Fatalf("accepted %s encoding/json refuses: %q", what, in)
	}
	if valid && isSyntaxError(err) {
		t.Fatalf("called %s encoding/json accepts malformed: %v: %q", what, err, in)
	}
}

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
		var meta map[string]string
		var tensors []TensorInfo
		var err error
		alloc, took := costtest.Measure(func() { meta, tensors, err = ParseHeader(header, dataLen) })
		checkCost(t, len(header), alloc, took)
		// The hand-written scanner must agree with encoding/json on what
		// is JSON at all, and on every string it decodes.
		agreesOnJSON(t, "a header", header, err)
		if err != nil {
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(header, &raw); err != nil {
			t.Fatalf("encoding/json cannot read an accepted header: %v", err)
		}
		names := make([]string, 0, len(tensors))
		for _, ti := range tensors {
			names = append(names, ti.Name)
		}
		var wantMeta map[string]string
		if err := json.Unmarshal(raw[metadataKey], &wantMeta); raw[metadataKey] != nil && (err != nil || !maps.Equal(meta, wantMeta)) {
			t.Fatalf("metadata %v, encoding/json reads %v (%v)", meta, wantMeta, err)
		}
		delete(raw, metadataKey)
		if want := slices.Sorted(maps.Keys(raw)); !slices.Equal(slices.Sorted(slices.Values(names)), want) {
			t.Fatalf("tensor names %q, encoding/json reads %q", names, want)
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
		var file *File
		var err error
		alloc, took := costtest.Measure(func() { file, err = readFile(bytes.NewReader(data), int64(len(data))) })
		checkCost(t, len(data), alloc, took)
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
		var idx *Index
		var err error
		alloc, took := costtest.Measure(func() { idx, err = parseIndex(data) })
		checkCost(t, len(data), alloc, took)
		agreesOnJSON(t, "an index", data, err)
		if err != nil {
			return
		}
		var top map[string]json.RawMessage
		var wm map[string]string
		if err := json.Unmarshal(data, &top); err != nil {
			t.Fatalf("encoding/json cannot read an accepted index: %v", err)
		}
		if err := json.Unmarshal(top["weight_map"], &wm); err != nil || !maps.Equal(wm, idx.WeightMap) {
			t.Fatalf("weight_map %v, encoding/json reads %v (%v)", idx.WeightMap, wm, err)
		}
		for name, file := range idx.WeightMap {
			if filepath.Base(file) != file || strings.Contains(file, "..") || !strings.HasSuffix(file, ".safetensors") {
				t.Fatalf("tensor %q: accepted shard name %q", name, file)
			}
		}
	})
}
