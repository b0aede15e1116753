package convert

import (
	"fmt"
	"io"
)

// region is rows of rowLen bytes of a source tensor, the first at byte off and
// each next one stride bytes further: a whole tensor (rows 1), a block of rows
// of a row-major matrix (rows 1, contiguous), or a block of columns (rows =
// matrix rows, stride = the matrix's row length in bytes). Its bytes form a
// stream, row after row; readAt reads any range of that stream.
type region struct {
	src    io.ReaderAt
	file   string // for errors
	tensor string
	off    int64
	rows   int64
	rowLen int64
	stride int64
}

func (r region) size() int64 { return r.rows * r.rowLen }

// contiguous reports whether the region is one run of bytes.
func (r region) contiguous() bool { return r.rows == 1 || r.stride == r.rowLen }

// readAt fills b with the region's stream from byte pos: one ReadAt when
// the region is contiguous, one per row touched otherwise. A short source
// is an error naming the file and tensor.
func (r region) readAt(b []byte, pos int64) error {
	if r.contiguous() {
		return r.readFull(b, r.off+pos)
	}
	for len(b) > 0 {
		row, col := pos/r.rowLen, pos%r.rowLen
		n := min(int64(len(b)), r.rowLen-col)
		if err := r.readFull(b[:n], r.off+row*r.stride+col); err != nil {
			return err
		}
		b, pos = b[n:], pos+n
	}
	return nil
}

// readFull is ReadAt that names the file and tensor and calls a short source
// an error.
func (r region) readFull(b []byte, off int64) error {
	n, err := r.src.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%s: reading tensor %s: %w", r.file, r.tensor, err)
}

// sourceOffset is where byte pos of the region's stream lives in its source
// (in the outermost file when the source is a section of one), for ordering.
func (r region) sourceOffset(pos int64) int64 {
	if t, ok := r.src.(*tiled); ok {
		return t.sourceOffset(r.off + pos)
	}
	off := r.off + pos
	if !r.contiguous() {
		off = r.off + pos/r.rowLen*r.stride + pos%r.rowLen
	}
	return baseOffset(r.src) + off
}

// section is a reader of a section of another: *io.SectionReader, and a
// view's source, the tensor it is cut from (checkpoint's views).
type section interface {
	Outer() (io.ReaderAt, int64, int64)
}

// outermost unwraps nested section readers.
func outermost(r io.ReaderAt) io.ReaderAt {
	for range 16 {
		s, ok := r.(section)
		if !ok {
			break
		}
		r, _, _ = s.Outer()
	}
	return r
}

// baseOffset unwraps nested section readers and returns the offset of the
// reader's byte 0 in the outermost one.
func baseOffset(r io.ReaderAt) int64 {
	base := int64(0)
	for range 16 {
		s, ok := r.(section)
		if !ok {
			break
		}
		outer, off, _ := s.Outer()
		base += off
		r = outer
	}
	return base
}
