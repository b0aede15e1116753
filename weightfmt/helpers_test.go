package weightfmt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
)

// The helpers and table runners the format tests share.

const (
	bf16 = safetensors.BF16
	f32  = safetensors.F32
	u8   = safetensors.U8
)

// bf16s and f32s are scale tensors of exactly representable values.
func bf16s(v ...float64) []byte {
	b := make([]byte, 0, 2*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint16(b, numfmt.F64ToBF16(x))
	}
	return b
}

func f32s(v ...float32) []byte { return testkit.F32LE(v...) }

// rep is n copies of v.
func rep(v float32, n int) []float32 { return slices.Repeat([]float32{v}, n) }

// fp4Group is a group of n FP4 (E2M1) elements, two to a byte, as MXFP4
// and NVFP4 store them: the bytes head, zero after.
func fp4Group(n int, head ...byte) []byte { return padded(n/2, head...) }

// outputs is n dequantised values: head, zero after.
func outputs(n int, head ...float32) []float32 { return padded(n, head...) }

func padded[T byte | float32](n int, head ...T) []T {
	out := make([]T, n)
	copy(out, head)
	return out
}

// sameFloats compares bit-for-bit but for the sign of zero, NaN equal to NaN.
func sameFloats(got, want []float32) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		g, w := got[i], want[i]
		if g != w && !(g != g && w != w) {
			return false
		}
	}
	return true
}

// randomBytes are n random non-zero bytes.
func randomBytes(rng *rand.Rand, n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(1 + rng.IntN(255))
	}
	return b
}

// gather reads a region's ranges out of b, each shifted by base.
func gather(b []byte, r Region, base int64) []byte {
	var out []byte
	for _, rg := range r.Ranges() {
		out = append(out, b[base+rg[0]:base+rg[1]]...)
	}
	return out
}

// orNil keeps an absent scale (a plain weight's, or a global scale of a
// format without one) absent.
func orNil(b, like []byte) []byte {
	if like == nil {
		return nil
	}
	return b
}

// orNone is the quantization New gives a Spec that names none.
func orNone(q string) string {
	if q == "" {
		return QuantNone
	}
	return q
}

// newCase is a Spec New must read as want, or refuse with an error saying
// wantErr.
type newCase struct {
	name    string
	spec    Spec
	want    Format
	wantErr string
}

func checkNew(t *testing.T, cases []newCase) {
	t.Helper()
	for _, tc := range cases {
		got, err := New(tc.spec)
		switch {
		case tc.wantErr != "":
			testkit.ErrorContains(t, err, tc.wantErr, tc.name)
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case got != tc.want:
			t.Errorf("%s: %#v, want %#v", tc.name, got, tc.want)
		case got.Quantization() != orNone(tc.spec.Quantization):
			t.Errorf("%s: quantization %q, want %q", tc.name, got.Quantization(), tc.spec.Quantization)
		}
	}
}

// foldCase is where a format's FoldRule puts a factor, and the refusal it
// gives for "rsf 2.5" where it puts none.
type foldCase struct {
	f         Format
	into      FoldTarget
	dtype     safetensors.DType
	byDefault bool
	refusal   string
}

func checkFold(t *testing.T, cases []foldCase) {
	t.Helper()
	for _, tc := range cases {
		r := tc.f.Fold()
		if r.Into != tc.into || r.DType != tc.dtype || r.ByDefault != tc.byDefault || r.Refusal("rsf 2.5") != tc.refusal {
			t.Errorf("%s: fold %+v refusal %q, want into %d %s by default %v refusal %q", tc.f, r, r.Refusal("rsf 2.5"), tc.into, tc.dtype, tc.byDefault, tc.refusal)
		}
	}
}

// dequantCase is a weight f.Dequantise must turn into want.
type dequantCase struct {
	name       string
	f          Format
	rows, cols int
	raw, scale []byte
	want       []float32
}

func checkDequantise(t *testing.T, cases []dequantCase) {
	t.Helper()
	for _, tc := range cases {
		dst := make([]float32, tc.rows*tc.cols)
		if err := tc.f.Dequantise(tc.raw, tc.rows, tc.cols, tc.scale, dst); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !sameFloats(dst, tc.want) {
			t.Errorf("%s:\n got %v\nwant %v", tc.name, dst, tc.want)
		}
	}
}

// refusal is a call of f.Dequantise into ndst outputs that must fail with
// an error saying want.
type refusal struct {
	name       string
	f          Format
	rows, cols int
	raw, scale []byte
	ndst       int
	want       string
}

func checkRefusals(t *testing.T, cases []refusal) {
	t.Helper()
	for _, tc := range cases {
		err := tc.f.Dequantise(tc.raw, tc.rows, tc.cols, tc.scale, make([]float32, tc.ndst))
		testkit.ErrorContains(t, err, tc.want, tc.name)
	}
}

// mxRefusals are the refusals every format of 32-column groups with one
// E8M0 scale byte a group shares (MXFP4, MXFP8): a row that is not a whole
// number of groups (48 columns, and a short row of 31), a weight a byte
// short, a scale grid too long or missing, too few outputs. groupBytes is
// the weight bytes of one group; shortWeight what the format's error for a
// short weight says.
func mxRefusals(f Format, groupBytes int, shortWeight string) []refusal {
	weight := func(cols int) []byte { return make([]byte, (cols*groupBytes+31)/32) }
	return []refusal{
		{"partial group", f, 1, 48, weight(48), []byte{1, 1}, 48, "whole number of 32-column"},
		{"short row", f, 1, 31, weight(31), []byte{1}, 31, "whole number of 32-column"},
		{"short weight", f, 1, 32, weight(32)[1:], []byte{1}, 32, shortWeight},
		{"long grid", f, 1, 32, weight(32), []byte{1, 2}, 32, "scale bytes"},
		{"missing grid", f, 1, 32, weight(32), nil, 32, "scale bytes"},
		{"short output", f, 2, 32, weight(64), []byte{1, 1}, 63, "outputs"},
	}
}

// stack is N random [rows, cols] weights of a format, their scale grids and
// global scales, each laid out as a stack [N, ...] the way a stacked
// checkpoint holds them, addressed by hand in packing units: element c of a
// row lives in unit c/elems, the units of a row are consecutive (a plain or
// FP8 weight has one element to a unit).
type stack struct {
	m                       Matrix
	n, elems, ub, units     int64 // ub: bytes of a unit
	weight, scales, globals []byte
	ses, gr, gc             int64 // bytes of a scale entry, grid shape
	bo, bi                  int64 // block edges (the whole axis for 0)
}

func newStack(rng *rand.Rand, f Format, n, rows, cols int64) *stack {
	s := &stack{m: Matrix{Format: f, Rows: rows, Cols: cols}, n: n}
	s.elems, s.ub = f.Packing()
	s.units = ceilDiv(cols, s.elems)
	s.weight = randomBytes(rng, n*rows*s.units*s.ub)
	if sc, ok := f.Scale(); ok {
		s.ses = int64(sc.DType.Size())
		s.gr, s.gc = s.m.ScaleShape()
		s.bo, s.bi = sc.Block[0], sc.Block[1]
		if s.bo == 0 {
			s.bo = rows
		}
		if s.bi == 0 {
			s.bi = cols
		}
		s.scales = randomBytes(rng, n*s.gr*s.gc*s.ses)
	}
	s.globals = randomBytes(rng, n*s.m.GlobalBytes())
	return s
}

// want is the bytes of rows [r0, r0+nr) x columns [c0, c0+nc) of expert
// e (whole units), row by row, the grid entries covering them and the
// expert's global scale.
func (s *stack) want(e, r0, nr, c0, nc int64) (w, sc, g []byte) {
	for r := r0; r < r0+nr; r++ {
		for u := c0 / s.elems; u < ceilDiv(c0+nc, s.elems); u++ {
			at := ((e*s.m.Rows+r)*s.units + u) * s.ub
			w = append(w, s.weight[at:at+s.ub]...)
		}
	}
	if s.ses > 0 {
		for gi := r0 / s.bo; gi*s.bo < r0+nr; gi++ {
			for h := c0 / s.bi; h*s.bi < c0+nc; h++ {
				at := ((e*s.gr+gi)*s.gc + h) * s.ses
				sc = append(sc, s.scales[at:at+s.ses]...)
			}
		}
	}
	gb := s.m.GlobalBytes()
	return w, sc, s.globals[e*gb : (e+1)*gb]
}

func (s *stack) check(t *testing.T, what string, e int64, sl Slice, r0, nr, c0, nc int64) {
	t.Helper()
	ex := s.m.Expert(e)
	w, sc, g := s.want(e, r0, nr, c0, nc)
	if got := gather(s.weight, sl.Weight, ex.Weight.Off); !bytes.Equal(got, w) || sl.Weight.Size() != int64(len(w)) {
		t.Errorf("%s: weight bytes differ from the units' (%d bytes, want %d)", what, len(got), len(w))
	}
	if got := gather(s.scales, sl.Scale, ex.Scale.Off); !bytes.Equal(got, sc) || sl.Scale.Size() != int64(len(sc)) {
		t.Errorf("%s: scale bytes differ from the covering entries' (%d bytes, want %d)", what, len(got), len(sc))
	}
	if got := gather(s.globals, sl.Global, ex.Global.Off); !bytes.Equal(got, g) {
		t.Errorf("%s: global scale bytes %x, want %x", what, got, g)
	}
}

// checkSlices checks, for every expert, its size, the whole, and rounds
// random row blocks and column blocks (on packing-unit edges) against
// indexing by hand.
func (s *stack) checkSlices(t *testing.T, rng *rand.Rand, name string, rounds int) {
	t.Helper()
	rows, cols := s.m.Rows, s.m.Cols
	for e := range s.n {
		if ex := s.m.Expert(e); ex.Weight.Size() != s.m.Bytes() || ex.Scale.Size() != s.m.ScaleBytes() {
			t.Errorf("%s expert %d: %d+%d bytes, want %d+%d", name, e, ex.Weight.Size(), ex.Scale.Size(), s.m.Bytes(), s.m.ScaleBytes())
		}
		s.check(t, name+" whole", e, s.m.Whole(), 0, rows, 0, cols)
		for range rounds {
			r0 := rng.Int64N(rows)
			nr := 1 + rng.Int64N(rows-r0)
			s.check(t, fmt.Sprintf("%s expert %d rows %d+%d", name, e, r0, nr), e, s.m.RowBlock(r0, nr), r0, nr, 0, cols)
			u0 := rng.Int64N(s.units)
			c0 := u0 * s.elems
			nc := min((1+rng.Int64N(s.units-u0))*s.elems, cols-c0)
			s.check(t, fmt.Sprintf("%s expert %d cols %d+%d", name, e, c0, nc), e, s.m.ColBlock(c0, nc), 0, rows, c0, nc)
		}
	}
}

// checkPieces cuts m's weight (raw, scale and global) at the exact splits
// among rowCuts and colCuts ({start, length}) and dequantises each piece with
// the scale entries and global scale its Slice names: every piece must be
// its part of the whole weight dequantised at once.
func checkPieces(t *testing.T, m Matrix, raw, scale, global []byte, rowCuts, colCuts [][2]int64) {
	t.Helper()
	f, rows, cols := m.Format, m.Rows, m.Cols
	whole := make([]float32, rows*cols)
	if err := DequantiseWeight(f, raw, int(rows), int(cols), scale, global, whole); err != nil {
		t.Fatalf("%s: %v", f, err)
	}
	piece := func(sl Slice, nr, nc int64) []float32 {
		t.Helper()
		out := make([]float32, nr*nc)
		if err := DequantiseWeight(f, gather(raw, sl.Weight, 0), int(nr), int(nc), orNil(gather(scale, sl.Scale, 0), scale), orNil(gather(global, sl.Global, 0), global), out); err != nil {
			t.Fatalf("%s %dx%d piece: %v", f, nr, nc, err)
		}
		return out
	}
	for _, cut := range rowCuts {
		if !m.RowSplitExact(cut[0]) || !m.RowSplitExact(cut[0]+cut[1]) {
			continue
		}
		if !sameFloats(piece(m.RowBlock(cut[0], cut[1]), cut[1], cols), whole[cut[0]*cols:(cut[0]+cut[1])*cols]) {
			t.Errorf("%s rows %d+%d: the piece dequantises differently from the whole", f, cut[0], cut[1])
		}
	}
	for _, cut := range colCuts {
		if !m.ColSplitExact(cut[0]) || !m.ColSplitExact(cut[0]+cut[1]) {
			continue
		}
		p := piece(m.ColBlock(cut[0], cut[1]), rows, cut[1])
		for r := range rows {
			if !sameFloats(p[r*cut[1]:(r+1)*cut[1]], whole[r*cols+cut[0]:r*cols+cut[0]+cut[1]]) {
				t.Errorf("%s columns %d+%d row %d: the piece dequantises differently from the whole", f, cut[0], cut[1], r)
			}
		}
	}
}
