package checkpoint

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/moeprep/moeprep/family"
)

// Views name a 2-D piece of a stored tensor, for families that store their
// experts stacked (Granite MoE: input_linear [E, 2I, H] holds every expert's
// gate rows then up rows). "NAME[i]" is slice i of a 3-D tensor,
// "NAME[r0:r1]" rows r0..r1-1 of a 2-D one, "NAME[i][r0:r1]" both. A view
// is a Tensor of its own whose Data is a section of NAME's bytes, so every
// reader (convert, validate, the GPU stager) takes it like any tensor. No
// stored name contains '[' (safetensors and torch names are module paths).
//
// Llama 4 stores its experts transposed, x @ W: gate_up_proj [E, H, 2I] and
// down_proj [E, I, H]. "NAME[i][T:c0:n:step]", last, is columns c0, c0+step,
// ... (n of them) of the 2-D piece before it, transposed to [n, rows]: the
// [I, H] and [H, I] matrices every other family stores. Its Data reads the
// source row by row (transposedReader), never the whole tensor at once.

// gpt-oss's MXFP4 experts, and Inkling's w13_weight in the hub's layout,
// interleave gate and up rows: "NAME[i][R:r0:n:step]",
// last, is rows r0, r0+step, ... (n of them) of the 2-D piece before it
// (stridedReader); a 4-D tensor's slice "NAME[i]" is its trailing
// dimensions flattened ([E, rows, g, 16] gives [rows, g*16]).

// BaseName is the stored tensor a name refers to (family.BaseName).
func BaseName(name string) string { return family.BaseName(name) }

// storedData is a view's source: the stored tensor's bytes, read through
// the reader that tensor has when the read happens, not the one it had
// when the view was made. validate routes a checkpoint's tensor reads
// through its streamed pass (validate/stream's Install) after the byte
// proof has made its views of gpt-oss's and Llama 4's stacks, and those
// views' reads must reach the pass too, or they read the file again.
type storedData struct{ t *Tensor }

func (s storedData) ReadAt(p []byte, off int64) (int, error) { return s.t.Data.ReadAt(p, off) }

// Outer is the stored tensor's reader as a section of itself: code that
// unwraps sections to find a view's file and offset (convert's direct
// reads) goes through it as through any section.
func (s storedData) Outer() (io.ReaderAt, int64, int64) { return s.t.Data, 0, s.t.NumBytes() }

// StoredSpan is where bytes [off, off+n) of t are read from: t itself and
// the same bytes for a stored tensor; for a view, the tensor it is cut
// from and the one span [lo, hi) of that tensor's bytes that holds every
// byte a read of them takes (a strided or transposed view's rows and
// columns in between included, as its reader reads them); for a tensor
// computed from another (Requantised), all of that one's. A planner of
// reads (validate's streamed pass) reads the stored bytes once for every
// view of them.
func (t *Tensor) StoredSpan(off, n int64) (base *Tensor, lo, hi int64) {
	if n <= 0 {
		return t, off, off
	}
	last := off + n - 1 // the last byte wanted
	switch r := t.Data.(type) {
	case computedData:
		// a computed tensor's reads take any of its source's bytes
		return r.from.StoredSpan(0, r.from.NumBytes())
	case *io.SectionReader:
		if in, o, _ := r.Outer(); in != nil {
			if s, ok := in.(storedData); ok {
				return s.t, o + off, o + off + n
			}
		}
	case *stridedReader:
		if s, ok := r.src.(storedData); ok {
			// whole rows: a read gathers from a row's first byte
			return s.t, r.off + off/r.rowBytes*r.stride, r.off + last/r.rowBytes*r.stride + r.rowBytes
		}
	case *transposedReader:
		if s, ok := r.src.(storedData); ok {
			// output rows i0..i1 are source columns c0+i0*step..c0+i1*step
			// of every source row
			rowBytes := r.rows * r.es
			c0, c1 := r.c0+off/rowBytes*r.step, r.c0+last/rowBytes*r.step
			return s.t, r.off + c0*r.es, r.off + (r.rows-1)*r.cols*r.es + (c1+1)*r.es
		}
	case *columnsReader:
		if s, ok := r.src.(storedData); ok {
			// output rows are source rows, each the span of its columns
			rowBytes, span := r.n*r.es, ((r.n-1)*r.step+1)*r.es
			at := func(row int64) int64 { return r.off + row*r.cols*r.es + r.c0*r.es }
			return s.t, at(off / rowBytes), at(last/rowBytes) + span
		}
	}
	return t, off, off + n
}

// view resolves a view name against the stored tensors.
func (c *Checkpoint) view(name string) (*Tensor, error) {
	base := BaseName(name)
	t, ok := c.byName[base]
	if !ok || base == name {
		return nil, fmt.Errorf("tensor %s is missing", base)
	}
	var args []string
	for rest := name[len(base):]; rest != ""; {
		end := strings.IndexByte(rest, ']')
		if rest[0] != '[' || end < 0 {
			return nil, fmt.Errorf("tensor view %s: malformed", name)
		}
		args = append(args, rest[1:end])
		rest = rest[end+1:]
	}
	shape := t.Shape
	es := int64(t.DType.Size())
	var off int64
	for ai, a := range args {
		if cols, ok := strings.CutPrefix(a, "T:"); ok {
			tr, err := transposedView(t, name, shape, off, es, cols, ai == len(args)-1)
			if err != nil {
				return nil, err
			}
			return &Tensor{Name: name, DType: t.DType, Shape: []int64{tr.n, tr.rows}, File: t.File, Data: tr}, nil
		}
		if rows, ok := strings.CutPrefix(a, "R:"); ok {
			sr, err := stridedView(t, name, shape, off, es, rows, ai == len(args)-1)
			if err != nil {
				return nil, err
			}
			return &Tensor{Name: name, DType: t.DType, Shape: []int64{sr.n, shape[1]}, File: t.File, Data: sr}, nil
		}
		if lo, hi, isRange := strings.Cut(a, ":"); isRange {
			r0, e1 := strconv.ParseInt(lo, 10, 64)
			r1, e2 := strconv.ParseInt(hi, 10, 64)
			if e1 != nil || e2 != nil || len(shape) != 2 || r0 < 0 || r1 <= r0 || r1 > shape[0] {
				return nil, fmt.Errorf("%s: tensor view %s: rows %s of shape %v", t.File, name, a, shape)
			}
			off += r0 * shape[1] * es
			shape = []int64{r1 - r0, shape[1]}
			continue
		}
		i, err := strconv.ParseInt(a, 10, 64)
		if err != nil || (len(shape) != 3 && len(shape) != 4) || i < 0 || i >= shape[0] {
			return nil, fmt.Errorf("%s: tensor view %s: slice %s of shape %v", t.File, name, a, shape)
		}
		// A 4-D tensor's slice is read as 2-D, its trailing dimensions
		// flattened: gpt-oss's MXFP4 blocks [E, rows, cols/32, 16] hold
		// per expert the bytes of a [rows, cols/2] matrix.
		inner := shape[2]
		if len(shape) == 4 {
			inner *= shape[3]
		}
		off += i * shape[1] * inner * es
		shape = []int64{shape[1], inner}
	}
	n := es
	for _, d := range shape {
		n *= d
	}
	return &Tensor{Name: name, DType: t.DType, Shape: shape, File: t.File, Data: io.NewSectionReader(storedData{t}, off, n)}, nil
}

// viewSteps parses the "x0:n:step" of a T: or R: view argument, which must
// come last (last) and apply to a 2-D shape: indices x0, x0+step, ... (n of
// them) along dimension dim (1: columns, 0: rows). ok is false when the
// argument is malformed or the indices do not all lie inside shape[dim].
func viewSteps(arg string, shape []int64, dim int, last bool) (x0, n, step int64, ok bool) {
	var v [3]int64
	parts := strings.Split(arg, ":")
	ok = len(parts) == 3 && last && len(shape) == 2
	for i := range parts {
		x, err := strconv.ParseInt(parts[i], 10, 64)
		if i >= len(v) || err != nil {
			ok = false
			break
		}
		v[i] = x
	}
	x0, n, step = v[0], v[1], v[2]
	ok = ok && x0 >= 0 && n >= 1 && step >= 1 && x0 < shape[dim] && (shape[dim]-1-x0)/step >= n-1
	return x0, n, step, ok
}

// transposedView checks a "T:c0:n:step" view argument against the 2-D shape
// it applies to (at byte off of t's data).
func transposedView(t *Tensor, name string, shape []int64, off, es int64, arg string, last bool) (*transposedReader, error) {
	c0, n, step, ok := viewSteps(arg, shape, 1, last)
	if !ok {
		return nil, fmt.Errorf("%s: tensor view %s: transposed columns %s of shape %v (want c0:n:step inside the columns, last)", t.File, name, arg, shape)
	}
	return &transposedReader{src: storedData{t}, off: off, rows: shape[0], cols: shape[1], c0: c0, n: n, step: step, es: es}, nil
}

// transposedReader reads columns c0, c0+step, ... (n of them) of a row-major
// [rows, cols] matrix of es-byte elements (at byte off of src) as the
// row-major [n, rows] matrix of their transpose. A read gathers its output
// rows a group at a time: one ReadAt per source row of the span of columns
// the group needs, into a buffer of at most transposeBuf bytes.
type transposedReader struct {
	src             io.ReaderAt
	off             int64
	rows, cols      int64
	c0, n, step, es int64
}

// transposeBuf bounds one read's buffer (a group of output rows is at least one).
const transposeBuf = 8 << 20

func (r *transposedReader) size() int64 { return r.n * r.rows * r.es }

// ReadAt implements io.ReaderAt.
func (r *transposedReader) ReadAt(b []byte, pos int64) (int, error) {
	if pos < 0 {
		return 0, fmt.Errorf("transposed view: negative offset %d", pos)
	}
	size := r.size()
	if pos >= size {
		return 0, io.EOF
	}
	want := len(b)
	if rest := size - pos; int64(want) > rest {
		b = b[:rest]
	}
	rowBytes := r.rows * r.es // one output row
	group := max(1, transposeBuf/(r.rows*r.step*r.es))
	var buf []byte
	done := 0
	for done < len(b) {
		p := pos + int64(done)
		i0 := p / rowBytes
		i1 := min(r.n, i0+group, (pos+int64(len(b))-1)/rowBytes+1) // output rows [i0, i1)
		span := ((i1-1-i0)*r.step + 1) * r.es
		if need := r.rows * span; int64(cap(buf)) < need {
			buf = make([]byte, need)
		}
		for row := range r.rows {
			at := r.off + row*r.cols*r.es + (r.c0+i0*r.step)*r.es
			if n, err := r.src.ReadAt(buf[row*span:(row+1)*span], at); n < int(span) {
				if err == nil || err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return done, err
			}
		}
		// Scatter: output byte q (from p up to the group's end) is element
		// (i, row) = source (row, c0 + i*step).
		// Per output row one division; within it the source offset steps by
		// span per element (this runs for every byte Llama 4 and gpt-oss
		// convert, so no division per element).
		end := min(pos+int64(len(b)), i1*rowBytes)
		for i := i0; i < i1; i++ {
			lo, hi := max(p, i*rowBytes)-i*rowBytes, min(end, (i+1)*rowBytes)-i*rowBytes // bytes of row i wanted
			dst, col := i*rowBytes+lo-pos, (i-i0)*r.step*r.es
			src, within := (lo/r.es)*span+col, lo%r.es
			if r.es == 2 && within == 0 { // bf16/f16: whole elements without a copy call each
				for ; lo+1 < hi; lo, dst, src = lo+2, dst+2, src+span {
					b[dst], b[dst+1] = buf[src], buf[src+1]
				}
			}
			for off := lo; off < hi; {
				n := copy(b[dst:dst+min(r.es-within, hi-off)], buf[src+within:src+r.es])
				dst, off, src, within = dst+int64(n), off+int64(n), src+span, 0
			}
		}
		done = int(end - pos)
	}
	if len(b) < want {
		return done, io.EOF
	}
	return done, nil
}

// stridedView checks an "R:r0:n:step" view argument against the 2-D shape
// it applies to (at byte off of t's data).
func stridedView(t *Tensor, name string, shape []int64, off, es int64, arg string, last bool) (*stridedReader, error) {
	r0, n, step, ok := viewSteps(arg, shape, 0, last)
	if !ok {
		return nil, fmt.Errorf("%s: tensor view %s: strided rows %s of shape %v (want r0:n:step inside the rows, last)", t.File, name, arg, shape)
	}
	return &stridedReader{src: storedData{t}, off: off + r0*shape[1]*es, rowBytes: shape[1] * es, n: n, stride: step * shape[1] * es}, nil
}

// stridedReader reads n rows of rowBytes bytes, stride bytes apart from
// byte off of src, as one contiguous [n, cols] matrix.
type stridedReader struct {
	src                      io.ReaderAt
	off, rowBytes, n, stride int64
}

// gatherSpan bounds one read of several strided rows at once: gpt-oss's
// MXFP4 gate (even) and up (odd) rows are a few kB each, and one read per
// row cost 1.5 million reads and 1.6x cp's time on a 1.7 GB checkpoint
// (BENCHMARKS.md, issue 29). Rows of a span are read together, the rows
// between them included (they are the other half of the same expert, read
// next from the page cache).
const gatherSpan = 1 << 20

var gatherBufs = sync.Pool{New: func() any { b := make([]byte, gatherSpan); return &b }}

// ReadAt implements io.ReaderAt: rows are read a span of at most
// gatherSpan bytes at a time, or one read a row where a row and its stride
// do not fit twice in a span.
func (r *stridedReader) ReadAt(b []byte, pos int64) (int, error) {
	if pos < 0 {
		return 0, fmt.Errorf("strided view: negative offset %d", pos)
	}
	size := r.n * r.rowBytes
	if pos >= size {
		return 0, io.EOF
	}
	want := len(b)
	if rest := size - pos; int64(want) > rest {
		b = b[:rest]
	}
	// rowsPer rows of a span: (k-1)*stride + rowBytes <= gatherSpan.
	rowsPer := int64(1)
	if r.stride > 0 && r.rowBytes <= gatherSpan {
		rowsPer = (gatherSpan-r.rowBytes)/r.stride + 1
	}
	var scratch []byte
	if rowsPer > 1 {
		bp := gatherBufs.Get().(*[]byte)
		defer gatherBufs.Put(bp)
		scratch = *bp
	}
	done := 0
	for done < len(b) {
		p := pos + int64(done)
		i, within := p/r.rowBytes, p%r.rowBytes
		last := (p + int64(len(b)-done) - 1) / r.rowBytes // last row this call touches
		k := min(rowsPer, last-i+1)
		if k <= 1 {
			m := min(int64(len(b)-done), r.rowBytes-within)
			if err := readFull(r.src, b[done:done+int(m)], r.off+i*r.stride+within); err != nil {
				return done, err
			}
			done += int(m)
			continue
		}
		span := (k-1)*r.stride + r.rowBytes
		from, release := r.lend(r.off+i*r.stride, span)
		if from == nil {
			if err := readFull(r.src, scratch[:span], r.off+i*r.stride); err != nil {
				return done, err
			}
			from, release = scratch[:span], func() {}
		}
		for j := int64(0); j < k && done < len(b); j++ {
			n := copy(b[done:], from[j*r.stride+within:j*r.stride+r.rowBytes])
			done, within = done+n, 0
		}
		release()
	}
	if len(b) < want {
		return done, io.EOF
	}
	return done, nil
}

// lender is a stored tensor's reader that can lend bytes it already holds
// instead of copying them (validate's streamed pass).
type lender interface {
	Lend(off, n int64) ([]byte, func(), bool)
}

// lend is the span [off, off+n) of the stored tensor, lent where its
// reader of the moment holds it (no copy of the span before its rows are
// gathered), else nil.
func (r *stridedReader) lend(off, n int64) ([]byte, func()) {
	s, ok := r.src.(storedData)
	if !ok {
		return nil, nil
	}
	l, ok := s.t.Data.(lender)
	if !ok {
		return nil, nil
	}
	if b, done, ok := l.Lend(off, n); ok && int64(len(b)) == n {
		return b, done
	} else if ok {
		done()
	}
	return nil, nil
}

// readFull reads len(b) bytes of src at off; a short read is an error.
func readFull(src io.ReaderAt, b []byte, off int64) error {
	if n, err := src.ReadAt(b, off); n < len(b) {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	return nil
}

// Untransposed is the transpose of a transposed view ("NAME[i][T:c0:n:step]",
// Llama 4's and gpt-oss's experts): the stored [rows, n] matrix of its
// columns c0, c0+step, ..., read row by row from the stored tensor (one
// read per row, no element read twice), as a writer of x @ W stacks wants
// it. ok is false for any other tensor, whose transpose has to be computed.
func (t *Tensor) Untransposed() (*Tensor, bool) {
	tr, ok := t.Data.(*transposedReader)
	if !ok {
		return nil, false
	}
	return &Tensor{Name: t.Name + " (stored)", DType: t.DType, Shape: []int64{tr.rows, tr.n}, File: t.File, Data: &columnsReader{tr}}, true
}

// columnsReader reads the columns c0, c0+step, ... (n of them) of a
// transposedReader's row-major [rows, cols] source as the row-major
// [rows, n] matrix they form: per output row touched, one ReadAt of the
// span of source columns it needs (straight into the output when step is 1).
type columnsReader struct{ *transposedReader }

// ReadAt implements io.ReaderAt.
func (r *columnsReader) ReadAt(b []byte, pos int64) (int, error) {
	if pos < 0 {
		return 0, fmt.Errorf("stored columns: negative offset %d", pos)
	}
	rowBytes := r.n * r.es
	size := r.rows * rowBytes
	if pos >= size {
		return 0, io.EOF
	}
	want := len(b)
	if rest := size - pos; int64(want) > rest {
		b = b[:rest]
	}
	span := ((r.n-1)*r.step + 1) * r.es
	var buf []byte
	for done := int64(0); done < int64(len(b)); {
		p := pos + done
		row, within := p/rowBytes, p%rowBytes
		m := min(int64(len(b))-done, rowBytes-within)
		at := r.off + row*r.cols*r.es + r.c0*r.es
		out := b[done : done+m]
		if r.step == 1 {
			if n, err := r.src.ReadAt(out, at+within); int64(n) < m {
				return int(done) + n, shortRead(err)
			}
		} else {
			if buf == nil {
				buf = make([]byte, span)
			}
			if n, err := r.src.ReadAt(buf, at); int64(n) < span {
				return int(done), shortRead(err)
			}
			for k := int64(0); k < m; k++ { // byte within+k of the row: element (within+k)/es, byte (within+k)%es
				q := within + k
				out[k] = buf[q/r.es*r.step*r.es+q%r.es]
			}
		}
		done += m
	}
	if len(b) < want {
		return len(b), io.EOF
	}
	return len(b), nil
}

// shortRead is the error of a read that came back short.
func shortRead(err error) error {
	if err == nil || err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// TransposedColumns is columns [c0, c0+n) of the 2-D tensor t ([rows,
// cols]) as the [n, rows] tensor of their transpose, named name: what a
// "T:c0:n:1" view of t gives, for a tensor that is not one of a
// checkpoint's (validate's per-rank recomposition reads an in-out stack's
// slot through it). Its Data reads t's rows, never the whole tensor at once.
func TransposedColumns(t *Tensor, name string, c0, n int64) (*Tensor, error) {
	if len(t.Shape) != 2 || c0 < 0 || n < 1 || c0+n > t.Shape[1] {
		return nil, fmt.Errorf("%s: tensor %s: columns %d..%d of shape %v", t.File, t.Name, c0, c0+n, t.Shape)
	}
	tr := &transposedReader{src: t.Data, rows: t.Shape[0], cols: t.Shape[1], c0: c0, n: n, step: 1, es: int64(t.DType.Size())}
	return &Tensor{Name: name, DType: t.DType, Shape: []int64{n, tr.rows}, File: t.File, Data: tr}, nil
}
