package byteproof

import (
	"fmt"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/validate/tensorbytes"
)

// The prediction of an in-out stack (contract orientation "in-out"): each
// expert's slice is the transpose of its source matrix, the [out, in]
// weight or scale grid SRC holds, so slice row c is the matrix's column c;
// a gate-up slice's row is the gate's column c, then the up's. A Llama 4
// or gpt-oss expert, which SRC stores transposed already, is predicted from
// its stored rows (checkpoint.Untransposed). The bytes are assembled here
// element by element from what SRC holds, a band of slice rows at a time,
// independent of convert's tiled transpose.

// ioBand bounds the SRC bytes one band of slice rows reads (at least one
// row): an expert matrix of up to this size is read in one piece.
const ioBand = 16 << 20

// ioSrc is one matrix whose transpose (or, stored in-out, whose rows)
// makes up a piece of every slice row: [rows, cols] elements of es bytes,
// its row r at byte ranges[r] of t (ranges[0] holding every row, one after
// the other, when there is one range).
type ioSrc struct {
	t          *checkpoint.Tensor
	ranges     [][2]int64
	rows, cols int64
	es         int64
	stored     bool // t holds the slice's rows as they are (in-out already)
}

// rowAt is the byte offset of row r in t.
func (s ioSrc) rowAt(r int64) int64 {
	if len(s.ranges) == 1 {
		return s.ranges[0][0] + r*s.cols*s.es
	}
	return s.ranges[r][0]
}

// width is the elements s puts in each slice row.
func (s ioSrc) width() int64 {
	if s.stored {
		return s.cols
	}
	return s.rows
}

// ioSeg is one in-out slice: rows of its sources' pieces side by side.
type ioSeg struct {
	srcs     []ioSrc
	rows     int64
	rowBytes int64
}

func newIOSeg(srcs ...ioSrc) (*ioSeg, error) {
	g := &ioSeg{srcs: srcs}
	for i, s := range srcs {
		rows := s.cols
		if s.stored {
			rows = s.rows
		}
		if i == 0 {
			g.rows = rows
		}
		if rows != g.rows || len(s.ranges) != 1 && int64(len(s.ranges)) != s.rows {
			return nil, fmt.Errorf("tensor %s: a %dx%d matrix in %d pieces does not make %d slice rows", s.t.Name, s.rows, s.cols, len(s.ranges), g.rows)
		}
		g.rowBytes += s.width() * s.es
	}
	return g, nil
}

func (g *ioSeg) size() int64 { return g.rows * g.rowBytes }

// bandRows is the slice rows one band holds.
func (g *ioSeg) bandRows() int64 { return max(1, ioBand/g.rowBytes) }

// band returns slice rows [j0, j1) as bytes, into buf (grown as needed),
// reading SRC through tmp.
func (g *ioSeg) band(j0, j1 int64, buf, tmp []byte) ([]byte, []byte, error) {
	out := grow(buf, (j1-j0)*g.rowBytes)
	at := int64(0) // the piece's byte within a slice row
	for _, s := range g.srcs {
		w := s.width() * s.es
		if s.stored { // slice row j is row j of s
			for j := j0; j < j1; j++ {
				if err := tensorbytes.ReadAt(s.t, out[(j-j0)*g.rowBytes+at:(j-j0)*g.rowBytes+at+w], s.rowAt(j)); err != nil {
					return nil, nil, err
				}
			}
			at += w
			continue
		}
		// slice row j is column j of s: read columns [j0, j1) of every row
		cw := (j1 - j0) * s.es
		tmp = grow(tmp, s.rows*cw)
		for r := range s.rows {
			if err := tensorbytes.ReadAt(s.t, tmp[r*cw:(r+1)*cw], s.rowAt(r)+j0*s.es); err != nil {
				return nil, nil, err
			}
		}
		for j := j0; j < j1; j++ {
			for r := range s.rows {
				d := (j-j0)*g.rowBytes + at + r*s.es
				copy(out[d:d+s.es], tmp[r*cw+(j-j0)*s.es:])
			}
		}
		at += w
	}
	return out, tmp, nil
}

func grow(b []byte, n int64) []byte {
	if int64(cap(b)) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// ioReader reads an in-out slice's predicted bytes in order, a band at a
// time.
type ioReader struct {
	g        *ioSeg
	pos      int64
	band     []byte
	j0       int64 // the band's first slice row; -1: none
	buf, tmp []byte
}

func (r *ioReader) read(p []byte) (int, error) {
	n := 0
	for n < len(p) && r.pos < r.g.size() {
		j := r.pos / r.g.rowBytes
		if r.band == nil || j < r.j0 || j >= r.j0+int64(len(r.band))/r.g.rowBytes {
			j0 := j / r.g.bandRows() * r.g.bandRows()
			var err error
			if r.band, r.tmp, err = r.g.band(j0, min(r.g.rows, j0+r.g.bandRows()), r.buf, r.tmp); err != nil {
				return n, err
			}
			r.buf, r.j0 = r.band, j0
		}
		m := copy(p[n:], r.band[r.pos-r.j0*r.g.rowBytes:])
		n += m
		r.pos += int64(m)
	}
	return n, nil
}
