package tensorload

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/tensorbytes"
	"github.com/moeprep/moeprep/weightfmt"
)

// TensorSource finds a checkpoint's tensors by name; *checkpoint.Checkpoint
// satisfies it, and tests use in-memory tensors.
type TensorSource interface {
	Tensor(name string) (*checkpoint.Tensor, bool)
}

// MatrixRef locates one 2-D weight of Rows x Cols: a whole tensor
// (Index < 0) or slice Index of a stack [N,...], optionally the rows
// [RowStart, RowStart+Rows) of a taller slice of SliceRows rows (a gate-up
// tensor's gate or up half). Scale names the weight's scale tensor and must
// be set exactly when the weight is stored in a format that has one:
// Format, the contract's or plan's (a weight naming no scale is read as
// plain weights of its tensor's dtype). The scale's slice has
// ScaleSliceRows grid rows (0: the grid of SliceRows) of which the matrix
// uses its own grid's from ScaleRowStart (0: the grid rows that cover
// RowStart on).
type MatrixRef struct {
	Name           string
	Index          int
	Rows, Cols     int
	SliceRows      int // 0: Rows
	RowStart       int
	Scale          string
	ScaleSliceRows int
	ScaleRowStart  int
	Format         weightfmt.Format // how a weight with a Scale is stored
	// Global names the tensor holding the weight's per-tensor second
	// scale where Format has one (NVFP4's weight_scale_2), and
	// GlobalIndex its element there (0 for a scalar; e, or 2e and 2e+1
	// for a gate-up stack's [N,2]).
	Global      string
	GlobalIndex int
	// InOut: the slice and its scale grid are stored transposed (a stack
	// of orientation in-out): [Cols, SliceRows] and the grid's transpose,
	// the matrix their columns from RowStart (and ScaleRowStart). It is
	// read back to [Rows, Cols] before it is decoded.
	InOut bool
	// Folded is the factor DST's contract says convert folded into this
	// weight's scales (a routed expert's routed_scaling_factor; 0: none):
	// Bands.ScaledRows tells the rows that hold SRC's so folded.
	Folded float64
}

// format is how m's weight is stored: m.Format when m names a scale,
// plain in the tensor's dtype otherwise.
func (m MatrixRef) format(d safetensors.DType) (weightfmt.Format, error) {
	if m.Scale == "" {
		return weightfmt.Plain(d), nil
	}
	if m.Format == nil {
		return nil, fmt.Errorf("tensor %s names a scale %s but no weight format", m, m.Scale)
	}
	if _, ok := m.Format.Scale(); !ok {
		return nil, fmt.Errorf("tensor %s names a scale %s but its format %s has none", m, m.Scale, m.Format)
	}
	return m.Format, nil
}

// scaledAlone is the scale that a weight stored as dtype d needs but that
// m, naming no scale, lacks: the dtype of a quantised format (F8_E4M3)
// means nothing without its scales.
func (m MatrixRef) scaledAlone(d safetensors.DType) (weightfmt.Scale, bool) {
	f, ok := weightfmt.ScaledDType(d)
	if m.Scale != "" || !ok {
		return weightfmt.Scale{}, false
	}
	s, _ := f.Scale()
	return s, true
}

func (m MatrixRef) String() string {
	s := m.Name
	if m.Index >= 0 {
		s = fmt.Sprintf("%s[%d]", m.Name, m.Index)
	}
	if m.SliceRows != 0 && m.SliceRows != m.Rows {
		s += fmt.Sprintf(" rows %d..%d", m.RowStart, m.RowStart+m.Rows)
	}
	return s
}

// lookup finds a tensor and checks it is [rows,cols] or [N,rows,cols] with
// index < N, returning it and the element offset of slice index.
func lookup(src TensorSource, name string, index, rows, cols int) (*checkpoint.Tensor, int64, error) {
	t, ok := src.Tensor(name)
	if !ok {
		return nil, 0, fmt.Errorf("tensor %s is missing", name)
	}
	sh := t.Shape
	switch {
	case index < 0 && len(sh) == 2 && sh[0] == int64(rows) && sh[1] == int64(cols):
		return t, 0, nil
	case index >= 0 && len(sh) == 3 && sh[1] == int64(rows) && sh[2] == int64(cols) && int64(index) < sh[0]:
		n := int64(rows) * int64(cols)
		if n != 0 && int64(index) > math.MaxInt64/n {
			return nil, 0, fmt.Errorf("%s: tensor %s: slice %d overflows", t.File, name, index)
		}
		return t, int64(index) * n, nil
	}
	want := fmt.Sprintf("[%d,%d]", rows, cols)
	if index >= 0 {
		want = fmt.Sprintf("[N>%d,%d,%d]", index, rows, cols)
	}
	return nil, 0, fmt.Errorf("%s: tensor %s has shape %v, want %s", t.File, name, sh, want)
}

// readElems reads n elements of t starting at element off, checked for
// NaN and Inf, into a pool buffer.
func ReadElems(t *checkpoint.Tensor, off, n int64) ([]byte, error) {
	if err := elemRange(t, off, n); err != nil {
		return nil, err
	}
	buf := getBytes(int(n * int64(t.DType.Size())))
	if err := readInto(t, buf, off); err != nil {
		putBytes(buf)
		return nil, err
	}
	if err := tensorbytes.CheckFinite(t.File, t.Name, t.DType, buf, off); err != nil {
		putBytes(buf)
		return nil, err
	}
	return buf, nil
}

// readRaw reads n elements of t starting at element off, unchecked: lent
// by a streamed pass where it holds them (no copy), else into a pool
// buffer. done hands them back.
func readRaw(t *checkpoint.Tensor, off, n int64) (b []byte, done func(), err error) {
	if err := elemRange(t, off, n); err != nil {
		return nil, nil, err
	}
	size := int64(t.DType.Size())
	if b, done, ok := tensorbytes.Lend(t, off*size, n*size); ok {
		return b, done, nil
	}
	buf := getBytes(int(n * size))
	if err := readInto(t, buf, off); err != nil {
		putBytes(buf)
		return nil, nil, err
	}
	return buf, func() { putBytes(buf) }, nil
}

// elemRange checks that elements [off, off+n) are within t.
func elemRange(t *checkpoint.Tensor, off, n int64) error {
	size := int64(t.DType.Size())
	if size == 0 {
		return fmt.Errorf("%s: tensor %s has unknown dtype %s", t.File, t.Name, t.DType)
	}
	if off < 0 || n < 0 || off > t.NumElements() || n > t.NumElements()-off || n > math.MaxInt/size {
		return fmt.Errorf("%s: tensor %s: elements [%d,+%d) out of range", t.File, t.Name, off, n)
	}
	return nil
}

// readInto fills buf with t's elements from element off.
func readInto(t *checkpoint.Tensor, buf []byte, off int64) error {
	got, err := t.Data.ReadAt(buf, off*int64(t.DType.Size()))
	if got == len(buf) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%s: reading tensor %s: %w", t.File, t.Name, err)
}

// readChecked is readRaw, then the NaN and Inf scan.
func readChecked(t *checkpoint.Tensor, off, n int64) ([]byte, func(), error) {
	b, done, err := readRaw(t, off, n)
	if err != nil {
		return nil, nil, err
	}
	if err := tensorbytes.CheckFinite(t.File, t.Name, t.DType, b, off); err != nil {
		done()
		return nil, nil, err
	}
	return b, done, nil
}

// LoadMatrix reads one weight and dequantises it to float32 as its format
// says, into a pool buffer (PutFloats hands it back).
func LoadMatrix(src TensorSource, m MatrixRef) ([]float32, error) {
	w, err := readWeight(src, m)
	if err != nil {
		return nil, err
	}
	defer w.Release()
	out := getFloats(m.Rows * m.Cols)
	if err := w.Rows(0, m.Rows, out); err != nil {
		PutFloats(out)
		return nil, err
	}
	return out, nil
}

// readWeight reads and checks the stored bytes of m's weight: its
// elements, scale grid and global scale, ready to decode by bands.
func readWeight(src TensorSource, m MatrixRef) (*Bands, error) {
	sliceRows := m.SliceRows
	if sliceRows == 0 {
		sliceRows = m.Rows
	}
	if m.Rows < 0 || m.Cols < 0 || m.RowStart < 0 || m.RowStart+m.Rows > sliceRows {
		return nil, fmt.Errorf("tensor %s: rows %d..%d of a %d-row slice", m.Name, m.RowStart, m.RowStart+m.Rows, sliceRows)
	}
	wcols := m.Cols // stored columns: fewer where elements pack (INT4: eight to an I32)
	if m.Scale != "" && m.Format != nil {
		if elems, _ := m.Format.Packing(); elems > 1 {
			wcols = int(weightfmt.Matrix{Format: m.Format, Rows: 1, Cols: int64(m.Cols)}.Shape()[1])
		}
	}
	t, off, err := m.lookup(src, m.Name, int64(sliceRows), int64(wcols))
	if err != nil {
		return nil, err
	}
	f, err := m.format(t.DType)
	if err != nil {
		return nil, err
	}
	slice := weightfmt.Matrix{Format: f, Rows: int64(sliceRows), Cols: int64(m.Cols)}
	piece := weightfmt.Matrix{Format: f, Rows: int64(m.Rows), Cols: int64(m.Cols)}
	rows := slice.RowBlock(int64(m.RowStart), int64(m.Rows))
	es := int64(max(t.DType.Size(), 1)) // ReadElems refuses a dtype of no size
	var in decodeInputs
	defer in.release() // what weight did not take: on an error
	var lazy *lazyRows
	var done func()
	// A weight computed from another (a requantised shared expert) small
	// enough for the requantiser's cache to keep while the paths read it
	// (computedByBands) is read a band at a time: its bands come from that
	// cache, which already holds them, so a copy of the whole would hold
	// its bytes twice (24 MB at Kimi-K2's size). A larger one is read
	// whole, once: read by bands, the paths' workers, each a pass over
	// it, could outrun the cache and quantise its bands again.
	computed := strings.HasPrefix(t.Name, checkpoint.RequantisedPrefix) && rows.Weight.Size() <= computedByBands()
	if first := off + rows.Weight.Off/es; (rows.Weight.Size() >= LazyBytes || computed) && !m.InOut && t.DType.Size() > 0 {
		// Read a band at a time (Bands.Rows), checked as each is read.
		if err := elemRange(t, first, rows.Weight.Size()/es); err != nil {
			return nil, err
		}
		lazy = &lazyRows{t: t, off: first}
	} else {
		raw, d, err := m.read(t, first, rows.Weight.Size()/es, int64(sliceRows), int64(wcols), int64(m.RowStart), int64(m.Rows))
		if err != nil {
			return nil, err
		}
		in = decodeInputs{raw: raw, done: []func(){d}}
	}
	sc, scaled := f.Scale()
	switch {
	case scaled && t.DType != f.DType():
		return nil, fmt.Errorf("%s: tensor %s is %s but has a block scale %s (expected %s)", t.File, m, t.DType, m.Scale, f.DType())
	case !scaled:
		if alone, ok := m.scaledAlone(t.DType); ok {
			return nil, fmt.Errorf("%s: tensor %s is %s without a %s", t.File, m, t.DType, alone.Name("weight"))
		}
		if !Decodable(t.DType) {
			return nil, fmt.Errorf("%s: tensor %s: dtype %s is not a floating-point type validate can read", t.File, m, t.DType)
		}
		return in.weight(f, t, m, lazy), nil
	}
	if !slice.RowSplitExact(int64(m.RowStart)) && m.ScaleRowStart == 0 {
		return nil, fmt.Errorf("tensor %s: rows from %d do not start a %d-row scale block", m, m.RowStart, sc.Block[0])
	}
	// The piece's own grid, in the slice's grid of ScaleSliceRows rows
	// (two stacked grids for a gate-up slice) from ScaleRowStart.
	sr, scols := piece.ScaleShape()
	ssr, _ := slice.ScaleShape()
	if m.ScaleSliceRows != 0 {
		ssr = int64(m.ScaleSliceRows)
	}
	srs, _ := slice.ScaleRows(int64(m.RowStart), int64(m.Rows))
	if m.ScaleRowStart != 0 {
		srs = int64(m.ScaleRowStart)
	}
	if srs+sr > ssr {
		return nil, fmt.Errorf("tensor %s: scale rows %d..%d of %d", m, srs, srs+sr, ssr)
	}
	st, soff, err := m.lookup(src, m.Scale, ssr, scols)
	if err != nil {
		return nil, err
	}
	if st.DType != sc.DType {
		return nil, fmt.Errorf("%s: scale %s is %s, want %s", st.File, m.Scale, st.DType, sc.DType)
	}
	if in.scale, done, err = m.read(st, soff+srs*scols, sr*scols, ssr, scols, srs, sr); err != nil {
		return nil, err
	}
	in.done = append(in.done, done)
	if g, ok := weightfmt.GlobalOf(f); ok {
		gt, ok := src.Tensor(m.Global)
		if m.Global == "" || !ok {
			return nil, fmt.Errorf("tensor %s: its %s global scale tensor %q is missing", m, f, m.Global)
		}
		if gt.DType != g.DType {
			return nil, fmt.Errorf("%s: global scale %s is %s, want %s", gt.File, m.Global, gt.DType, g.DType)
		}
		if in.global, done, err = readChecked(gt, int64(m.GlobalIndex), 1); err != nil {
			return nil, err
		}
		in.done = append(in.done, done)
	}
	return in.weight(f, t, m, lazy), nil
}

// weight hands the inputs over to a Bands of m's [Rows, Cols] in format f
// (its elements read a band at a time from lazy, where set).
func (in *decodeInputs) weight(f weightfmt.Format, t *checkpoint.Tensor, m MatrixRef, lazy *lazyRows) *Bands {
	w := &Bands{in: *in, f: f, rows: m.Rows, cols: m.Cols, where: fmt.Sprintf("%s: tensor %s", t.File, m), lazy: lazy, folded: m.Folded}
	*in = decodeInputs{}
	return w
}

// decodeInputs are the bytes one weight decodes from: its elements, and
// its scale grid and global scale where its format has them (nil
// otherwise), and what hands each back.
type decodeInputs struct {
	raw, scale, global []byte
	done               []func()
}

// release hands the input bytes back.
func (in *decodeInputs) release() {
	for _, done := range in.done {
		done()
	}
	in.done = nil
}

// lookup is the package's lookup of m's slice of [rows, cols] (out, in)
// in the tensor name, [cols, rows] where m is stored in-out.
func (m MatrixRef) lookup(src TensorSource, name string, rows, cols int64) (*checkpoint.Tensor, int64, error) {
	if m.InOut {
		rows, cols = cols, rows
	}
	return lookup(src, name, m.Index, int(rows), int(cols))
}

// read is readChecked of n elements from element off of t:
// rows [r0, r0+nr) of a slice of [rows, cols] at element off - r0*cols.
// Stored in-out, the slice at that element is [cols, rows]: it is read
// whole (lent by a streamed pass where one holds it, as any read) and its
// columns [r0, r0+nr) transposed back to [nr, cols] into a pool buffer.
// done hands the bytes back.
func (m MatrixRef) read(t *checkpoint.Tensor, off, n, rows, cols, r0, nr int64) ([]byte, func(), error) {
	if !m.InOut {
		return readChecked(t, off, n)
	}
	whole, done, err := readChecked(t, off-r0*cols, rows*cols)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	es := int64(t.DType.Size())
	out := getBytes(int(nr * cols * es))
	for r := range nr {
		for c := range cols {
			copy(out[(r*cols+c)*es:(r*cols+c+1)*es], whole[(c*rows+r0+r)*es:])
		}
	}
	return out, func() { putBytes(out) }, nil
}

// LoadRow reads row index of a [N, n] tensor of floats (a stacked bias).
func LoadRow(src TensorSource, name string, index, n int) ([]float32, error) {
	t, ok := src.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("tensor %s is missing", name)
	}
	if len(t.Shape) != 2 || t.Shape[1] != int64(n) || index < 0 || int64(index) >= t.Shape[0] {
		return nil, fmt.Errorf("%s: tensor %s has shape %v, want [N>%d,%d]", t.File, name, t.Shape, index, n)
	}
	return decodeElems(t, int64(index)*int64(n), n)
}

// loadVector reads a 1-D (or [1,n], or [n,1]: a bias cut from a stack by a
// view) tensor of n floats.
func LoadVector(src TensorSource, name string, n int) ([]float32, error) {
	t, ok := src.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("tensor %s is missing", name)
	}
	if t.NumElements() != int64(n) || len(t.Shape) == 0 || len(t.Shape) > 2 || (len(t.Shape) == 2 && t.Shape[0] != 1 && t.Shape[1] != 1) {
		return nil, fmt.Errorf("%s: tensor %s has shape %v, want [%d]", t.File, name, t.Shape, n)
	}
	return decodeElems(t, 0, n)
}

// decodeElems reads n elements of t from element off as float32.
func decodeElems(t *checkpoint.Tensor, off int64, n int) ([]float32, error) {
	raw, err := ReadElems(t, off, int64(n))
	if err != nil {
		return nil, err
	}
	out := make([]float32, n)
	if err := Decode(t.DType, raw, out); err != nil {
		return nil, fmt.Errorf("%s: tensor %s: %w", t.File, t.Name, err)
	}
	return out, nil
}
