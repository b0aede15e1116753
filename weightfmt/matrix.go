package weightfmt

// Matrix is one weight of Rows x Cols elements stored in Format: a 2-D
// tensor, or one expert's slice of a stack [N, ...] of them (whose scale
// tensor is then the stack [N, ...] of the slices' grids).
type Matrix struct {
	Format     Format
	Rows, Cols int64
}

// Region is a strided run of bytes of a tensor: Rows runs of RowLen bytes,
// the first at byte Off, each next one Stride bytes further. A block of
// whole rows is one run (Rows 1); a block of columns has a run per row.
type Region struct {
	Off, Rows, RowLen, Stride int64
}

// Size is the region's byte count.
func (r Region) Size() int64 { return r.Rows * r.RowLen }

// Ranges are the region's bytes as [begin, end) ranges in order: one when
// the runs touch, one per run otherwise.
func (r Region) Ranges() [][2]int64 {
	if r.Rows == 1 || r.Stride == r.RowLen {
		return [][2]int64{{r.Off, r.Off + r.Size()}}
	}
	out := make([][2]int64, 0, max(r.Rows, 0))
	for i := int64(0); i < r.Rows; i++ {
		b := r.Off + i*r.Stride
		out = append(out, [2]int64{b, b + r.RowLen})
	}
	return out
}

// Slice is a piece of a weight: its bytes in the weight tensor and the
// bytes of the scale entries that cover it in the scale tensor (zero when
// the format has no scale), and of its global scale in the global scale
// tensor (zero when the format has none; every piece of a weight has the
// weight's one global scale).
type Slice struct {
	Weight, Scale, Global Region
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a-1)/b + 1 // not (a+b-1)/b: no overflow for any b
}

// RowBytes is the bytes of one stored row.
func (m Matrix) RowBytes() int64 {
	e, b := m.Format.Packing()
	return ceilDiv(m.Cols, e) * b
}

// Bytes is the weight's size in bytes.
func (m Matrix) Bytes() int64 { return m.Rows * m.RowBytes() }

// Shape is the weight tensor's shape as stored: [Rows, stored columns in
// units of the dtype] ([Rows, Cols] when each element is one value).
func (m Matrix) Shape() []int64 {
	return []int64{m.Rows, m.RowBytes() / int64(max(m.Format.DType().Size(), 1))}
}

// gridLen is the number of scale entries along an axis of n elements
// split in blocks of b (0: the whole axis).
func gridLen(n, b int64) int64 {
	if b == 0 {
		return 1
	}
	return ceilDiv(n, b)
}

// ScaleShape is the scale grid [rows, cols] of the weight: one entry per
// block, a partial block at the end of an axis included (ceil). 0, 0 when
// the format has no scale.
func (m Matrix) ScaleShape() (rows, cols int64) {
	s, ok := m.Format.Scale()
	if !ok {
		return 0, 0
	}
	return gridLen(m.Rows, s.Block[0]), gridLen(m.Cols, s.Block[1])
}

// ScaleBytes is the size of the weight's scale grid in bytes.
func (m Matrix) ScaleBytes() int64 {
	s, ok := m.Format.Scale()
	if !ok {
		return 0
	}
	r, c := m.ScaleShape()
	return r * c * int64(s.DType.Size())
}

// GlobalBytes is the size of the weight's global scale in bytes (0 when
// the format has none).
func (m Matrix) GlobalBytes() int64 {
	if g, ok := GlobalOf(m.Format); ok {
		return int64(g.DType.Size())
	}
	return 0
}

// global is the region of the weight's global scale, at off in its tensor
// (zero when the format has none).
func (m Matrix) global(off int64) Region {
	if g := m.GlobalBytes(); g > 0 {
		return Region{Off: off, Rows: 1, RowLen: g, Stride: g}
	}
	return Region{}
}

// scaleSpan is the grid entries [first, first+n) along an axis whose
// blocks are b elements (0: the whole axis) that cover elements [e0, e0+ne).
func scaleSpan(e0, ne, b int64) (first, n int64) {
	if b == 0 {
		return 0, 1
	}
	first = e0 / b
	return first, ceilDiv(e0+ne, b) - first
}

// ScaleRows is the grid rows [first, first+n) that scale weight rows
// [r0, r0+nr); 0, 0 when the format has no scale.
func (m Matrix) ScaleRows(r0, nr int64) (first, n int64) {
	s, ok := m.Format.Scale()
	if !ok {
		return 0, 0
	}
	return scaleSpan(r0, nr, s.Block[0])
}

// ScaleCols is the grid columns [first, first+n) that scale weight columns
// [c0, c0+nc); 0, 0 when the format has no scale.
func (m Matrix) ScaleCols(c0, nc int64) (first, n int64) {
	s, ok := m.Format.Scale()
	if !ok {
		return 0, 0
	}
	return scaleSpan(c0, nc, s.Block[1])
}

// scaleEntry is the byte size of one scale entry (0 without a scale).
func (m Matrix) scaleEntry() int64 {
	s, ok := m.Format.Scale()
	if !ok {
		return 0
	}
	return int64(s.DType.Size())
}

func whole(n int64) Region { return Region{Rows: 1, RowLen: n, Stride: n} }

// Whole is the whole weight, its whole grid and its global scale.
func (m Matrix) Whole() Slice {
	return Slice{Weight: whole(m.Bytes()), Scale: whole(m.ScaleBytes()), Global: m.global(0)}
}

// Expert is slice e of a stack [N, Rows, Cols] of such weights, with its
// grid in the stack of grids and its global scale in the stack [N] of
// global scales.
func (m Matrix) Expert(e int64) Slice {
	w, s := m.Bytes(), m.ScaleBytes()
	return Slice{
		Weight: Region{Off: e * w, Rows: 1, RowLen: w, Stride: w},
		Scale:  Region{Off: e * s, Rows: 1, RowLen: s, Stride: s},
		Global: m.global(e * m.GlobalBytes()),
	}
}

// RowBlock is rows [r0, r0+n) with the grid rows that scale them. Its
// scale entries are its own only where RowSplitExact holds at r0 and r0+n.
func (m Matrix) RowBlock(r0, n int64) Slice {
	rb := m.RowBytes()
	out := Slice{Weight: Region{Off: r0 * rb, Rows: 1, RowLen: n * rb, Stride: n * rb}, Global: m.global(0)}
	if es := m.scaleEntry(); es > 0 {
		_, gc := m.ScaleShape()
		g0, gn := m.ScaleRows(r0, n)
		out.Scale = Region{Off: g0 * gc * es, Rows: 1, RowLen: gn * gc * es, Stride: gn * gc * es}
	}
	return out
}

// ColBlock is columns [c0, c0+n) of every row with the grid columns that
// scale them. c0 and n must be whole packing units (ColSplitExact); the
// scale entries are its own only where ColSplitExact holds at both ends.
func (m Matrix) ColBlock(c0, n int64) Slice {
	e, b := m.Format.Packing()
	out := Slice{Weight: Region{Off: c0 / e * b, Rows: m.Rows, RowLen: ceilDiv(n, e) * b, Stride: m.RowBytes()}, Global: m.global(0)}
	if es := m.scaleEntry(); es > 0 {
		gr, gc := m.ScaleShape()
		g0, gn := m.ScaleCols(c0, n)
		out.Scale = Region{Off: g0 * es, Rows: gr, RowLen: gn * es, Stride: gc * es}
	}
	return out
}

// RowSplitExact reports whether cutting the weight before row r gives two
// weights that each own whole scale entries: r falls on a block edge (or
// the scale spans every row, and each piece keeps a copy). A global scale
// never stands in the way: each piece keeps a copy. (Joining two weights
// into one, as a gate|up stack does, is exact only where their global
// scales are equal: that is the joiner's to check.)
func (m Matrix) RowSplitExact(r int64) bool {
	s, ok := m.Format.Scale()
	return !ok || s.Block[0] == 0 || r%s.Block[0] == 0
}

// ColSplitExact reports whether cutting every row before column c gives two
// weights of whole stored bytes and whole scale entries.
func (m Matrix) ColSplitExact(c int64) bool {
	if e, _ := m.Format.Packing(); c%e != 0 {
		return false
	}
	s, ok := m.Format.Scale()
	return !ok || s.Block[1] == 0 || c%s.Block[1] == 0
}
