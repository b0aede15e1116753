package torchbin

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
)

// naiveGather is the definition the strided reader must match: element by
// element in row-major order.
func naiveGather(storage []byte, esz, offset int64, shape, stride []int64) []byte {
	numel := int64(1)
	for _, n := range shape {
		numel *= n
	}
	out := make([]byte, 0, numel*esz)
	idx := make([]int64, len(shape))
	for e := int64(0); e < numel; e++ {
		rem := e
		pos := offset
		for i := len(shape) - 1; i >= 0; i-- {
			idx[i] = rem % shape[i]
			rem /= shape[i]
			pos += idx[i] * stride[i]
		}
		out = append(out, storage[pos*esz:(pos+1)*esz]...)
	}
	return out
}

func TestStridedReader(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	big := int64(gatherWindow) // strides this wide are read one element at a time
	cases := []struct {
		name           string
		dtype          safetensors.DType
		offset         int64
		shape, stride  []int64
		storageElems   int64
		wantContiguous bool
	}{
		{"transpose f32", safetensors.F32, 0, []int64{5, 3}, []int64{1, 5}, 15, false},
		{"transpose bf16 with offset", safetensors.BF16, 3, []int64{7, 4}, []int64{1, 7}, 40, false},
		{"row block", safetensors.F16, 9, []int64{3, 4}, []int64{8, 1}, 40, false},
		{"permute 3d", safetensors.F32, 0, []int64{4, 2, 3}, []int64{1, 12, 4}, 24, false},
		{"every third", safetensors.I64, 1, []int64{5}, []int64{3}, 16, false},
		{"wide stride, one at a time", safetensors.U8, 5, []int64{3, 2}, []int64{1, big + 1}, 2*big + 10, false},
		{"wide 2-byte stride", safetensors.F16, 0, []int64{2, 3}, []int64{1, big / 2}, big + 4, false},
		{"size-1 dims with odd strides", safetensors.F32, 4, []int64{1, 3, 1}, []int64{99, 1, 7}, 8, true},
		{"contiguous with offset", safetensors.I32, 2, []int64{2, 3}, []int64{3, 1}, 8, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			esz := int64(c.dtype.Size())
			const base = 13 // the storage starts 13 bytes into the "file"
			file := make([]byte, base+c.storageElems*esz+5)
			for i := range file {
				file[i] = byte(rng.IntN(256))
			}
			storage := file[base : base+c.storageElems*esz]
			v := &tensorView{
				storage: &storageRef{key: "0", class: &storageClass{name: "X", dtype: c.dtype}, nbytes: int64(len(storage)), offset: base},
				dtype:   c.dtype, offset: c.offset, shape: c.shape, stride: c.stride,
			}
			l, err := checkView(v)
			if err != nil {
				t.Fatal(err)
			}
			if l.contiguous() != c.wantContiguous {
				t.Fatalf("contiguous = %v", l.contiguous())
			}
			want := naiveGather(storage, esz, c.offset, c.shape, c.stride)
			r := l.reader(bytes.NewReader(file))
			all, err := io.ReadAll(io.NewSectionReader(r, 0, l.nbytes))
			if err != nil || !bytes.Equal(all, want) {
				t.Fatalf("whole read %x (%v), want %x", all, err, want)
			}
			// Random windows, including ones that start or end mid-element
			// and ones that run past the end.
			for range 200 {
				off := rng.Int64N(l.nbytes)
				buf := make([]byte, 1+rng.IntN(int(l.nbytes)+3))
				n, err := r.ReadAt(buf, off)
				end := min(off+int64(len(buf)), l.nbytes)
				if int64(n) != end-off || !bytes.Equal(buf[:n], want[off:end]) {
					t.Fatalf("ReadAt(%d bytes, %d) = %d %x, want %x", len(buf), off, n, buf[:n], want[off:end])
				}
				if (int64(n) < int64(len(buf))) != (err == io.EOF) {
					t.Fatalf("ReadAt(%d bytes, %d) = %d, %v", len(buf), off, n, err)
				}
			}
		})
	}
}

// A storage that changed under us (short read) is an error, not garbage.
func TestStridedReaderShortSource(t *testing.T) {
	v := &tensorView{
		storage: &storageRef{key: "0", class: &storageClass{dtype: safetensors.F32}, nbytes: 24, offset: 0},
		dtype:   safetensors.F32, shape: []int64{3, 2}, stride: []int64{1, 3},
	}
	l, err := checkView(v)
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.reader(bytes.NewReader(make([]byte, 10))).ReadAt(make([]byte, 24), 0)
	if err != io.ErrUnexpectedEOF {
		t.Fatalf("error %v, want unexpected EOF", err)
	}
}

func TestCheckView(t *testing.T) {
	const huge = math.MaxInt64 / 2
	cases := []struct {
		name          string
		nbytes        int64
		offset        int64
		shape, stride []int64
		want          string
	}{
		{"fits exactly", 16, 1, []int64{3}, []int64{1}, ""},
		{"one past the end", 16, 2, []int64{3}, []int64{1}, "reaches element 4 of storage \"0\", which has 4 elements"},
		{"stride past the end", 16, 0, []int64{2, 2}, []int64{3, 1}, "reaches element 4"},
		{"numel overflow", 16, 0, []int64{huge, 4}, []int64{0, 0}, "overflows"},
		{"bytes overflow", 16, 0, []int64{huge}, []int64{0}, "overflows"},
		{"span overflow", 16, 0, []int64{3}, []int64{huge + 1}, "overflows"},
		{"offset plus span overflow", 16, huge + 1, []int64{2}, []int64{huge + 1}, "overflows"},
		{"empty tensor anywhere inside", 16, 4, []int64{0, 5}, []int64{5, 1}, ""},
		{"empty tensor past the end", 16, 5, []int64{0}, []int64{1}, "storage offset 5 is past the end"},
		{"scalar", 16, 3, nil, nil, ""},
		{"scalar past the end", 16, 4, nil, nil, "reaches element 4"},
		{"ragged storage", 15, 0, []int64{1}, []int64{1}, "not a whole number of F32 elements"},
		// Views that stream an element more than once would let a small
		// file claim any number of bytes (issue 26).
		{"broadcast row", 24, 2, []int64{3, 4}, []int64{0, 1}, `reads some elements of storage "0" more than once`},
		{"broadcast column", 16, 0, []int64{4, 3}, []int64{1, 0}, "more than once"},
		{"expand within a larger storage", 64, 0, []int64{2, 4}, []int64{0, 1}, "more than once"},
		{"sliding windows", 64, 0, []int64{3, 4}, []int64{1, 1}, "more than once"},
		{"interleaved rows", 64, 0, []int64{2, 4}, []int64{2, 1}, "more than once"},
		{"size-1 expand", 16, 0, []int64{1, 4}, []int64{0, 1}, ""},
		{"permuted, touching", 96, 0, []int64{4, 2, 3}, []int64{1, 12, 4}, ""},
		{"rows of a wider matrix", 64, 1, []int64{3, 4}, []int64{5, 1}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := &tensorView{
				storage: &storageRef{key: "0", class: &storageClass{dtype: safetensors.F32}, nbytes: c.nbytes},
				dtype:   safetensors.F32, offset: c.offset, shape: c.shape, stride: c.stride,
			}
			_, err := checkView(v)
			testkit.WantErr(t, err, c.want)
		})
	}
}

// TestCheckAliasing: tensors may stream at most maxAliasFactor times the
// bytes of the file their storages cover, and the error names the cause.
func TestCheckAliasing(t *testing.T) {
	type tensor struct {
		storage        string
		offset, nbytes int64 // the storage's entry
		streamed       int64 // the tensor's bytes
	}
	// repeatTensor is n tensors like t; with no storage key, each over a
	// storage of its own, "0", "1", ...
	repeatTensor := func(n int, t tensor) []tensor {
		out := make([]tensor, n)
		for i := range out {
			out[i] = t
			if t.storage == "" {
				out[i].storage = fmt.Sprint(i)
			}
		}
		return out
	}
	cases := []struct {
		name    string
		tensors []tensor
		want    string
	}{
		{"untied", []tensor{{"0", 0, 64, 64}, {"1", 64, 32, 16}}, ""},
		{"tied four times", []tensor{{"0", 0, 64, 64}, {"0", 0, 64, 64}, {"0", 0, 64, 64}, {"0", 0, 64, 64}}, ""},
		{"empty storages", []tensor{{"0", 0, 0, 0}, {"0", 0, 0, 0}}, ""},
		{"four and a byte", []tensor{{"0", 0, 64, 64}, {"0", 0, 64, 64}, {"0", 0, 64, 64}, {"0", 0, 64, 64}, {"0", 0, 64, 1}},
			`tensors stream 257 bytes from 64 bytes of storage in the file, more than 4 times as many, the limit on shared storage (storage "0" alone is read by 5 tensors for 257 bytes)`},
		// The large storage streams the most but only its own bytes once.
		{"many small views beside a large tensor", []tensor{
			{"big", 0, 100, 100},
			{"s", 100, 1, 1}, {"s", 100, 1, 1}, {"s", 100, 1, 1}, {"s", 100, 1, 1}, {"s", 100, 1, 1},
			{"t", 101, 1, 1}, {"t", 101, 1, 1}, {"t", 101, 1, 1}, {"t", 101, 1, 1}, {"t", 101, 1, 1}, {"t", 101, 1, 1},
		}, ""},
		// "a" sorts first and streams the most bytes, but only its own.
		{"small views outweigh a large tensor", append([]tensor{{"a", 0, 8, 8}}, repeatTensor(40, tensor{"t", 8, 1, 1})...),
			`tensors stream 48 bytes from 9 bytes of storage in the file, more than 4 times as many, the limit on shared storage (storage "t" alone is read by 40 tensors for 40 bytes)`},
		{"entries over the same bytes", append(repeatTensor(6, tensor{"", 0, 64, 64}), tensor{"x", 32, 64, 64}),
			`tensors stream 448 bytes from 96 bytes of storage in the file, more than 4 times as many, the limit on shared storage (the storages' zip entries overlap, claiming 448 bytes)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			refs := map[string]*storageRef{}
			var views []namedView
			var layouts []*layout
			for i, tt := range c.tensors {
				if refs[tt.storage] == nil {
					refs[tt.storage] = &storageRef{key: tt.storage, offset: tt.offset, nbytes: tt.nbytes}
				}
				views = append(views, namedView{name: string(rune('a' + i)), view: &tensorView{storage: refs[tt.storage]}})
				layouts = append(layouts, &layout{nbytes: tt.streamed})
			}
			err := checkAliasing(views, layouts)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || err.Error() != c.want {
				t.Fatalf("error %v\nwant %s", err, c.want)
			}
		})
	}
}
