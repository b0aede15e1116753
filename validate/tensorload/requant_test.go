package tensorload

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// countingReader counts the reads of a plain weight's bytes.
type countingReader struct {
	r     *bytes.Reader
	reads *atomic.Int64
}

func (c countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.reads.Add(1)
	return c.r.ReadAt(p, off)
}

type mapSource map[string]*checkpoint.Tensor

func (m mapSource) Tensor(name string) (*checkpoint.Tensor, bool) { t, ok := m[name]; return t, ok }

// TestComputedAhead: Computed computes a requantised MLP once, now. Where
// it fits in the requantiser's cache it is computed into it, nothing held
// apart: reading it again reads no byte of the plain weights. Where it
// does not, it is held in memory. Either way its bytes are what reading
// the requantised tensors computes.
func TestComputedAhead(t *testing.T) {
	const h, inter = 256, 64
	rng := rand.New(rand.NewPCG(45, 10))
	for _, tc := range []struct {
		name  string
		limit int64 // aheadInCache
		held  bool
	}{{"fits the cache", 1 << 30, false}, {"larger than the cache", 1 << 10, true}} {
		t.Run(tc.name, func(t *testing.T) {
			old := aheadInCache
			aheadInCache = func() int64 { return tc.limit }
			defer func() { aheadInCache = old }()
			var reads atomic.Int64
			src, same := mapSource{}, mapSource{} // same: the same bytes, another requantiser
			names := map[string][2]int{"gate": {inter, h}, "up": {inter, h}, "down": {h, inter}}
			for p, d := range names {
				raw := make([]byte, 2*d[0]*d[1])
				for i := range d[0] * d[1] {
					binary.LittleEndian.PutUint16(raw[2*i:], numfmt.F32ToBF16(float32(rng.NormFloat64())))
				}
				// A name of its own per case: the requantiser's cache is
				// shared by tensor, and each case starts with none cached.
				name := fmt.Sprintf("%s %s", tc.name, p)
				src[name] = &checkpoint.Tensor{Name: name, DType: safetensors.BF16, Shape: []int64{int64(d[0]), int64(d[1])}, File: "mem",
					Data: countingReader{bytes.NewReader(raw), &reads}}
				c := *src[name]
				c.Data = bytes.NewReader(raw)
				same[name] = &c
			}
			m := family.MLPOf(tc.name+" gate", tc.name+" up", tc.name+" down")
			rm, rsrc, err := RequantisedShared(src, m, weightfmt.Int4Pack(32, safetensors.BF16))
			if err != nil {
				t.Fatal(err)
			}
			_, wsrc, err := RequantisedShared(same, m, weightfmt.Int4Pack(32, safetensors.BF16))
			if err != nil {
				t.Fatal(err)
			}
			want := map[string][]byte{}
			for _, n := range rm.Names() {
				rt, _ := wsrc.Tensor(n)
				want[n] = make([]byte, rt.NumBytes())
				if _, err := rt.Data.ReadAt(want[n], 0); err != nil {
					t.Fatal(err)
				}
			}
			ahead := Computed(rsrc, rm.Names())
			before := reads.Load()
			held := 0
			for _, n := range rm.Names() {
				at, _ := ahead.Tensor(n)
				if _, ok := at.Data.(*bytes.Reader); ok {
					held++
				}
				got := make([]byte, at.NumBytes())
				if _, err := at.Data.ReadAt(got, 0); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want[n]) {
					t.Fatalf("%s: computed ahead differs from computed on read", n)
				}
			}
			if tc.held && held != 6 {
				t.Errorf("%d of 6 tensors held in memory, want all", held)
			}
			if !tc.held && held != 0 {
				t.Errorf("%d of 6 tensors held in memory, want none", held)
			}
			if n := reads.Load() - before; !tc.held && n != 0 {
				t.Errorf("reading the tensors computed ahead read the plain weights %d times, want none (the cache's)", n)
			}
		})
	}
}

// TestRequantisedReadByBands: a requantised weight, however small, is read
// a band at a time from the requantiser (its bands are in its cache; a
// whole copy would hold them twice), and decodes to what its whole bytes
// decode to; a stored weight of that size is read whole, as before, and so
// is a requantised one larger than computedByBands (the cache may not keep
// it while the paths read it).
func TestRequantisedReadByBands(t *testing.T) {
	const rows, cols = 64, 256
	rng := rand.New(rand.NewPCG(45, 11))
	raw := make([]byte, 2*rows*cols)
	for i := range rows * cols {
		binary.LittleEndian.PutUint16(raw[2*i:], numfmt.F32ToBF16(float32(rng.NormFloat64())))
	}
	plain := &checkpoint.Tensor{Name: "w", DType: safetensors.BF16, Shape: []int64{rows, cols}, File: "mem", Data: bytes.NewReader(raw)}
	f := weightfmt.Int4Pack(32, safetensors.BF16)
	qw, qs, err := checkpoint.Requantised(plain, f)
	if err != nil {
		t.Fatal(err)
	}
	src := mapSource{plain.Name: plain, qw.Name: qw, qs.Name: qs}
	w, err := LoadBands(src, MatrixRef{Name: qw.Name, Index: -1, Rows: rows, Cols: cols, Scale: qs.Name, Format: f})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release()
	if w.lazy == nil || w.in.raw != nil {
		t.Fatalf("the requantised weight was read whole (%d bytes held), not by bands", len(w.in.raw))
	}
	wb, sb := make([]byte, qw.NumBytes()), make([]byte, qs.NumBytes())
	if _, err := qw.Data.ReadAt(wb, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := qs.Data.ReadAt(sb, 0); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, rows*cols)
	if err := weightfmt.DequantiseWeight(f, wb, rows, cols, sb, nil, want); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, rows*cols)
	if err := w.Rows(0, rows, got); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("element %d: %g by bands, %g whole", i, got[i], want[i])
		}
	}
	p, err := LoadBands(src, MatrixRef{Name: plain.Name, Index: -1, Rows: rows, Cols: cols})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	if p.lazy != nil {
		t.Errorf("a stored weight of %d bytes was read by bands, want whole (LazyBytes %d)", len(raw), LazyBytes)
	}
	old := computedByBands
	computedByBands = func() int64 { return qw.NumBytes() - 1 }
	defer func() { computedByBands = old }()
	whole, err := LoadBands(src, MatrixRef{Name: qw.Name, Index: -1, Rows: rows, Cols: cols, Scale: qs.Name, Format: f})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Release()
	if whole.lazy != nil || !bytes.Equal(whole.in.raw, wb) {
		t.Errorf("a requantised weight over computedByBands was not read whole (%d of %d bytes held)", len(whole.in.raw), len(wb))
	}
}
