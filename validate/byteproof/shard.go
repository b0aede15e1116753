// One DST shard read in file order and hashed, each tensor compared with its prediction read from SRC
// a few chunks ahead.

package byteproof

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/moeprep/moeprep/internal/safeio"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/tensorbytes"
	"github.com/moeprep/moeprep/weightfmt"
)

// shardStats is what one shard's check saw.
type shardStats struct {
	tensors     []string
	srcBytes    int64
	foldMax     float64
	dequantized int // tensors predicted by dequantising
}

// checkShard reads one DST shard in file order, hashing it, and compares
// each tensor with its prediction, read from SRC a few chunks ahead. It
// returns the file's size and hash and the first mismatch.
func checkShard(ctx context.Context, path string, like layout.FileInfo, pred *prediction) (layout.FileInfo, *ByteMismatch, shardStats, error) {
	var st shardStats
	fail := func(err error) (layout.FileInfo, *ByteMismatch, shardStats, error) {
		return layout.FileInfo{}, nil, st, err
	}
	f, err := safetensors.Open(path)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	fh, err := safeio.Open(path)
	if err != nil {
		return fail(err)
	}
	defer fh.Close()
	// The predicted bytes of every tensor the shard holds, in file order;
	// the stream ends early at a tensor nothing predicts (reported below).
	var segs []segment
	for _, ti := range f.Tensors {
		w, ok := pred.meta[ti.Name]
		if !ok || ti.DType != w.dtype || !slices.Equal(ti.Shape, w.shape) {
			break
		}
		segs = append(segs, pred.tensors[ti.Name]...)
	}
	want := newAheadReader(&segReader{segs: segs})
	defer want.stop()
	h := layout.NewHasher(like) // hashed the way the manifest did
	dr := newAheadReader(io.TeeReader(fh, h))
	defer dr.stop()
	var size int64
	skip := func(n int64) error {
		m, err := io.CopyN(io.Discard, dr, n)
		size += m
		return err
	}
	if err := skip(f.DataStart); err != nil {
		return fail(fmt.Errorf("%s: %w", path, err))
	}
	got := make([]byte, compareChunk)
	exp := make([]byte, compareChunk)
	for i := range f.Tensors {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		ti := &f.Tensors[i]
		if gap := f.DataStart + ti.Begin - size; gap != 0 {
			if err := skip(gap); err != nil {
				return fail(fmt.Errorf("%s: %w", path, err))
			}
		}
		w, ok := pred.meta[ti.Name]
		if !ok {
			return layout.FileInfo{}, &ByteMismatch{Kind: MismatchExtra, File: path, Tensor: ti.Name, Layer: -1, Expert: -1,
				Detail: "neither a stack the contract names nor a tensor of SRC"}, st, nil
		}
		if ti.DType != w.dtype || !slices.Equal(ti.Shape, w.shape) {
			return layout.FileInfo{}, &ByteMismatch{Kind: MismatchShape, File: path, Tensor: ti.Name, Layer: w.layer, Expert: -1,
				Detail: fmt.Sprintf("%s %v, want %s %v", ti.DType, ti.Shape, w.dtype, w.shape)}, st, nil
		}
		st.tensors = append(st.tensors, ti.Name)
		if segs := pred.tensors[ti.Name]; len(segs) > 0 && segs[0].dq != nil {
			st.dequantized++
		}
		es := int64(ti.DType.Size())
		step := int64(compareChunk) / es * es
		for _, sg := range pred.tensors[ti.Name] {
			if sg.dq != nil {
				st.srcBytes += sg.dq.srcBytes(sg.ranges)
			}
			for done := int64(0); done < sg.n; done += step {
				n := min(step, sg.n-done)
				if _, err := io.ReadFull(dr, got[:n]); err != nil {
					return fail(fmt.Errorf("%s: tensor %s: %w", path, ti.Name, err))
				}
				size += n
				if _, err := io.ReadFull(want, exp[:n]); err != nil {
					return fail(fmt.Errorf("tensor %s: reading its prediction from SRC: %w", ti.Name, err))
				}
				if sg.dq == nil {
					st.srcBytes += n
				}
				if mm := compareSeg(path, ti, sg, got[:n], exp[:n], sg.off+done, &st.foldMax); mm != nil {
					return layout.FileInfo{}, mm, st, nil
				}
			}
		}
	}
	rest, err := io.Copy(io.Discard, dr)
	if err != nil {
		return fail(fmt.Errorf("%s: %w", path, err))
	}
	size += rest
	sum := h.Sum()
	if sum.Size != size {
		return fail(fmt.Errorf("%s: hashed %d bytes, read %d", path, sum.Size, size))
	}
	return sum, nil, st, nil
}

// compareChunk is the unit of comparison: two such buffers plus the
// read-ahead's are all the memory the check holds.
const compareChunk = 2 << 20

// compareSeg compares n bytes at offset at of DST tensor ti with their
// prediction.
func compareSeg(path string, ti *safetensors.TensorInfo, sg segment, got, want []byte, at int64, foldMax *float64) *ByteMismatch {
	mm := func(kind string, off int64, detail string) *ByteMismatch {
		return &ByteMismatch{Kind: kind, File: path, Tensor: ti.Name, Layer: sg.layer, Expert: sg.expert, Offset: off, Detail: detail}
	}
	if i, bits := tensorbytes.FirstNonFinite(ti.DType, got); i >= 0 {
		es := int64(ti.DType.Size())
		return mm(MismatchNaN, at+int64(i)*es, fmt.Sprintf("element %d is NaN or Inf (bits %#x)", (at/es)+int64(i), bits))
	}
	if sg.dq != nil {
		return compareDequant(mm, sg, ti.DType, got, want, at)
	}
	if sg.fold == 0 {
		if bytes.Equal(got, want) {
			return nil
		}
		i := firstDiff(got, want)
		return mm(MismatchBytes, at+int64(i), fmt.Sprintf("DST byte %#02x, SRC %s byte %#02x", got[i], sg.src.Name, want[i]))
	}
	es := ti.DType.Size()
	rel, absFloor := weightfmt.RoundingBound(ti.DType)
	for i := 0; i+es <= len(got); i += es {
		d, s := weightfmt.Value(ti.DType, got[i:]), weightfmt.Value(ti.DType, want[i:])
		exact := s * sg.fold
		diff := math.Abs(d - exact)
		if diff > rel*math.Abs(exact)+absFloor {
			return mm(MismatchFold, at+int64(i), fmt.Sprintf("%g, but SRC %s holds %g and %g x rsf %g = %g", d, sg.src.Name, s, s, sg.fold, exact))
		}
		if exact != 0 {
			*foldMax = max(*foldMax, diff/math.Abs(exact))
		}
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// segReader reads a tensor's predicted bytes, segment after segment, from
// SRC.
type segReader struct {
	segs []segment
	seg  int
	rng  int
	pos  int64 // within the current range
	// A dequantised segment (dequant.go): the rows predicted so far, the
	// predicted bytes not yet read (dqBuf from dqOff), the scratch.
	dqRow int64
	dqBuf []byte
	dqOff int
	dq    weightfmt.Dequantiser
	io    *ioReader // the current in-out segment's, its buffers kept for the next
}

// Read fills p with the next predicted bytes; io.EOF after the last.
func (r *segReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if r.seg >= len(r.segs) {
			if n > 0 {
				return n, nil
			}
			return 0, io.EOF
		}
		sg := &r.segs[r.seg]
		if sg.dq != nil {
			m, err := r.readDequant(sg, p[n:])
			if err != nil {
				return n, err
			}
			if m == 0 {
				r.seg, r.dqRow, r.dqBuf, r.dqOff = r.seg+1, 0, r.dqBuf[:0], 0
			}
			n += m
			continue
		}
		if sg.io != nil {
			if r.io == nil {
				r.io = &ioReader{}
			}
			if r.io.g != sg.io {
				*r.io = ioReader{g: sg.io, buf: r.io.buf, tmp: r.io.tmp}
			}
			m, err := r.io.read(p[n:])
			n += m
			if err != nil {
				return n, err
			}
			if r.io.pos == sg.io.size() {
				r.seg++
			}
			continue
		}
		if r.rng >= len(sg.ranges) {
			r.seg, r.rng, r.pos = r.seg+1, 0, 0
			continue
		}
		rg := sg.ranges[r.rng]
		m := min(int64(len(p)-n), rg[1]-rg[0]-r.pos)
		if err := tensorbytes.ReadAt(sg.src, p[n:n+int(m)], rg[0]+r.pos); err != nil {
			return n, err
		}
		n += int(m)
		if r.pos += m; r.pos == rg[1]-rg[0] {
			r.rng, r.pos = r.rng+1, 0
		}
	}
	return n, nil
}

// aheadReader reads its source in a goroutine, a few chunks ahead of the
// reader, so that reading DST overlaps reading SRC and comparing.
type aheadReader struct {
	ch   chan aheadChunk
	free chan []byte
	cur  []byte
	buf  []byte
	err  error
	done chan struct{}
}

type aheadChunk struct {
	b   []byte
	err error
}

const aheadDepth = 3

func newAheadReader(r io.Reader) *aheadReader {
	a := &aheadReader{ch: make(chan aheadChunk, aheadDepth), free: make(chan []byte, aheadDepth+1), done: make(chan struct{})}
	for range aheadDepth + 1 {
		a.free <- make([]byte, compareChunk)
	}
	go func() {
		defer close(a.ch)
		for {
			var b []byte
			select {
			case b = <-a.free:
			case <-a.done:
				return
			}
			n, err := io.ReadFull(r, b)
			if err == io.ErrUnexpectedEOF {
				err = io.EOF
			}
			select {
			case a.ch <- aheadChunk{b[:n], err}:
			case <-a.done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return a
}

func (a *aheadReader) Read(p []byte) (int, error) {
	for len(a.cur) == 0 {
		if a.err != nil {
			return 0, a.err
		}
		if a.buf != nil {
			a.free <- a.buf[:cap(a.buf)]
			a.buf = nil
		}
		c, ok := <-a.ch
		if !ok {
			return 0, io.EOF
		}
		a.buf, a.cur, a.err = c.b, c.b, c.err
	}
	n := copy(p, a.cur)
	a.cur = a.cur[n:]
	return n, nil
}

func (a *aheadReader) stop() { close(a.done) }
