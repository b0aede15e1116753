package torchbin

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"strings"
)

// layout is a checked tensor view: every element it touches lies inside
// its storage, and all byte counts fit in int64.
type layout struct {
	esz    int64   // element size in bytes
	base   int64   // absolute file offset of the storage's first byte
	offset int64   // storage offset, elements
	shape  []int64 // coalesced shape (same row-major element order)
	stride []int64 // elements, per coalesced dim
	numel  int64
	nbytes int64 // numel * esz
}

// mulCheck multiplies non-negative int64s, reporting overflow.
func mulCheck(a, b int64) (int64, bool) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, false
	}
	return int64(lo), true
}

func addCheck(a, b int64) (int64, bool) {
	s := a + b
	if s < a {
		return 0, false
	}
	return s, true
}

// checkView validates a rebuilt tensor against its storage.
func checkView(v *tensorView) (*layout, error) {
	esz := int64(v.dtype.Size())
	if esz == 0 {
		return nil, fmt.Errorf("unknown dtype %q", v.dtype)
	}
	st := v.storage
	if st.nbytes%esz != 0 {
		return nil, fmt.Errorf("storage %q holds %d bytes, not a whole number of %s elements", st.key, st.nbytes, v.dtype)
	}
	storageNumel := st.nbytes / esz
	// The stride of a dim of size <= 1 is never used to step; zero it so
	// that no arithmetic below can meet an arbitrary pickled value. The
	// layout keeps the coalesced dims, which address the same elements.
	stride := make([]int64, len(v.stride))
	for i, n := range v.shape {
		if n > 1 {
			stride[i] = v.stride[i]
		}
	}
	l := &layout{esz: esz, base: st.offset, offset: v.offset, numel: 1}
	last := v.offset // storage index of the last element the view touches
	var ok bool
	for i, n := range v.shape {
		if l.numel, ok = mulCheck(l.numel, n); !ok {
			return nil, fmt.Errorf("shape %v overflows", v.shape)
		}
		if n == 0 {
			continue
		}
		span, ok := mulCheck(n-1, stride[i])
		if ok {
			last, ok = addCheck(last, span)
		}
		if !ok {
			return nil, fmt.Errorf("shape %v with stride %v overflows", v.shape, v.stride)
		}
	}
	if l.nbytes, ok = mulCheck(l.numel, esz); !ok {
		return nil, fmt.Errorf("shape %v overflows", v.shape)
	}
	if l.numel == 0 {
		if v.offset > storageNumel {
			return nil, fmt.Errorf("storage offset %d is past the end of storage %q (%d elements)", v.offset, st.key, storageNumel)
		}
		return l, nil
	}
	if last >= storageNumel {
		return nil, fmt.Errorf("view (offset %d, shape %v, stride %v) reaches element %d of storage %q, which has %d elements",
			v.offset, v.shape, v.stride, last, st.key, storageNumel)
	}
	if overlaps(v.shape, stride) {
		return nil, fmt.Errorf("view (offset %d, shape %v, stride %v) reads some elements of storage %q more than once (an expanded or overlapping view), "+
			"so it streams more bytes than it maps; save tensor.contiguous() instead", v.offset, v.shape, v.stride, st.key)
	}
	l.shape, l.stride = coalesce(v.shape, stride)
	return l, nil
}

// overlaps reports whether two indices of a non-empty view may address the
// same element. moeprep streams every tensor as its own row-major bytes,
// so a view that repeats elements (a stride-0 expand, unfold-style
// windows) would stream more bytes than its storage holds, without bound.
// With the dims of size > 1 sorted by stride, each stride must step past
// everything the smaller dims reach; slices, transposes and permutes of a
// tensor always do. The test is sufficient, not necessary: an as_strided
// interleaving that happens not to repeat is refused too. The spans were
// checked against overflow by checkView and sum to at most the storage.
func overlaps(shape, stride []int64) bool {
	type dim struct{ n, stride int64 }
	var dims [maxRank]dim
	nd := 0
	for i, n := range shape {
		if n <= 1 {
			continue
		}
		d := dim{n, stride[i]}
		j := nd
		for ; j > 0 && dims[j-1].stride > d.stride; j-- {
			dims[j] = dims[j-1]
		}
		dims[j] = d
		nd++
	}
	var reach int64 // the furthest element the smaller dims reach
	for _, d := range dims[:nd] {
		if d.stride <= reach {
			return true
		}
		reach += (d.n - 1) * d.stride
	}
	return false
}

// checkAliasing bounds the bytes a file's tensors stream by maxAliasFactor
// times the bytes of the file their storages map. Each view was checked
// against its own storage; this stops many views of one storage, or many
// zip entries over the same bytes of the file, from inflating a
// conversion's output.
func checkAliasing(tensors []namedView, layouts []*layout) error {
	type use struct {
		streamed int64
		tensors  int
	}
	uses := make(map[*storageRef]*use)
	var streamed int64
	for i, nv := range tensors {
		st := nv.view.storage
		u := uses[st]
		if u == nil {
			u = &use{}
			uses[st] = u
		}
		u.streamed = satAdd(u.streamed, layouts[i].nbytes)
		u.tensors++
		streamed = satAdd(streamed, layouts[i].nbytes)
	}
	// The bytes of the file the storages cover: the union of their
	// ranges, which lookup checked lie inside the file. Zip entries can
	// overlap, so their sizes alone could claim more than the file holds.
	spans := make([][2]int64, 0, len(uses))
	var claimed int64
	for st := range uses {
		if st.nbytes > 0 {
			spans = append(spans, [2]int64{st.offset, st.offset + st.nbytes})
			claimed += st.nbytes // each at most the file's size; at most maxTensors of them
		}
	}
	slices.SortFunc(spans, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var mapped, end int64
	for _, sp := range spans {
		if sp[1] > end {
			mapped += sp[1] - max(sp[0], end)
			end = sp[1]
		}
	}
	if mapped > math.MaxInt64/maxAliasFactor || streamed <= maxAliasFactor*mapped {
		return nil
	}
	// Name the storage streamed most beyond its own size (a single tensor
	// never is), and any overlap of entries: one or both explain the excess.
	var worst *storageRef
	var most int64
	for st, u := range uses {
		if x := u.streamed - st.nbytes; x > most || x == most && worst != nil && st.key < worst.key {
			worst, most = st, x
		}
	}
	var why []string
	if worst != nil {
		why = append(why, fmt.Sprintf("storage %q alone is read by %d tensors for %d bytes", worst.key, uses[worst].tensors, uses[worst].streamed))
	}
	if claimed > mapped {
		why = append(why, fmt.Sprintf("the storages' zip entries overlap, claiming %d bytes", claimed))
	}
	return fmt.Errorf("tensors stream %d bytes from %d bytes of storage in the file, more than %d times as many, the limit on shared storage (%s)",
		streamed, mapped, maxAliasFactor, strings.Join(why, "; "))
}

// satAdd adds non-negative int64s, saturating at the maximum.
func satAdd(a, b int64) int64 {
	if s, ok := addCheck(a, b); ok {
		return s
	}
	return math.MaxInt64
}

// contiguous reports row-major strides, which coalesce to at most one
// dimension of stride 1.
func (l *layout) contiguous() bool {
	return len(l.shape) == 0 || len(l.shape) == 1 && l.stride[0] == 1
}

// coalesce drops dims of size 1 (they never step) and merges each dim into
// the next when together they walk memory evenly, so that reads work on the
// fewest, longest runs and a pickle with thousands of dims costs nothing.
// Only called for non-empty views.
func coalesce(shape, stride []int64) ([]int64, []int64) {
	var sh, st []int64
	for i := range shape {
		if shape[i] == 1 {
			continue
		}
		if n := len(sh) - 1; n >= 0 && st[n] == mulOrNeg(stride[i], shape[i]) {
			sh[n] *= shape[i] // bounded by numel, which was checked
			st[n] = stride[i]
			continue
		}
		sh = append(sh, shape[i])
		st = append(st, stride[i])
	}
	return sh, st
}

// mulOrNeg is a*b, or -1 (never a stride) when it overflows.
func mulOrNeg(a, b int64) int64 {
	if p, ok := mulCheck(a, b); ok {
		return p
	}
	return -1
}

// reader returns the tensor's bytes in row-major order over src.
func (l *layout) reader(src io.ReaderAt) io.ReaderAt {
	start := l.base + l.offset*l.esz // in bounds: checked against the entry
	if l.numel == 0 || l.contiguous() {
		return io.NewSectionReader(src, start, l.nbytes)
	}
	return &stridedReader{src: src, l: l}
}

// stridedReader gathers a non-contiguous view in row-major order on demand.
// It holds no tensor data: each ReadAt reads what it needs, in runs along
// the innermost dimension.
type stridedReader struct {
	src io.ReaderAt
	l   *layout
}

// gatherWindow bounds the scratch buffer used to pick strided elements out
// of one read; a wider run is read element by element.
const gatherWindow = 256 << 10

func (r *stridedReader) ReadAt(p []byte, off int64) (int, error) {
	l := r.l
	if off < 0 {
		return 0, errors.New("torchbin: negative offset")
	}
	if off >= l.nbytes {
		return 0, io.EOF
	}
	want := len(p)
	if rem := l.nbytes - off; int64(want) > rem {
		p = p[:rem]
	}
	// Unravel the first element's index.
	nd := len(l.shape)
	idx := make([]int64, nd)
	e := off / l.esz
	skip := off % l.esz // bytes of the first element already delivered
	for i := nd - 1; i >= 0; i-- {
		idx[i] = e % l.shape[i]
		e /= l.shape[i]
	}
	n := 0
	for n < len(p) {
		pos := l.offset
		for i := range nd {
			pos += idx[i] * l.stride[i]
		}
		// The run: the rest of the innermost row.
		count := l.shape[nd-1] - idx[nd-1]
		stride := l.stride[nd-1]
		m, err := r.readRun(p[n:], pos, stride, count, skip)
		n += m
		if err != nil {
			return n, err
		}
		// Advance the index by the elements consumed (whole or partial).
		done := (skip + int64(m)) / l.esz
		skip = (skip + int64(m)) % l.esz
		idx[nd-1] += done
		for i := nd - 1; i > 0 && idx[i] >= l.shape[i]; i-- {
			idx[i] = 0
			idx[i-1]++
		}
	}
	if n < want {
		return n, io.EOF
	}
	return n, nil
}

// readRun copies up to count elements starting at storage element pos,
// stride apart, dropping the first skip bytes, into p. It returns the bytes
// copied, which stop early only when p is full.
func (r *stridedReader) readRun(p []byte, pos, stride, count, skip int64) (int, error) {
	l := r.l
	esz := l.esz
	// Elements that fit in p (the last one possibly partial).
	fit := (skip + int64(len(p)) + esz - 1) / esz
	if count > fit {
		count = fit
	}
	if stride == 1 {
		nb := min(count*esz-skip, int64(len(p)))
		return readFull(r.src, p[:nb], l.base+pos*esz+skip)
	}
	// Elements stride apart (stride >= 2: checkView refuses overlapping
	// views): read a window covering several of them when it is small,
	// else one element at a time.
	per := int64(1)
	if span := stride * esz; span <= gatherWindow {
		per = max(1, gatherWindow/span)
	}
	n := 0
	var elem [8]byte
	var window []byte
	for c := int64(0); c < count; {
		k := min(per, count-c)
		wlen := ((k-1)*stride + 1) * esz
		var buf []byte
		if wlen <= int64(len(elem)) {
			buf = elem[:wlen]
		} else {
			if int64(cap(window)) < wlen {
				window = make([]byte, wlen)
			}
			buf = window[:wlen]
		}
		if _, err := readFull(r.src, buf, l.base+(pos+c*stride)*esz); err != nil {
			return n, err
		}
		for j := int64(0); j < k && n < len(p); j++ {
			at := j * stride * esz
			n += copy(p[n:], buf[at+skip:at+esz])
			skip = 0
		}
		c += k
	}
	return n, nil
}

// readFull is ReadAt that turns a short read into io.ErrUnexpectedEOF (the
// storage bounds were checked, so a short read means the file changed).
func readFull(src io.ReaderAt, p []byte, off int64) (int, error) {
	n, err := src.ReadAt(p, off)
	if n == len(p) {
		return n, nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}
