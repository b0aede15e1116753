package byteproof

import (
	"context"
	"fmt"
	"hash"
	"io"
	"os"
	"slices"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/tensorbytes"
	"golang.org/x/sync/errgroup"
)

// Stream is the byte proof fed by a pass that reads DST once for every
// check of a run (validate's stream): the caller plans DST's shards as the
// pieces Pieces lists, hands their bytes to Take in any order it likes
// (each byte once), and has Result sum up. Each piece of a tensor is
// compared with its prediction, read from SRC through Predicted's ranges
// (the pass reads those alongside), and every byte of each shard is hashed
// for the manifest in blocks, which need not arrive in file order. The
// checks are CheckBytes's, and so is the result: a shard in which anything
// differs is read again in file order by CheckBytes's own check, so that
// its report names the same first mismatch with the same counts.
type Stream struct {
	pr     *proofRun
	shards map[string]*shardStream // by path
	order  []*shardStream          // in the manifest's name order
	tensor map[string]*shardTensor // DST's tensors, by name
	buf    []byte                  // predicted bytes, read from SRC (one Take at a time)
	early  earlyBudget             // the block hashes' early pieces, every shard's
	// Rechecked counts the shards read again because something differed;
	// Reread those read again because a segment that is compared whole
	// came in parts.
	Rechecked, Reread int
}

// Piece is a byte range of a DST shard, in file order: the bytes of a
// tensor (Tensor set, TensorOff from its first byte) or bytes between
// tensors (the header, padding, anything past the last one).
type Piece struct {
	Path      string
	Off, N    int64 // in the file
	Tensor    string
	TensorOff int64
}

// SrcRange is a byte range of a SRC tensor.
type SrcRange struct {
	T      *checkpoint.Tensor
	Off, N int64
}

type shardStream struct {
	rel, path string
	like      layout.FileInfo
	size      int64
	tensors   []*shardTensor // in file order
	pieces    []Piece
	hash      *blockHash // nil: the manifest hashes it whole, so it is hashed apart, in order
	failed    bool       // something differed: Result checks the shard again in order
	// reread: a dequantised or in-out segment (predicted as a whole, by
	// segReader) came in parts, so Take could not compare it: Result
	// checks the shard in file order, as CheckBytes does.
	reread  bool
	foldMax float64
}

type shardTensor struct {
	sh   *shardStream
	info safetensors.TensorInfo
	at   int64 // file offset of its first byte
	ok   bool  // predicted, with the dtype and shape the prediction has
	segs []segment
}

// NewStream runs the proof's directory checks and predicts every tensor,
// as CheckBytes does first; a mismatch there is the proof's result (res),
// and no stream is needed.
func NewStream(src, dst *checkpoint.Checkpoint, plan *family.Plan, c *layout.Contract) (s *Stream, res *BytesResult, err error) {
	pr, res, err := prepare(src, dst, plan, c)
	if err != nil || res != nil {
		return nil, res, err
	}
	s = &Stream{pr: pr, shards: map[string]*shardStream{}, tensor: map[string]*shardTensor{}, early: earlyBudget{max: maxEarlyBytes}}
	for _, rel := range pr.names {
		if !pr.isShard(rel) {
			continue
		}
		sh, err := s.openShard(rel)
		if err != nil {
			return nil, nil, err
		}
		s.shards[sh.path] = sh
		s.order = append(s.order, sh)
	}
	return s, nil, nil
}

// openShard reads a shard's header and lays it out as pieces.
func (s *Stream) openShard(rel string) (*shardStream, error) {
	pr := s.pr
	sh := &shardStream{rel: rel, path: pr.path(rel), like: pr.man.Files[rel]}
	f, err := safetensors.Open(sh.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := os.Stat(sh.path)
	if err != nil {
		return nil, err
	}
	sh.size = st.Size()
	if sh.hash, err = newBlockHash(sh.like, sh.size, sh.path, &s.early); err != nil {
		return nil, fmt.Errorf("%s: %w", sh.path, err)
	}
	infos := slices.Clone(f.Tensors)
	slices.SortStableFunc(infos, func(a, b safetensors.TensorInfo) int { return int(min(max(a.Begin-b.Begin, -1), 1)) })
	at := int64(0)
	gap := func(to int64) {
		if to > at {
			sh.pieces = append(sh.pieces, Piece{Path: sh.path, Off: at, N: to - at})
			at = to
		}
	}
	for _, ti := range infos {
		t := &shardTensor{sh: sh, info: ti, at: f.DataStart + ti.Begin}
		w, ok := pr.pred.meta[ti.Name]
		t.ok = ok && ti.DType == w.dtype && slices.Equal(ti.Shape, w.shape)
		if t.ok {
			t.segs = pr.pred.tensors[ti.Name]
		}
		n := ti.NumBytes()
		if t.at < at || t.at+n > sh.size {
			// Overlapping or cut short: nothing to stream; the check in
			// file order says what is wrong.
			sh.failed = true
			continue
		}
		gap(t.at)
		sh.tensors = append(sh.tensors, t)
		s.tensor[ti.Name] = t
		sh.pieces = append(sh.pieces, Piece{Path: sh.path, Off: t.at, N: n, Tensor: ti.Name})
		at = t.at + n
		if !t.ok {
			sh.failed = true // unexpected, or not the dtype and shape predicted
		}
	}
	gap(sh.size)
	return sh, nil
}

// Pieces lists every byte of every DST shard once, in file order.
func (s *Stream) Pieces() []Piece {
	var out []Piece
	for _, sh := range s.order {
		out = append(out, sh.pieces...)
	}
	return out
}

// Predicted is where SRC holds the prediction of bytes [off, off+n) of
// DST tensor name (nothing for a tensor nothing predicts).
func (s *Stream) Predicted(name string, off, n int64) []SrcRange {
	t := s.tensor[name]
	if t == nil || !t.ok {
		return nil
	}
	var out []SrcRange
	end := off + n
	for i := range t.segs {
		sg := &t.segs[i]
		if sg.off >= end || sg.off+sg.n <= off || !wholeSeg(sg) {
			continue
		}
		// A dequantised or in-out segment is predicted as a whole from
		// every byte it reads.
		out = append(out, sg.srcRanges()...)
	}
	t.eachSrc(off, n, func(sg *segment, r SrcRange, _ int64) {
		if !wholeSeg(sg) {
			out = append(out, r)
		}
	})
	return out
}

// Span is a byte range of a DST tensor that Take must get whole (Whole: a
// dequantised or in-out segment, compared only as a whole) or may get in
// any parts.
type Span struct {
	Off, N int64
	Whole  bool
}

// Spans cuts DST tensor name into the spans its prediction has, in order;
// nil when no part of it must come whole (any cut will do).
func (s *Stream) Spans(name string) []Span {
	t := s.tensor[name]
	if t == nil || !t.ok || !slices.ContainsFunc(t.segs, func(sg segment) bool { return wholeSeg(&sg) }) {
		return nil
	}
	out := make([]Span, len(t.segs))
	for i := range t.segs {
		out[i] = Span{Off: t.segs[i].off, N: t.segs[i].n, Whole: wholeSeg(&t.segs[i])}
	}
	return out
}

// wholeSeg reports whether sg is predicted as a whole (segReader): a
// dequantised or in-out segment, whose bytes are computed from SRC's, not
// SRC's own.
func wholeSeg(sg *segment) bool { return sg.dq != nil || sg.io != nil }

// srcRanges are every SRC byte range the prediction of a whole segment
// reads.
func (sg *segment) srcRanges() []SrcRange {
	var out []SrcRange
	add := func(t *checkpoint.Tensor, rs [][2]int64) {
		for _, r := range rs {
			if t != nil && r[1] > r[0] {
				out = append(out, SrcRange{T: t, Off: r[0], N: r[1] - r[0]})
			}
		}
	}
	if sg.io != nil {
		for _, x := range sg.io.srcs {
			add(x.t, x.ranges)
		}
		return out
	}
	add(sg.src, sg.ranges)
	add(sg.dq.scale, sg.dq.scaleRanges)
	add(sg.dq.global, sg.dq.globalRanges)
	return out
}

// eachSrc calls fn for the SRC ranges predicting [off, off+n) of t, in
// order, with their segment and where each starts in t.
func (t *shardTensor) eachSrc(off, n int64, fn func(sg *segment, r SrcRange, at int64)) {
	end := off + n
	i, _ := slices.BinarySearchFunc(t.segs, off, func(sg segment, o int64) int {
		if sg.off+sg.n <= o {
			return -1
		}
		return 1
	})
	for ; i < len(t.segs) && t.segs[i].off < end; i++ {
		sg := &t.segs[i]
		pos := sg.off // where the current range starts in the tensor
		for _, rg := range sg.ranges {
			rn := rg[1] - rg[0]
			lo, hi := max(off, pos), min(end, pos+rn)
			if lo < hi {
				fn(sg, SrcRange{T: sg.src, Off: rg[0] + lo - pos, N: hi - lo}, lo)
			}
			if pos += rn; pos >= end {
				break
			}
		}
	}
}

// Take hands the proof bytes [off, off+len(b)) of piece p: hashed for the
// manifest, and where they are a tensor's, compared with their prediction.
// The pass calls it once for every byte of every piece, in any order, one
// call at a time; a piece may come in parts.
func (s *Stream) Take(p Piece, off int64, b []byte) error {
	sh := s.shards[p.Path]
	if sh == nil {
		return fmt.Errorf("byte proof: %s is not a shard of %s", p.Path, s.pr.dst.Dir)
	}
	if sh.hash != nil {
		sh.hash.write(p.Off+off, b)
	}
	t := s.tensor[p.Tensor]
	if p.Tensor == "" || t == nil || !t.ok || sh.failed || sh.reread {
		return nil
	}
	start, end := p.TensorOff+off, p.TensorOff+off+int64(len(b))
	for i := range t.segs {
		sg := &t.segs[i]
		lo, hi := max(start, sg.off), min(end, sg.off+sg.n)
		if lo >= hi {
			continue
		}
		if wholeSeg(sg) {
			if lo != sg.off || hi != sg.off+sg.n {
				sh.reread = true // in parts: Result reads the shard in order
				return nil
			}
			want, err := s.predictWhole(sg)
			if err != nil {
				return fmt.Errorf("tensor %s: predicting it from SRC: %w", p.Tensor, err)
			}
			foldMax := 0.0
			if compareSeg(sh.path, &t.info, *sg, b[lo-start:hi-start], want, lo, &foldMax) != nil {
				sh.failed = true
			}
			sh.foldMax = max(sh.foldMax, foldMax)
			continue
		}
		want, done, err := s.predicted(t, lo, hi)
		if err != nil {
			return fmt.Errorf("tensor %s: reading its prediction from SRC: %w", p.Tensor, err)
		}
		foldMax := 0.0
		mm := compareSeg(sh.path, &t.info, *sg, b[lo-start:hi-start], want, lo, &foldMax)
		done()
		sh.foldMax = max(sh.foldMax, foldMax)
		if mm != nil {
			sh.failed = true
		}
	}
	return nil
}

// predictWhole is SRC's prediction of the whole segment sg (dequantised or
// in-out), computed as CheckBytes computes it (segReader), into the
// stream's buffer: one expert matrix at most.
func (s *Stream) predictWhole(sg *segment) ([]byte, error) {
	if int64(cap(s.buf)) < sg.n {
		s.buf = make([]byte, sg.n)
	}
	want := s.buf[:sg.n]
	r := &segReader{segs: []segment{*sg}}
	if _, err := io.ReadFull(r, want); err != nil {
		return nil, err
	}
	return want, nil
}

// predicted is SRC's prediction of bytes [lo, hi) of t, which lie within
// one segment: lent by the pass where one range of a SRC tensor holds
// them (no copy), else read into the stream's buffer.
func (s *Stream) predicted(t *shardTensor, lo, hi int64) ([]byte, func(), error) {
	var rs []SrcRange
	t.eachSrc(lo, hi-lo, func(_ *segment, r SrcRange, _ int64) { rs = append(rs, r) })
	if len(rs) == 1 {
		if b, done, ok := tensorbytes.Lend(rs[0].T, rs[0].Off, rs[0].N); ok {
			return b, done, nil
		}
	}
	if int64(cap(s.buf)) < hi-lo {
		s.buf = make([]byte, hi-lo)
	}
	exp := s.buf[:hi-lo]
	at := int64(0)
	for _, r := range rs {
		if err := tensorbytes.ReadAt(r.T, exp[at:at+r.N], r.Off); err != nil {
			return nil, nil, err
		}
		at += r.N
	}
	return exp, func() {}, nil
}

// Result sums the proof up: each shard streamed whole and matching gives
// its hash and counts; any other is checked again in file order (so is
// a shard whose manifest entry hashes it whole); config.json and the
// copies are checked as CheckBytes checks them.
func (s *Stream) Result(ctx context.Context) (*BytesResult, error) {
	pr := s.pr
	results := make([]fileResult, len(pr.names))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for i, rel := range pr.names {
		g.Go(func() error {
			var err error
			if !pr.isShard(rel) {
				results[i], err = pr.checkFile(gctx, rel)
				return err
			}
			sh := s.shards[pr.path(rel)]
			if got, ok := sh.sum(); ok {
				results[i] = fileResult{got: got, st: sh.stats()}
				return nil
			}
			results[i], err = pr.checkShard(gctx, rel)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for _, sh := range s.order {
		if _, ok := sh.sum(); !ok && !sh.reread {
			s.Rechecked++
		}
		if sh.reread {
			s.Reread++
		}
	}
	return pr.result(results), nil
}

// sum is the shard's hash when it was streamed whole and nothing in it
// differed.
func (sh *shardStream) sum() (layout.FileInfo, bool) {
	if sh.failed || sh.reread || sh.hash == nil {
		return layout.FileInfo{}, false
	}
	return sh.hash.sum()
}

// stats are a matching shard's counts, as checkShard counts them.
func (sh *shardStream) stats() shardStats {
	st := shardStats{foldMax: sh.foldMax}
	for _, t := range sh.tensors {
		st.tensors = append(st.tensors, t.info.Name)
		if len(t.segs) > 0 && t.segs[0].dq != nil {
			st.dequantized++
		}
		// As checkShard counts: a dequantised segment's SRC bytes are
		// what its prediction reads, any other's its own size.
		for _, sg := range t.segs {
			if sg.dq != nil {
				st.srcBytes += sg.dq.srcBytes(sg.ranges)
			} else {
				st.srcBytes += sg.n
			}
		}
	}
	return st
}

// blockHash is a manifest's block digest of a file whose bytes come in
// any order: each block is hashed as its bytes arrive, those that come
// before their turn in the block held until it comes (a plan that reads a
// layer's stacks expert by expert holds at most a block at each stack's
// start), and the root is taken over the blocks' digests in file order.
//
// The pieces held are bounded by budget, which every shard of the proof
// shares. The pass reads each layer's stacks before the attention tensors
// that precede them in the file (those come with the rest of DST, at the
// end), so every block that holds a layer's attention and the start of its
// stacks waits for the end: a block a layer (244 MB for DeepSeek-V3's 61
// layers in 4 MiB blocks, spread over its shards, which a bound per shard
// let the proof hold nearly whole), or nearly the whole file when layers
// are smaller than a block (60 MB for a Kimi-K2-shaped synth of 60 small
// layers). Past the budget only where a piece lies is kept, and its bytes
// are read again from the file (path) when its turn comes, consecutive
// pieces in one read. A read that fails leaves the sum unknown, and the
// proof then reads the shard in file order.
type blockHash struct {
	algo     layout.BlockAlgo
	bs, size int64
	digests  [][32]byte
	open     map[int64]*openBlock
	done     int64 // blocks complete
	bad      bool  // a byte came twice, or a held piece could not be read again
	path     string
	held     int64        // bytes held in early pieces
	budget   *earlyBudget // the early pieces every shard's hash holds
	buf      []byte       // reads of pieces not held
}

// earlyBudget is what the block hashes of one proof hold in early pieces,
// together: held bytes of at most max. The pass hands the proof one piece
// at a time (Stream.Take), so it needs no lock.
type earlyBudget struct{ held, max int64 }

type openBlock struct {
	h     hash.Hash
	next  int64 // bytes hashed, from the block's start
	early map[int64]earlyPiece
}

// earlyPiece is n bytes that came before their turn: b holds them, or is
// nil when they are read again from the file.
type earlyPiece struct {
	b []byte
	n int64
}

// maxEarlyBytes is the early pieces a proof's block hashes hold, all
// shards together: a few blocks of the usual 4 MiB.
const maxEarlyBytes = 16 << 20

// newBlockHash is the hash of a file (path) of size bytes described like
// like, holding early pieces within budget; nil for a whole-file SHA-256,
// which needs the bytes in order.
func newBlockHash(like layout.FileInfo, size int64, path string, budget *earlyBudget) (*blockHash, error) {
	d, algo, ok := like.BlockHash()
	if !ok || d.BlockSize <= 0 {
		return nil, nil
	}
	blocks := (size + d.BlockSize - 1) / d.BlockSize
	if blocks > layout.MaxBlocksPerFile {
		return nil, fmt.Errorf("%d bytes in %d-byte blocks is %d blocks, over the limit of %d", size, d.BlockSize, blocks, layout.MaxBlocksPerFile)
	}
	return &blockHash{algo: algo, bs: d.BlockSize, size: size, digests: make([][32]byte, blocks), open: map[int64]*openBlock{},
		path: path, budget: budget}, nil
}

// write hashes b, the file's bytes from off.
func (bh *blockHash) write(off int64, b []byte) {
	for len(b) > 0 {
		k := off / bh.bs
		n := min(int64(len(b)), (k+1)*bh.bs-off)
		bh.block(k, off-k*bh.bs, b[:n])
		off, b = off+n, b[n:]
	}
}

// block takes bytes at of block k.
func (bh *blockHash) block(k, at int64, b []byte) {
	ob := bh.open[k]
	if ob == nil {
		if k >= int64(len(bh.digests)) {
			bh.bad = true
			return
		}
		ob = &openBlock{h: bh.algo.New(), early: map[int64]earlyPiece{}}
		bh.open[k] = ob
	}
	switch {
	case at > ob.next:
		if _, dup := ob.early[at]; dup {
			bh.bad = true
		}
		e := earlyPiece{n: int64(len(b))}
		if bh.budget.held+e.n <= bh.budget.max {
			e.b = slices.Clone(b)
			bh.held += e.n
			bh.budget.held += e.n
		}
		ob.early[at] = e
		return
	case at < ob.next:
		bh.bad = true
		return
	}
	ob.h.Write(b)
	ob.next += int64(len(b))
	for {
		e, ok := ob.early[ob.next]
		if !ok {
			break
		}
		if e.b != nil {
			delete(ob.early, ob.next)
			ob.h.Write(e.b)
			ob.next += e.n
			bh.held -= e.n
			bh.budget.held -= e.n
			continue
		}
		// The run of pieces not held from here: one read of the file.
		end := ob.next
		for {
			e, ok := ob.early[end]
			if !ok || e.b != nil {
				break
			}
			delete(ob.early, end)
			end += e.n
		}
		if !bh.readAgain(ob, k*bh.bs+ob.next, end-ob.next) {
			bh.bad = true
			return
		}
		ob.next = end
	}
	if ob.next == min(bh.bs, bh.size-k*bh.bs) {
		ob.h.Sum(bh.digests[k][:0])
		delete(bh.open, k)
		bh.done++
	}
}

// readAgain hashes n bytes of the file from off into ob, read in chunks.
func (bh *blockHash) readAgain(ob *openBlock, off, n int64) bool {
	f, err := os.Open(bh.path)
	if err != nil {
		return false
	}
	defer f.Close()
	if bh.buf == nil {
		bh.buf = make([]byte, min(bh.bs, 1<<20))
	}
	for n > 0 {
		c := bh.buf[:min(n, int64(len(bh.buf)))]
		if got, _ := f.ReadAt(c, off); got != len(c) {
			return false
		}
		ob.h.Write(c)
		off, n = off+int64(len(c)), n-int64(len(c))
	}
	return true
}

// sum is the file's FileInfo once every byte came exactly once.
func (bh *blockHash) sum() (layout.FileInfo, bool) {
	if bh.bad || len(bh.open) > 0 || bh.done != int64(len(bh.digests)) {
		return layout.FileInfo{}, false
	}
	return layout.BlockInfo(bh.algo, bh.size, bh.bs, bh.digests), true
}
