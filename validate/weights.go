package validate

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/safetensors"
)

// TensorSource finds a checkpoint's tensors by name; *checkpoint.Checkpoint
// satisfies it, and tests use in-memory tensors.
type TensorSource interface {
	Tensor(name string) (*checkpoint.Tensor, bool)
}

// matrixRef locates one 2-D weight of Rows x Cols: a whole tensor
// (Index < 0) or slice Index of a stack [N,...], optionally the rows
// [RowStart, RowStart+Rows) of a taller slice of SliceRows rows (a gate-up
// tensor's gate or up half). Scale names the F32 weight_scale_inv of an
// F8_E4M3 weight and must be set exactly when the weight is FP8; its slice
// has ScaleSliceRows block rows (0: ceil(SliceRows/BlockRows)) of which the
// matrix uses ceil(Rows/BlockRows) from ScaleRowStart.
type matrixRef struct {
	Name           string
	Index          int
	Rows, Cols     int
	SliceRows      int // 0: Rows
	RowStart       int
	Scale          string
	ScaleSliceRows int
	ScaleRowStart  int
	BlockRows      int // FP8 block, FP8Block when 0
	BlockCols      int
}

func (m matrixRef) String() string {
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

// readElems reads n elements of t starting at element off.
func readElems(t *checkpoint.Tensor, off, n int64) ([]byte, error) {
	size := int64(t.DType.Size())
	if size == 0 {
		return nil, fmt.Errorf("%s: tensor %s has unknown dtype %s", t.File, t.Name, t.DType)
	}
	if off < 0 || n < 0 || off > t.NumElements() || n > t.NumElements()-off || n > math.MaxInt/size {
		return nil, fmt.Errorf("%s: tensor %s: elements [%d,+%d) out of range", t.File, t.Name, off, n)
	}
	buf := getBytes(int(n * size))
	got, err := t.Data.ReadAt(buf, off*size)
	if got == len(buf) {
		if err := checkFinite(t.File, t.Name, t.DType, buf, off); err != nil {
			putBytes(buf)
			return nil, err
		}
		return buf, nil
	}
	putBytes(buf)
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return nil, fmt.Errorf("%s: reading tensor %s: %w", t.File, t.Name, err)
}

// loadMatrix reads, decodes and (for FP8) dequantises one weight to float32.
func loadMatrix(src TensorSource, m matrixRef) ([]float32, error) {
	sliceRows := m.SliceRows
	if sliceRows == 0 {
		sliceRows = m.Rows
	}
	if m.Rows < 0 || m.Cols < 0 || m.RowStart < 0 || m.RowStart+m.Rows > sliceRows {
		return nil, fmt.Errorf("tensor %s: rows %d..%d of a %d-row slice", m.Name, m.RowStart, m.RowStart+m.Rows, sliceRows)
	}
	t, off, err := lookup(src, m.Name, m.Index, sliceRows, m.Cols)
	if err != nil {
		return nil, err
	}
	n := int64(m.Rows) * int64(m.Cols)
	raw, err := readElems(t, off+int64(m.RowStart)*int64(m.Cols), n)
	if err != nil {
		return nil, err
	}
	defer putBytes(raw)
	// The result comes from the pool: callers hand it back with putFloats
	// once done, or let the garbage collector have it.
	out := getFloats(int(n))
	if t.DType != safetensors.F8E4M3 {
		if m.Scale != "" {
			return nil, fmt.Errorf("%s: tensor %s is %s but has a block scale %s (expected F8_E4M3)", t.File, m, t.DType, m.Scale)
		}
		if err := Decode(t.DType, raw, out); err != nil {
			return nil, fmt.Errorf("%s: tensor %s: %w", t.File, m, err)
		}
		return out, nil
	}
	if m.Scale == "" {
		return nil, fmt.Errorf("%s: tensor %s is F8_E4M3 without a weight_scale_inv", t.File, m)
	}
	bo, bi := m.BlockRows, m.BlockCols
	if bo == 0 {
		bo = FP8Block
	}
	if bi == 0 {
		bi = FP8Block
	}
	if m.RowStart%bo != 0 && m.ScaleRowStart == 0 {
		return nil, fmt.Errorf("tensor %s: rows from %d do not start a %d-row scale block", m, m.RowStart, bo)
	}
	sr, sc := ScaleDims(m.Rows, m.Cols, bo, bi)
	ssr, _ := ScaleDims(sliceRows, m.Cols, bo, bi)
	if m.ScaleSliceRows != 0 {
		ssr = m.ScaleSliceRows
	}
	srs := m.ScaleRowStart
	if srs == 0 {
		srs = m.RowStart / bo
	}
	if srs+sr > ssr {
		return nil, fmt.Errorf("tensor %s: scale rows %d..%d of %d", m, srs, srs+sr, ssr)
	}
	st, soff, err := lookup(src, m.Scale, m.Index, ssr, sc)
	if err != nil {
		return nil, err
	}
	if st.DType != safetensors.F32 {
		return nil, fmt.Errorf("%s: scale %s is %s, want F32", st.File, m.Scale, st.DType)
	}
	sraw, err := readElems(st, soff+int64(srs)*int64(sc), int64(sr*sc))
	if err != nil {
		return nil, err
	}
	scale := make([]float32, sr*sc)
	if err := Decode(st.DType, sraw, scale); err != nil {
		return nil, err
	}
	if err := DequantFP8(raw, m.Rows, m.Cols, scale, bo, bi, out); err != nil {
		return nil, fmt.Errorf("%s: tensor %s: %w", t.File, m, err)
	}
	return out, nil
}

// loadRow reads row index of a [N, n] tensor of floats (a stacked bias).
func loadRow(src TensorSource, name string, index, n int) ([]float32, error) {
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
func loadVector(src TensorSource, name string, n int) ([]float32, error) {
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
	raw, err := readElems(t, off, int64(n))
	if err != nil {
		return nil, err
	}
	out := make([]float32, n)
	if err := Decode(t.DType, raw, out); err != nil {
		return nil, fmt.Errorf("%s: tensor %s: %w", t.File, t.Name, err)
	}
	return out, nil
}
