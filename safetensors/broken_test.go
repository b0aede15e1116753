package safetensors

import (
	"encoding/binary"
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

var update = flag.Bool("update", false, "rewrite the files under testdata/")

// rawFile builds a safetensors file by hand: the 8-byte length of header,
// header, then data. Broken files need exactly the bytes a writer would refuse.
func rawFile(header string, data []byte) []byte {
	return rawFileLen(uint64(len(header)), header, data)
}

// rawFileLen is rawFile with a length field that may lie.
func rawFileLen(n uint64, header string, data []byte) []byte {
	out := binary.LittleEndian.AppendUint64(nil, n)
	out = append(out, header...)
	return append(out, data...)
}

// brokenFile is one deliberately broken single file and the error it must give.
type brokenFile struct {
	name  string
	bytes []byte
	want  string
}

func brokenFiles() []brokenFile {
	z := func(n int) []byte { return make([]byte, n) }
	const a = `"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`
	return []brokenFile{
		{"empty.safetensors", nil, "file is 0 bytes, shorter than the 8-byte header length"},
		{"shorter-than-8.safetensors", []byte{2, 0, 0, 0, 0}, "file is 5 bytes, shorter than the 8-byte header length"},
		{"header-too-long.safetensors", rawFileLen(MaxHeaderSize+1, "{}", nil), "header length 100000001 is over the 100000000-byte limit"},
		{"header-beyond-file.safetensors", rawFileLen(4096, "{}", z(8)), "header length 4096 runs past the end of the 18-byte file"},
		{"header-empty.safetensors", rawFile("", nil), "header is empty, not a JSON object"},
		{"not-utf8.safetensors", rawFile("{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", nil), "header is not valid UTF-8"},
		{"not-object.safetensors", rawFile(`[1,2]   `, nil), "header is an array, not a JSON object"},
		{"not-json.safetensors", rawFile(`{"a":{"dtype" "F32"}}`, nil), "header is not valid JSON"},
		{"json-ends-early.safetensors", rawFile(`{"a":{"dtype":"F32"`, nil), "header JSON ends early"},
		{"trailing-json.safetensors", rawFile(`{}{}`, nil), "trailing data after the JSON object"},
		{"duplicate-key.safetensors", rawFile(`{`+a+`,`+a+`}`, z(8)), `duplicate key "a" in header`},
		{"duplicate-field.safetensors", rawFile(`{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, z(8)), `tensor "a": duplicate field "dtype"`},
		{"duplicate-metadata-key.safetensors", rawFile(`{"__metadata__":{"k":"1","k":"2"},`+a+`}`, z(8)), `__metadata__: duplicate key "k"`},
		{"bad-metadata-value.safetensors", rawFile(`{"__metadata__":{"format":1},`+a+`}`, z(8)), `__metadata__: value of "format" is a number, not a string`},
		{"bad-metadata-type.safetensors", rawFile(`{"__metadata__":["pt"],`+a+`}`, z(8)), `__metadata__ is an array, not an object of strings`},
		{"entry-not-object.safetensors", rawFile(`{"a":[0,8]}`, z(8)), `tensor "a": entry is an array, not a JSON object`},
		{"unknown-dtype.safetensors", rawFile(`{"a":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}}`, z(8)), `tensor "a": unknown dtype "F128"`},
		{"lowercase-dtype.safetensors", rawFile(`{"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}`, z(8)), `tensor "a": unknown dtype "f32"`},
		{"unknown-field.safetensors", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"foo":1}}`, z(8)), `tensor "a": unknown field "foo"`},
		{"missing-field.safetensors", rawFile(`{"a":{"dtype":"F32","data_offsets":[0,8]}}`, z(8)), `tensor "a": missing field "shape"`},
		{"negative-shape.safetensors", rawFile(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, z(8)), `tensor "a": shape: -2 is not a non-negative integer`},
		{"fractional-shape.safetensors", rawFile(`{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}`, z(8)), `tensor "a": shape: 2.0 is not a non-negative integer`},
		{"shape-not-array.safetensors", rawFile(`{"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}}`, z(8)), `tensor "a": shape is a number, not an array of integers`},
		{"shape-huge-dim.safetensors", rawFile(`{"a":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,8]}}`, z(8)), `tensor "a": shape: 9223372036854775808 is too large`},
		{"shape-overflow.safetensors", rawFile(`{"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, z(8)), `tensor "a": shape [4294967296,4294967296] has more elements than fit in int64`},
		{"bytes-overflow.safetensors", rawFile(`{"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]}}`, z(8)), `tensor "a": shape [2305843009213693952] F64 needs more bytes than fit in int64`},
		{"offsets-three.safetensors", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}`, z(8)), `tensor "a": data_offsets has 3 numbers, want [begin,end]`},
		{"begin-after-end.safetensors", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}`, z(8)), `tensor "a": data_offsets [8,0] begin after end`},
		{"wrong-byte-count.safetensors", rawFile(`{"x.weight":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,10]}}`, z(10)), `tensor "x.weight": data_offsets [0,10] hold 10 bytes, shape [3,2] BF16 needs 12`},
		{"hole-at-start.safetensors", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, z(12)), `tensor "a": data_offsets [4,12] leave a hole: the data section starts at 0`},
		{"hole.safetensors", rawFile(`{`+a+`,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}`, z(16)), `tensor "b": data_offsets [12,16] leave a hole after tensor "a", which ends at 8`},
		{"overlap.safetensors", rawFile(`{`+a+`,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, z(12)), `tensor "b": data_offsets [4,12] overlap tensor "a", which ends at 8`},
		{"same-offsets.safetensors", rawFile(`{`+a+`,"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, z(8)), `data_offsets [0,8] overlap tensor`},
		{"trailing-bytes.safetensors", rawFile(`{`+a+`}`, z(9)), "1 trailing bytes after the last tensor (tensors end at 8, data section is 9 bytes)"},
		{"trailing-bytes-no-tensors.safetensors", rawFile(`{}`, z(3)), "3 trailing bytes after the last tensor"},
		{"truncated.safetensors", rawFile(`{`+a+`}`, z(5)), `tensor "a": data_offsets end at 8 but the data section has only 5 bytes (file truncated?)`},
	}
}

// brokenDir is one deliberately broken sharded checkpoint.
type brokenDir struct {
	name  string
	files map[string][]byte
	want  string
	names string // the file the error must name
}

func brokenDirs() []brokenDir {
	shard := func(names ...string) []byte {
		h := "{"
		for i, n := range names {
			if i > 0 {
				h += ","
			}
			h += `"` + n + `":{"dtype":"U8","shape":[1],"data_offsets":[` + string(rune('0'+i)) + `,` + string(rune('1'+i)) + `]}`
		}
		return rawFile(h+"}", make([]byte, len(names)))
	}
	const s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
	index := func(weightMap string) []byte {
		return []byte(`{"metadata":{"total_size":2},"weight_map":{` + weightMap + `}}`)
	}
	return []brokenDir{
		{"index-missing-shard", map[string][]byte{
			IndexFileName: index(`"a":"` + s1 + `","b":"` + s2 + `"`), s1: shard("a"),
		}, "shard " + s2 + " named in the weight_map is missing", IndexFileName},
		{"index-tensor-not-in-shard", map[string][]byte{
			IndexFileName: index(`"a":"` + s1 + `","b":"` + s1 + `"`), s1: shard("a"),
		}, `tensor "b" is in the weight_map of ` + IndexFileName + ` but not in the shard`, s1},
		{"index-shard-tensor-unmapped", map[string][]byte{
			IndexFileName: index(`"a":"` + s1 + `","b":"` + s2 + `"`), s1: shard("a", "c"), s2: shard("b"),
		}, `tensor "c" is missing from the weight_map of ` + IndexFileName, s1},
		{"index-shard-tensor-wrong-shard", map[string][]byte{
			IndexFileName: index(`"a":"` + s1 + `","b":"` + s2 + `"`), s1: shard("a", "b"), s2: shard("b"),
		}, `tensor "b" is mapped to ` + s2 + ` in ` + IndexFileName, s1},
		{"index-broken-shard", map[string][]byte{
			IndexFileName: index(`"a":"` + s1 + `"`), s1: rawFile(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, nil),
		}, "file truncated", s1},
		{"index-path-traversal", map[string][]byte{
			IndexFileName: index(`"a":"../` + s1 + `"`),
		}, `weight_map: tensor "a": shard name "../` + s1 + `" is not a plain file name`, IndexFileName},
		{"index-not-safetensors", map[string][]byte{
			IndexFileName: index(`"a":"pytorch_model.bin"`),
		}, `shard name "pytorch_model.bin" does not end in .safetensors`, IndexFileName},
		{"index-duplicate-tensor", map[string][]byte{
			IndexFileName: index(`"a":"` + s1 + `","a":"` + s2 + `"`), s1: shard("a"),
		}, `weight_map: tensor "a" listed twice`, IndexFileName},
		{"index-no-weight-map", map[string][]byte{
			IndexFileName: []byte(`{"metadata":{}}`),
		}, "index has no weight_map", IndexFileName},
		{"index-not-object", map[string][]byte{
			IndexFileName: []byte(`["a"]`),
		}, "index is an array, not a JSON object", IndexFileName},
		{"index-bad-file-type", map[string][]byte{
			IndexFileName: index(`"a":1`),
		}, `weight_map: tensor "a" maps to a number, not a file name`, IndexFileName},
	}
}

// TestBroken checks every file under testdata/broken is refused with its own
// error, on one line, naming the file. With -update the files are rewritten.
func TestBroken(t *testing.T) {
	root := filepath.Join("testdata", "broken")
	if *update {
		writeBrokenTestdata(t, root)
	}
	covered := map[string]bool{}
	// refused checks that open refuses path, naming named.
	refused := func(name, path, named, want string, open func(string) (io.Closer, error)) {
		t.Run(name, func(t *testing.T) {
			covered[name] = true
			f, err := open(path)
			if err == nil {
				f.Close()
				t.Fatalf("%s accepted as a checkpoint", path)
			}
			testkit.CheckOneLine(t, err, named, want)
		})
	}
	for _, c := range brokenFiles() {
		path := filepath.Join(root, c.name)
		refused(c.name, path, path, c.want, func(p string) (io.Closer, error) { return Open(p) })
	}
	for _, c := range brokenDirs() {
		dir := filepath.Join(root, c.name)
		refused(c.name, dir, filepath.Join(dir, c.names), c.want, func(p string) (io.Closer, error) { return OpenSharded(p) })
	}
	// Every committed file is in the table, so none sits there untested.
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !covered[e.Name()] {
			t.Errorf("%s has no test case (stale file? rerun with -update)", filepath.Join(root, e.Name()))
		}
	}
}

func writeBrokenTestdata(t *testing.T, root string) {
	t.Helper()
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range brokenFiles() {
		testkit.WriteFile(t, filepath.Join(root, c.name), c.bytes)
	}
	for _, c := range brokenDirs() {
		dir := filepath.Join(root, c.name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, data := range c.files {
			testkit.WriteFile(t, filepath.Join(dir, name), data)
		}
	}
}
