package convert

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"

	"github.com/moeprep/moeprep/internal/cores"
)

// --orientation in-out writes every expert matrix transposed, [in, out]:
// a tiled part's bytes are output rows, each the side-by-side pieces of its
// sources (a transposed expert's column, or a row of a matrix already
// stored in-out), e.g. row h of an in-out gate_up_proj is column h of gate
// then column h of up. The part is read through its shard's band cache:
// a band of output rows needs, of a transposed source, a strip of its
// columns from every row: the whole matrix in one sequential read where it
// fits in bandMax (a DeepSeek-V3 expert does), strips of columns otherwise.
// The bytes of the band are transposed into the output block by block, so
// memory is one band per shard being written, whatever the model's size.

// bandMax bounds a band's bytes (a variable: tests shrink it so that the
// fixtures' experts span several bands).
var bandMax int64 = 16 << 20

// tileSrc is one source of a tiled part: a [rows, cols] matrix of es-byte
// elements whose row r is cols*es bytes at off + r*stride of src.
type tileSrc struct {
	src          io.ReaderAt
	file, tensor string // for errors
	off, stride  int64
	rows, cols   int64
	// trans: output row j holds the matrix's column j (rows elements);
	// otherwise its row j (cols elements).
	trans bool
}

// width is the elements the source gives each output row.
func (s *tileSrc) width() int64 {
	if s.trans {
		return s.rows
	}
	return s.cols
}

// outRows is the output rows the source spans.
func (s *tileSrc) outRows() int64 {
	if s.trans {
		return s.cols
	}
	return s.rows
}

// tiled is the stream of a part whose output rows are its sources' pieces
// side by side; it is the part's io.ReaderAt.
type tiled struct {
	srcs     []tileSrc
	es       int64
	rows     int64 // output rows
	rowBytes int64
	cache    *bandCache // the shard's; set when shards are planned
}

// newTiled checks that the sources agree on the output rows and dtype size.
func newTiled(es int64, srcs ...tileSrc) (*tiled, error) {
	t := &tiled{srcs: srcs, es: es}
	for i := range srcs {
		s := &srcs[i]
		if i == 0 {
			t.rows = s.outRows()
		}
		if s.outRows() != t.rows || s.rows <= 0 || s.cols <= 0 || s.stride < s.cols*es {
			return nil, fmt.Errorf("tensor %s: a %dx%d matrix (row stride %d) cannot stand beside %d output rows", s.tensor, s.rows, s.cols, s.stride, t.rows)
		}
		t.rowBytes += s.width() * es
	}
	return t, nil
}

func (t *tiled) size() int64 { return t.rows * t.rowBytes }

// bandRows is how many output rows one band holds: what bandMax allows of
// the source bytes they need, at least one.
func (t *tiled) bandRows() int64 { return max(1, bandMax/t.rowBytes) }

// region is the tiled stream as one contiguous region, read through t.
func (t *tiled) region() region {
	n := t.size()
	return region{src: t, file: t.srcs[0].file, tensor: t.srcs[0].tensor, rows: 1, rowLen: n, stride: n}
}

// sourceOffset places byte pos of the stream within its first source's
// span, for the order chunks are read in (readers.go).
func (t *tiled) sourceOffset(pos int64) int64 {
	s := &t.srcs[0]
	span := (s.rows-1)*s.stride + s.cols*t.es
	return baseOffset(s.src) + s.off + int64(float64(pos)/float64(t.size())*float64(span))
}

// ReadAt implements io.ReaderAt.
func (t *tiled) ReadAt(b []byte, pos int64) (int, error) {
	if pos < 0 || pos+int64(len(b)) > t.size() {
		return 0, fmt.Errorf("tensor %s: bytes %d..%d of a %d-byte transposed stream", t.srcs[0].tensor, pos, pos+int64(len(b)), t.size())
	}
	c := t.cache
	if c == nil {
		c = &bandCache{}
		defer c.release()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var row []byte // one output row, for a read that starts or ends inside one
	for done := int64(0); done < int64(len(b)); {
		p := pos + done
		j, within := p/t.rowBytes, p%t.rowBytes
		j0 := j / t.bandRows() * t.bandRows()
		j1 := min(t.rows, j0+t.bandRows())
		if err := c.load(t, j0, j1); err != nil {
			return int(done), err
		}
		// whole rows [j, jb) of the band, or one row's piece
		jb := min(j1, j+(int64(len(b))-done)/t.rowBytes)
		if within == 0 && jb > j {
			c.rows(t, b[done:done+(jb-j)*t.rowBytes], j-j0, jb-j0)
			done += (jb - j) * t.rowBytes
			continue
		}
		if row == nil {
			row = make([]byte, t.rowBytes)
		}
		c.rows(t, row, j-j0, j-j0+1)
		done += int64(copy(b[done:], row[within:]))
	}
	return len(b), nil
}

// bandCache holds the source bytes of one band of one tiled part: a
// shard's parts share it, read one after the other in source order.
type bandCache struct {
	mu     sync.Mutex
	owner  *tiled
	j0, j1 int64
	bufs   [][]byte // per source: trans [rows][j1-j0], else [j1-j0][cols]
	mem    []byte
}

// load makes the cache hold output rows [j0, j1) of t.
func (c *bandCache) load(t *tiled, j0, j1 int64) error {
	if c.owner == t && c.j0 == j0 && c.j1 == j1 {
		return nil
	}
	c.owner = nil
	need := (j1 - j0) * t.rowBytes
	if int64(cap(c.mem)) < need {
		c.mem = make([]byte, need)
	}
	mem := c.mem[:need]
	c.bufs = c.bufs[:0]
	for i := range t.srcs {
		s := &t.srcs[i]
		n := (j1 - j0) * s.width() * t.es
		buf := mem[:n]
		mem = mem[n:]
		var err error
		switch {
		case s.trans && j0 == 0 && j1 == s.cols && s.stride == s.cols*t.es:
			err = readSpan(s, buf, s.off) // the whole matrix, one read
		case s.trans: // columns [j0, j1) of every row
			w := (j1 - j0) * t.es
			for r := int64(0); r < s.rows && err == nil; r++ {
				err = readSpan(s, buf[r*w:(r+1)*w], s.off+r*s.stride+j0*t.es)
			}
		case s.stride == s.cols*t.es: // rows [j0, j1), one read
			err = readSpan(s, buf, s.off+j0*s.stride)
		default:
			w := s.cols * t.es
			for r := j0; r < j1 && err == nil; r++ {
				err = readSpan(s, buf[(r-j0)*w:(r-j0+1)*w], s.off+r*s.stride)
			}
		}
		if err != nil {
			return err
		}
		c.bufs = append(c.bufs, buf)
	}
	c.owner, c.j0, c.j1 = t, j0, j1
	return nil
}

// readSpan fills b from byte at of s's source.
func readSpan(s *tileSrc, b []byte, at int64) error {
	return region{src: s.src, file: s.file, tensor: s.tensor}.readFull(b, at)
}

// rows writes output rows [a, z) of the band (relative to its first) to
// dst, each t.rowBytes long: a large run in parallel pieces, one a core
// (the transpose is most of a run's CPU time; reading and writing wait on
// the disk).
func (c *bandCache) rows(t *tiled, dst []byte, a, z int64) {
	if p := int64(cores.N()); p > 1 && (z-a)*t.rowBytes >= parallelRows {
		var wg sync.WaitGroup
		step := ((z-a+p-1)/p + 7) / 8 * 8 // whole 8-row blocks for the word kernels
		for b := a; b < z; b += step {
			e := min(z, b+step)
			wg.Go(func() { c.rowsOf(t, dst[(b-a)*t.rowBytes:(e-a)*t.rowBytes], b, e) })
		}
		wg.Wait()
		return
	}
	c.rowsOf(t, dst, a, z)
}

// parallelRows is the output a transpose splits between cores from.
const parallelRows = 1 << 20

func (c *bandCache) rowsOf(t *tiled, dst []byte, a, z int64) {
	bw := c.j1 - c.j0
	at := int64(0) // the source's piece within an output row
	for i := range t.srcs {
		s, buf := &t.srcs[i], c.bufs[i]
		w := s.width() * t.es
		if s.trans {
			transposeInto(dst[at:], t.rowBytes, buf[a*t.es:], bw*t.es, z-a, s.rows, t.es)
		} else {
			for r := a; r < z; r++ {
				copy(dst[(r-a)*t.rowBytes+at:(r-a)*t.rowBytes+at+w], buf[r*w:(r+1)*w])
			}
		}
		at += w
	}
}

func (c *bandCache) release() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.owner, c.bufs, c.mem = nil, nil, nil
	c.mu.Unlock()
}

// A transpose works in tiles of tileOut output rows by tileIn of their
// elements (source rows): measured on this machine's 2 MiB L2, with output
// that is not in the cache (as staging blocks are not), 128 x 16 moved
// 1.5 GB/s of bf16 a core and 1.9 GB/s of FP8, 32 x 32 1.05 and 1.2: a
// tile's 16 source rows, 4 KiB apart in a bf16 expert of H 2048, fit the
// ways of the one L1 set they fall in, and its 128 output rows stay in L1
// while 16 elements of each are written.
const tileOut, tileIn = 128, 16

// transposeInto writes the transpose of the [m, n] matrix of es-byte
// elements in src (row stride srcStride bytes) as n rows of m elements to
// dst (row stride dstStride): dst row a, element c = src row c, element a.
// For 1, 2 and 4-byte elements, whole 8-byte words of k = 8/es elements
// are transposed k x k in registers; the edges element by element.
func transposeInto(dst []byte, dstStride int64, src []byte, srcStride int64, n, m, es int64) {
	k := int64(1)
	switch es {
	case 1, 2, 4:
		k = 8 / es
	}
	for a0 := int64(0); a0 < n; a0 += tileOut {
		a1 := min(n, a0+tileOut)
		for c0 := int64(0); c0 < m; c0 += tileIn {
			c1 := min(m, c0+tileIn)
			ak, ck := a0, c0 // the corner [a0, ak) x [c0, ck) is done in words
			if k > 1 {
				ak, ck = a0+(a1-a0)/k*k, c0+(c1-c0)/k*k
				switch es {
				case 1:
					words1(dst, dstStride, src, srcStride, a0, ak, c0, ck)
				case 2:
					words2(dst, dstStride, src, srcStride, a0, ak, c0, ck)
				case 4:
					words4(dst, dstStride, src, srcStride, a0, ak, c0, ck)
				}
			}
			transposeEdge(dst, dstStride, src, srcStride, a0, a1, ck, c1, es)
			transposeEdge(dst, dstStride, src, srcStride, ak, a1, c0, ck, es)
		}
	}
}

// transposeEdge transposes output rows [a0, a1), elements [c0, c1), one
// element at a time.
func transposeEdge(dst []byte, dstStride int64, src []byte, srcStride int64, a0, a1, c0, c1, es int64) {
	for a := a0; a < a1; a++ {
		for c := c0; c < c1; c++ {
			copy(dst[a*dstStride+c*es:a*dstStride+(c+1)*es], src[c*srcStride+a*es:c*srcStride+(a+1)*es])
		}
	}
}

var le = binary.LittleEndian

// Masks of the zip rounds below: the low element of each pair of 1, 2
// and 4-byte units.
const zip8, zip16, zip32 = 0x00ff00ff00ff00ff, 0x0000ffff0000ffff, 0x00000000ffffffff

// The wordsN transpose output rows [a0, ak), elements [c0, ck) (whole
// k x k blocks, k = 8/N) of N-byte elements, a block at a time: its k
// source rows are loaded as words, zipped (each round pairs the low, then
// the high units of two words, doubling the unit) and stored as its k
// output rows.

func words4(dst []byte, ds int64, src []byte, ss int64, a0, ak, c0, ck int64) {
	for a := a0; a < ak; a += 2 {
		for c := c0; c < ck; c += 2 {
			s, d := c*ss+a*4, a*ds+c*4
			r0, r1 := le.Uint64(src[s:]), le.Uint64(src[s+ss:])
			le.PutUint64(dst[d:], r0&zip32|r1<<32)
			le.PutUint64(dst[d+ds:], r0>>32|r1&^zip32)
		}
	}
}

func words2(dst []byte, ds int64, src []byte, ss int64, a0, ak, c0, ck int64) {
	for a := a0; a < ak; a += 4 {
		for c := c0; c < ck; c += 4 {
			s, d := c*ss+a*2, a*ds+c*2
			r0, r1, r2, r3 := le.Uint64(src[s:]), le.Uint64(src[s+ss:]), le.Uint64(src[s+2*ss:]), le.Uint64(src[s+3*ss:])
			r0, r1 = r0&zip16|(r1&zip16)<<16, (r0>>16)&zip16|r1&^zip16
			r2, r3 = r2&zip16|(r3&zip16)<<16, (r2>>16)&zip16|r3&^zip16
			le.PutUint64(dst[d:], r0&zip32|r2<<32)
			le.PutUint64(dst[d+ds:], r1&zip32|r3<<32)
			le.PutUint64(dst[d+2*ds:], r0>>32|r2&^zip32)
			le.PutUint64(dst[d+3*ds:], r1>>32|r3&^zip32)
		}
	}
}

func words1(dst []byte, ds int64, src []byte, ss int64, a0, ak, c0, ck int64) {
	for a := a0; a < ak; a += 8 {
		for c := c0; c < ck; c += 8 {
			s, d := c*ss+a, a*ds+c
			r0, r1, r2, r3 := le.Uint64(src[s:]), le.Uint64(src[s+ss:]), le.Uint64(src[s+2*ss:]), le.Uint64(src[s+3*ss:])
			r4, r5, r6, r7 := le.Uint64(src[s+4*ss:]), le.Uint64(src[s+5*ss:]), le.Uint64(src[s+6*ss:]), le.Uint64(src[s+7*ss:])
			r0, r1 = r0&zip8|(r1&zip8)<<8, (r0>>8)&zip8|r1&^zip8
			r2, r3 = r2&zip8|(r3&zip8)<<8, (r2>>8)&zip8|r3&^zip8
			r4, r5 = r4&zip8|(r5&zip8)<<8, (r4>>8)&zip8|r5&^zip8
			r6, r7 = r6&zip8|(r7&zip8)<<8, (r6>>8)&zip8|r7&^zip8
			r0, r2 = r0&zip16|(r2&zip16)<<16, (r0>>16)&zip16|r2&^zip16
			r1, r3 = r1&zip16|(r3&zip16)<<16, (r1>>16)&zip16|r3&^zip16
			r4, r6 = r4&zip16|(r6&zip16)<<16, (r4>>16)&zip16|r6&^zip16
			r5, r7 = r5&zip16|(r7&zip16)<<16, (r5>>16)&zip16|r7&^zip16
			le.PutUint64(dst[d:], r0&zip32|r4<<32)
			le.PutUint64(dst[d+ds:], r1&zip32|r5<<32)
			le.PutUint64(dst[d+2*ds:], r2&zip32|r6<<32)
			le.PutUint64(dst[d+3*ds:], r3&zip32|r7<<32)
			le.PutUint64(dst[d+4*ds:], r0>>32|r4&^zip32)
			le.PutUint64(dst[d+5*ds:], r1>>32|r5&^zip32)
			le.PutUint64(dst[d+6*ds:], r2>>32|r6&^zip32)
			le.PutUint64(dst[d+7*ds:], r3>>32|r7&^zip32)
		}
	}
}

// transposed is the in-out part of one expert's parts, each the [rows,
// cols] (out, in) matrix of a weight or scale grid: their transposes side
// by side, row c of the result column c of each (a gate-up stack's row
// holds the gate's column, then the up's). A part stored in-out already is
// read as it is, row for row.
func transposed(parts []part, rows, cols int64) (part, error) {
	if len(parts) == 1 && parts[0].inOut {
		return parts[0], nil
	}
	first := parts[0]
	es := int64(first.dtype.Size())
	srcs := make([]tileSrc, len(parts))
	for i, pt := range parts {
		if pt.dtype != first.dtype || pt.fold != first.fold || pt.size() != rows*cols*es {
			return part{}, fmt.Errorf("tensor %s: %d bytes of %s, want a %dx%d matrix of %s beside %s", pt.tensor, pt.size(), pt.dtype, rows, cols, first.dtype, first.tensor)
		}
		s := tileSrc{src: pt.src, file: pt.file, tensor: pt.tensor, off: pt.off, stride: pt.stride, rows: rows, cols: cols, trans: !pt.inOut}
		if pt.inOut {
			s.rows, s.cols = cols, rows
		}
		if pt.rows == 1 { // contiguous: rows follow each other
			s.stride = s.cols * es
		} else if pt.rows != s.rows || pt.rowLen != s.cols*es {
			return part{}, fmt.Errorf("tensor %s: a region of %d rows of %d bytes is not a %dx%d matrix", pt.tensor, pt.rows, pt.rowLen, s.rows, s.cols)
		}
		srcs[i] = s
	}
	t, err := newTiled(es, srcs...)
	if err != nil {
		return part{}, err
	}
	out := first
	out.region, out.inOut = t.region(), false
	return out, nil
}

// shareBands gives every tiled part of the shard the shard's band cache:
// its chunks are read one at a time, in source order.
func (s *shardPlan) shareBands() {
	c := &bandCache{}
	for _, t := range s.tensors {
		for _, p := range t.parts {
			if tp, ok := p.src.(*tiled); ok {
				tp.cache = c
				s.bands = c
			}
		}
	}
}

// releaseBands lets the band the shard's cache holds go.
func (s *shardPlan) releaseBands() { s.bands.release() }
