package convert

import (
	"fmt"
	"io"
)

// region is rows of rowLen bytes of a source tensor, the first at byte off and
// each next one stride bytes further: a whole tensor (rows 1), a block of rows
// of a row-major matrix (rows 1, contiguous), or a block of columns (rows =
// matrix rows, stride = the matrix's row length in bytes).
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

// open returns a reader over the region's bytes, row after row. Nothing is
// buffered here: the caller's buffer (the writer's bounded copy buffer) is
// filled directly by ReadAt.
func (r region) open() io.Reader {
	var rd io.Reader
	if r.rows == 1 || r.stride == r.rowLen {
		rd = io.NewSectionReader(r.src, r.off, r.size())
	} else {
		rd = &stridedReader{r: r}
	}
	return &namedReader{r: rd, file: r.file, tensor: r.tensor, left: r.size()}
}

// stridedReader reads a block of columns row by row.
type stridedReader struct {
	r        region
	row, col int64
}

func (s *stridedReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && s.row < s.r.rows {
		want := min(int64(len(p)-n), s.r.rowLen-s.col)
		m, err := s.r.src.ReadAt(p[n:n+int(want)], s.r.off+s.row*s.r.stride+s.col)
		n += m
		s.col += int64(m)
		if s.col == s.r.rowLen {
			s.row, s.col = s.row+1, 0
		}
		if err != nil && int64(m) != want {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return n, err
		}
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

// namedReader names the source file and tensor in read errors, and turns a
// short source into an error rather than a silently short output.
type namedReader struct {
	r            io.Reader
	file, tensor string
	left         int64
}

func (n *namedReader) Read(p []byte) (int, error) {
	c, err := n.r.Read(p)
	n.left -= int64(c)
	if err == io.EOF && n.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err != nil && err != io.EOF {
		err = fmt.Errorf("%s: reading tensor %s: %w", n.file, n.tensor, err)
	}
	return c, err
}

// multiReader concatenates regions lazily: only the current region's reader
// exists at any time.
type multiReader struct {
	parts []part
	cur   io.Reader
	i     int
}

func (m *multiReader) Read(p []byte) (int, error) {
	for {
		if m.cur == nil {
			if m.i >= len(m.parts) {
				return 0, io.EOF
			}
			m.cur = m.parts[m.i].open()
			m.i++
		}
		n, err := m.cur.Read(p)
		if err == io.EOF {
			m.cur = nil
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
}
