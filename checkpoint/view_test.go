package checkpoint

import (
	"bytes"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// stored is a Checkpoint of one [e, r, c] tensor of 2-byte elements of
// random bytes (seeded): any view's expected bytes follow from index
// arithmetic on data, and no two places are likely to hold the same pair.
func stored(e, r, c int64) (*Checkpoint, []byte) {
	data := make([]byte, e*r*c*2)
	rng := rand.New(rand.NewPCG(uint64(e), uint64(r*c)))
	for n := range data {
		data[n] = byte(rng.Uint32())
	}
	t := &Tensor{Name: "w", DType: safetensors.BF16, Shape: []int64{e, r, c}, File: "model.safetensors", Data: bytes.NewReader(data)}
	return &Checkpoint{byName: map[string]*Tensor{"w": t}}, data
}

func TestViews(t *testing.T) {
	const e, r, c = 3, 5, 8
	ck, data := stored(e, r, c)
	elem := func(i, j, k int64) []byte { n := (i*r+j)*c + k; return data[2*n : 2*n+2] }
	for _, tc := range []struct {
		name  string
		shape []int64
		at    func(a, b int64) []byte // element (a, b) of the 2-D view
	}{
		{"w[1]", []int64{r, c}, func(a, b int64) []byte { return elem(1, a, b) }},
		{"w[2][1:4]", []int64{3, c}, func(a, b int64) []byte { return elem(2, a+1, b) }},
		// Llama 4: gate = columns 0..I-1 transposed, up = columns I..2I-1, down whole transposed.
		{"w[1][T:0:4:1]", []int64{4, r}, func(a, b int64) []byte { return elem(1, b, a) }},
		{"w[0][T:4:4:1]", []int64{4, r}, func(a, b int64) []byte { return elem(0, b, a+4) }},
		{"w[2][T:0:8:1]", []int64{c, r}, func(a, b int64) []byte { return elem(2, b, a) }},
		// gpt-oss interleaves gate and up columns: step 2.
		{"w[1][T:1:4:2]", []int64{4, r}, func(a, b int64) []byte { return elem(1, b, 1+2*a) }},
		{"w[0][1:3][T:1:3:3]", []int64{3, 2}, func(a, b int64) []byte { return elem(0, b+1, 1+3*a) }},
	} {
		v, ok := ck.Tensor(tc.name)
		if !ok {
			t.Fatalf("%s: not resolved: %v", tc.name, func() error { _, err := ck.view(tc.name); return err }())
		}
		if !slices.Equal(v.Shape, tc.shape) {
			t.Fatalf("%s: shape %v, want %v", tc.name, v.Shape, tc.shape)
		}
		var want []byte
		for a := range tc.shape[0] {
			for b := range tc.shape[1] {
				want = append(want, tc.at(a, b)...)
			}
		}
		got, err := v.ReadAll()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: ReadAll = %v, %v; want %v", tc.name, got, err, want)
		}
		// Every position and length, odd ones included (a read may start
		// or end inside an element or an output row).
		for pos := 0; pos <= len(want); pos++ {
			for n := 0; pos+n <= len(want); n++ {
				b := make([]byte, n)
				k, err := v.Data.ReadAt(b, int64(pos))
				if k != n || !bytes.Equal(b, want[pos:pos+n]) || (err != nil && err != io.EOF) {
					t.Fatalf("%s: ReadAt(%d bytes at %d) = %d, %v: %v, want %v", tc.name, n, pos, k, err, b, want[pos:pos+n])
				}
			}
		}
		if k, err := v.Data.ReadAt(make([]byte, 4), int64(len(want)-2)); k != 2 || err != io.EOF {
			t.Fatalf("%s: read past the end = %d, %v; want 2, EOF", tc.name, k, err)
		}
	}
}

// TestTransposedViewLargeGroups reads a transposed view larger than one
// read buffer group, at random positions and lengths.
func TestTransposedViewLargeGroups(t *testing.T) {
	const e, r, c = 1, 700, 6100 // 700 source rows x 6100 columns: several groups of output rows
	ck, data := stored(e, r, c)
	v, ok := ck.Tensor("w[0][T:3:3000:2]")
	if !ok {
		t.Fatal("view not resolved")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	size := int(v.NumBytes())
	for range 40 {
		pos := rng.IntN(size)
		n := rng.IntN(min(size-pos, 9<<20) + 1)
		b := make([]byte, n)
		if k, err := v.Data.ReadAt(b, int64(pos)); k != n || (err != nil && err != io.EOF) {
			t.Fatalf("ReadAt(%d at %d) = %d, %v", n, pos, k, err)
		}
		for q := pos &^ 1; q < pos+n; q += 2 {
			el := int64(q / 2)
			i, row := el/r, el%r
			src := 2 * (row*c + 3 + 2*i)
			for d := range int64(2) {
				if at := int64(q) + d; at >= int64(pos) && at < int64(pos+n) && b[at-int64(pos)] != data[src+d] {
					t.Fatalf("byte %d (output element %d,%d): %d, want %d", at, i, row, b[at-int64(pos)], data[src+d])
				}
			}
		}
	}
}

func TestViewErrors(t *testing.T) {
	ck, _ := stored(3, 5, 8)
	for name, want := range map[string]string{
		"w[3]":             "slice 3",
		"w[0][T:0:9:1]":    "transposed columns",
		"w[0][T:1:4:2]x":   "missing",
		"w[0][T:7:2:1]":    "transposed columns",
		"w[0][T:0:4:0]":    "transposed columns",
		"w[T:0:4:1]":       "transposed columns", // 3-D: needs a slice first
		"w[0][T:0:4:1][1]": "transposed columns", // must be last
		"w[0][T:0:4]":      "transposed columns",
	} {
		if _, err := ck.view(name); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "model.safetensors") && want != "missing" {
			t.Errorf("%s: %v, want an error naming the file and %q", name, err, want)
		}
	}
}

// TestStridedViewSpans reads strided rows at random offsets and lengths,
// with rows small enough to be gathered many to a span (gpt-oss MXFP4's
// gate/up rows), about a span long, and longer than one: every byte must be
// the source row's.
func TestStridedViewSpans(t *testing.T) {
	for _, tc := range []struct {
		name    string
		r, c    int64 // source rows, columns (2-byte elements)
		view    string
		r0, stp int64
	}{
		{"small rows, step 2", 4000, 720, "w[0][R:0:2000:2]", 0, 2},
		{"small rows, odd rows", 4000, 720, "w[0][R:1:2000:2]", 1, 2},
		{"rows near half a span", 9, gatherSpan / 4, "w[0][R:1:4:2]", 1, 2},
		{"rows over a span", 5, gatherSpan/2 + 3, "w[0][R:0:3:2]", 0, 2},
	} {
		for _, lent := range []bool{false, true} {
			name := tc.name
			if lent {
				name += ", lent"
			}
			t.Run(name, func(t *testing.T) {
				stridedSpans(t, tc.r, tc.c, tc.view, tc.r0, tc.stp, lent)
			})
		}
	}
}

// stridedSpans reads strided view of a [1, r, c] tensor at random places
// and checks every byte; with lent, the stored tensor's reader lends the
// spans that lie in its first half (as a streamed pass lends what it
// holds), and each lent span must be handed back.
func stridedSpans(t *testing.T, r, c int64, view string, r0, stp int64, lent bool) {
	tc := struct{ r, c, r0, stp int64 }{r, c, r0, stp}
	{
		{
			ck, data := stored(1, tc.r, tc.c)
			var lr *lendingReader
			if lent {
				lr = &lendingReader{data: data, upTo: int64(len(data) / 2)}
				ck.byName["w"].Data = lr
			}
			v, ok := ck.Tensor(view)
			if !ok {
				t.Fatal("view not resolved")
			}
			rowBytes := 2 * tc.c
			rng := rand.New(rand.NewPCG(3, uint64(tc.c)))
			size := int(v.NumBytes())
			for k := range 60 {
				pos, n := 0, size // the first read: the whole view
				if k > 0 {
					pos = rng.IntN(size)
					n = rng.IntN(min(size-pos, 3<<20) + 1)
				}
				b := make([]byte, n)
				if got, err := v.Data.ReadAt(b, int64(pos)); got != n || (err != nil && err != io.EOF) {
					t.Fatalf("ReadAt(%d at %d) = %d, %v", n, pos, got, err)
				}
				for q := range n {
					at := int64(pos + q)
					row, within := at/rowBytes, at%rowBytes
					if want := data[(tc.r0+row*tc.stp)*rowBytes+within]; b[q] != want {
						t.Fatalf("ReadAt(%d at %d): byte %d (row %d, +%d) = %d, want %d", n, pos, at, row, within, b[q], want)
					}
				}
			}
			if lr != nil && lr.out != 0 {
				t.Errorf("%d lent spans not handed back", lr.out)
			}
			if lr != nil && lr.lent == 0 && (1+tc.stp)*rowBytes <= gatherSpan { // rows read a span at a time
				t.Errorf("no span was lent: every row was copied twice")
			}
		}
	}
}

// lendingReader is a stored tensor's bytes that lends (no copy) any span
// ending at or before upTo and reads the rest, counting what it lent and
// what is still out.
type lendingReader struct {
	data      []byte
	upTo      int64
	lent, out int
}

func (l *lendingReader) ReadAt(p []byte, off int64) (int, error) {
	return bytes.NewReader(l.data).ReadAt(p, off)
}

func (l *lendingReader) Lend(off, n int64) ([]byte, func(), bool) {
	if off < 0 || off+n > l.upTo {
		return nil, nil, false
	}
	l.lent++
	l.out++
	return l.data[off : off+n], func() { l.out-- }, true
}

// spanReader records the byte range every read of it takes.
type spanReader struct {
	r     io.ReaderAt
	spans [][2]int64
}

func (s *spanReader) ReadAt(p []byte, off int64) (int, error) {
	s.spans = append(s.spans, [2]int64{off, off + int64(len(p))})
	return s.r.ReadAt(p, off)
}

// TestStoredSpan: every read of bytes [pos, pos+n) of a view takes bytes of
// its stored tensor inside the span StoredSpan names, and the span is the
// one expected (the view's rows, columns or strided rows, what lies between
// them included); a stored tensor's span is its own bytes. A view made
// before its stored tensor's reader changes reads through the new reader.
func TestStoredSpan(t *testing.T) {
	const e, r, c = 3, 6, 8 // bf16: a source row is 16 bytes, an expert 96
	for _, tc := range []struct {
		view   string
		pos, n int64
		lo, hi int64 // want
	}{
		{view: "w", pos: 10, n: 20, lo: 10, hi: 30},
		{view: "w[1]", pos: 0, n: 96, lo: 96, hi: 192},
		{view: "w[2][1:4]", pos: 3, n: 10, lo: 192 + 16 + 3, hi: 192 + 16 + 13},
		// strided rows 1, 3, 5 of expert 1: whole rows from the first touched to the last
		{view: "w[1][R:1:3:2]", pos: 0, n: 48, lo: 96 + 16, hi: 96 + 5*16 + 16},
		{view: "w[1][R:1:3:2]", pos: 17, n: 2, lo: 96 + 3*16, hi: 96 + 3*16 + 16},
		// columns 0..3 transposed: output row i is column i of every source row
		{view: "w[0][T:0:4:1]", pos: 0, n: 4 * 12, lo: 0, hi: 5*16 + 4*2},
		{view: "w[0][T:1:4:2]", pos: 12, n: 12, lo: 3 * 2, hi: 5*16 + 4*2},
		// a stored-columns reader (Untransposed) of the same view
		// (its row 2: columns 4..7 of source row 2)
		{view: "w[2][T:4:4:1] (stored)", pos: 16, n: 8, lo: 192 + 2*16 + 8, hi: 192 + 2*16 + 16},
	} {
		ck, _ := stored(e, r, c)
		base := ck.byName["w"]
		name, untransposed := strings.CutSuffix(tc.view, " (stored)")
		v, ok := ck.Tensor(name)
		if !ok {
			t.Fatalf("%s: not resolved", tc.view)
		}
		if untransposed {
			if v, ok = v.Untransposed(); !ok {
				t.Fatalf("%s: not a transposed view", tc.view)
			}
		}
		// made before the reader changes: reads through the new one
		rec := &spanReader{r: base.Data}
		base.Data = rec
		got, lo, hi := v.StoredSpan(tc.pos, tc.n)
		if got != base || lo != tc.lo || hi != tc.hi {
			t.Errorf("%s: StoredSpan(%d, %d) = %s [%d, %d), want w [%d, %d)", tc.view, tc.pos, tc.n, got.Name, lo, hi, tc.lo, tc.hi)
		}
		if _, err := v.Data.ReadAt(make([]byte, tc.n), tc.pos); err != nil && err != io.EOF {
			t.Fatalf("%s: %v", tc.view, err)
		}
		if len(rec.spans) == 0 {
			t.Errorf("%s: the read did not go through the stored tensor's current reader", tc.view)
		}
		for _, s := range rec.spans {
			if s[0] < lo || s[1] > hi {
				t.Errorf("%s: a read of bytes [%d, %d) of w, outside [%d, %d)", tc.view, s[0], s[1], lo, hi)
			}
		}
	}
}
