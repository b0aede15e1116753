package convert

import (
	"context"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/weightfmt"
)

// How one output shard is written (measurements: BENCHMARKS.md, "convert and
// fuse-shared from a cold cache"):
//
//   - The shard is cut into chunks, each a piece of one source region, and the
//     chunks are taken in the order of their source file and offset,
//     whichever way the output stacks experts, so every source file is read
//     front to back. The kernel's read-ahead (8 MiB windows here) runs ahead
//     of the reader through each source file.
//   - Where the file system allows O_DIRECT, the direct writer
//     (directwrite.go) reads each chunk straight into the in-memory blocks it
//     lands in, hashes every finished block from memory and writes it with
//     O_DIRECT: the output never enters the page cache. Elsewhere, and with
//     --buffered-io, the buffered writer below pwrites each chunk through
//     the page cache. Both write the same bytes and the same manifest.
//   - Buffered: shardWorkers goroutines take chunks in source order, read
//     each into a bounded buffer (folding it when the part is folded) and
//     pwrite it at its planned offset of the output.
//   - No copy_file_range, though it would save a copy through user space.
//     Without reflink it splices the bytes in pipe-sized (64 KiB) rounds
//     whose destination offsets are not 64 KiB aligned (a tensor's offset in
//     the output is not its offset in the source), so the output's page
//     cache is built of small folios and write-back sends the disk requests
//     of 2 MiB on average where a 4 MiB pwrite gets 4 MiB ones: 800 write
//     requests for A's 1.6 GB against cp's 415 (buffered: 419), and the
//     fsync waits longer. Side by side, cold, in three runs of
//     bench-convert.sh: B converted in 10.2 / 13.2 / 12.9 s buffered against
//     12.6 / 15.2 / 16.3 s with copy_file_range, A in 4.1 / 3.7 / 4.3 s
//     against 4.1 / 4.2 / 5.3 s (BENCHMARKS.md).
//   - The file is hashed in 4 MiB blocks (layout.ShardBlockSize), and the
//     manifest records the hash of the blocks' hashes (layout.BlockDigest;
//     XXH3-128 unless --digest says otherwise). A whole-file hash would need
//     the bytes in file order, which source-order writing gives only at the
//     very end. Buffered: hashWorkers goroutines hash each block, read back
//     from the page cache, as soon as its last byte is written.
//   - Buffered: the final fsync starts as soon as the last chunk is written
//     and runs while the hashers finish, so the time the disk takes to flush
//     is not added to the time hashing takes.
//   - Shards are written --jobs at a time, so on a multi-shard model several
//     writers and hashers run at once, one writer per file.
//
// Memory is the workers' and hashers' buffers, whatever the model size.
//
// One writer and one hasher a shard, from cold-cache measurements on a
// 2-core machine (BENCHMARKS.md). A buffered write to an ext4 file
// holds the inode's lock for the whole copy, so a second writer on the same
// file gets no parallel copying: it spins on the lock (perf: 20% of both
// cores in rwsem_spin_on_owner with two writers; a 6.5 GB model written
// one shard at a time took 9.6 s with one writer against 10.6 s with two in
// one rotation, 11.7 s with two against 13.5 s with four in another).
// Read-ahead already overlaps reading with copying, and fadvise(WILLNEED)
// ahead of the writer measured slower. One hasher keeps up with one writer
// (BLAKE3 at 2-3 GB/s on data read back from the page cache; XXH3 is bound
// by the read-back copy).
const (
	shardWorkers = 1
	hashWorkers  = 1
	hashBufSize  = 1 << 20
)

// Sizes the tests shrink so that tiny fixtures span many chunks and blocks.
var (
	// chunkSize is the buffer each worker reads a chunk into: 1, 16 and
	// 64 MiB measured no faster on A, cold (BENCHMARKS.md).
	chunkSize      int64 = 4 << 20
	shardBlockSize int64 = layout.ShardBlockSize
)

// chunk is n bytes of one part's output stream, from byte pos of that stream,
// to be written at dst in the output file.
type chunk struct {
	p      *part
	pos, n int64
	dst    int64
	src    sourceKey
	idx    int // position in the shard's chunk list, which fixes its source digest's slot
}

// sourceKey orders chunks by where their bytes live on disk.
type sourceKey struct {
	file string
	off  int64
}

func (a sourceKey) less(b sourceKey) bool {
	if a.file != b.file {
		return a.file < b.file
	}
	return a.off < b.off
}

// planChunks cuts the shard's tensors into chunks, returned in source order.
// The header occupies [0, len(s.header)).
func (s *shardPlan) planChunks() ([]*chunk, error) {
	var out []*chunk
	dst := int64(len(s.header))
	for _, t := range s.tensors {
		start := dst
		for i := range t.parts {
			p := &t.parts[i]
			size := p.size()
			step := chunkSize
			switch {
			case p.dq != nil:
				step = p.dq.chunkRows() * p.dq.rowBytes() // whole scale blocks of rows
			case !p.contiguous() && p.rowLen < step:
				step = step / p.rowLen * p.rowLen // whole rows
			}
			if es := int64(p.dtype.Size()); es > 1 && p.dq == nil {
				step = max(step/es*es, es) // folding needs whole elements
			}
			for pos := int64(0); pos < size; pos += step {
				c := &chunk{p: p, pos: pos, n: min(step, size-pos), dst: dst}
				c.src = sourceKey{file: p.file, off: p.sourceOffset(p.sourcePos(pos))}
				out = append(out, c)
				dst += c.n
			}
		}
		if dst-start != t.size {
			return nil, fmt.Errorf("%s: tensor %s: its parts make %d bytes, planned %d", s.name, t.name, dst-start, t.size)
		}
	}
	if dst != s.size {
		return nil, fmt.Errorf("%s: planned chunks cover %d bytes, the shard is %d", s.name, dst, s.size)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].src.less(out[j].src) })
	for i, c := range out {
		c.idx = i
	}
	return out, nil
}

// read reads the chunk's bytes of r (its part's region, or the same bytes
// through another open file) into b (len c.n), notes their digest in src
// (before folding: it identifies the source bytes) and folds them when the
// part is folded; a dequantised part's chunk is computed from its source
// rows (dequantise).
func (c *chunk) read(b []byte, r region, src *sourceDigests) error {
	if c.p.dq != nil {
		return c.dequantise(b, r, src)
	}
	if err := r.readAt(b, c.pos); err != nil {
		return err
	}
	src.note(c, b)
	if c.p.fold {
		if es := int64(c.p.dtype.Size()); c.pos%es != 0 || c.n%es != 0 {
			return fmt.Errorf("%s: tensor %s: folding bytes %d..%d, not whole %s elements", c.p.file, c.p.tensor, c.pos, c.pos+c.n, c.p.dtype)
		}
		c.p.stats.note(weightfmt.FoldInPlace(c.p.dtype, b, c.p.factor))
	}
	return nil
}

// shardWriter is one output shard being written.
type shardWriter struct {
	path  string
	out   *os.File
	size  int64
	bs    int64 // hash block size
	algo  layout.BlockAlgo
	left  []atomic.Int64 // buffered writer: bytes of each block not yet written
	ready chan int64     // buffered writer: blocks fully written, to hash
	sums  [][32]byte
	flush chan int64 // hashed blocks, to start writing back (nil: none)

	srcMu sync.Mutex
	srcs  map[*os.File]*shardSource // the checkpoint's open source files -> this shard's own

	srcSums *sourceDigests // what each chunk read from the source, for --resume
}

// shardSource is a shard's own open file of one source and how many of the
// shard's chunks still read it: the file is closed after the last, so a
// shard holds one or two sources open at a time (its chunks go in source
// order), not every file of a 163-file checkpoint.
type shardSource struct {
	f    *os.File // nil: the shared file is used
	left int
}

// ownSource returns the part's region read through this shard's own open
// file of its source, and the file it reads: nil when the source is not a
// plain file, the checkpoint's shared one when the path cannot be opened
// again as the same file.
//
// Why: the kernel keeps read-ahead state per open file. The checkpoint
// opens each source once, and the shards written at once (--jobs) each take
// every few tensors of it, so through the shared file each one's next read
// looks random to the kernel and read-ahead restarts small. With a file of
// its own, a shard reads each source front to back with gaps. B (3 shards
// at once): 6.00 s against 6.43 s over 7 rotated rounds, faster in 5
// (BENCHMARKS.md).
func (sw *shardWriter) ownSource(p *part) (region, *os.File) {
	shared, ok := outermost(p.src).(*os.File)
	if !ok {
		return p.region, nil
	}
	sw.srcMu.Lock()
	defer sw.srcMu.Unlock()
	if sw.srcs == nil {
		sw.srcs = map[*os.File]*shardSource{}
	}
	o := sw.srcs[shared]
	if o == nil {
		o = &shardSource{}
		sw.srcs[shared] = o
	}
	if o.f == nil {
		o.f = reopen(shared)
	}
	f := o.f
	if f == nil {
		f = shared
	}
	r := p.region
	r.src, r.off = f, baseOffset(p.src)+p.off
	return r, f
}

// countSources records how many of chunks read each source file.
func (sw *shardWriter) countSources(chunks []*chunk) {
	sw.srcMu.Lock()
	defer sw.srcMu.Unlock()
	if sw.srcs == nil {
		sw.srcs = map[*os.File]*shardSource{}
	}
	for _, c := range chunks {
		if shared, ok := outermost(c.p.src).(*os.File); ok {
			o := sw.srcs[shared]
			if o == nil {
				o = &shardSource{}
				sw.srcs[shared] = o
			}
			o.left++
		}
	}
}

// chunkDone closes the shard's own file of c's source after its last chunk.
func (sw *shardWriter) chunkDone(c *chunk) {
	shared, ok := outermost(c.p.src).(*os.File)
	if !ok {
		return
	}
	sw.srcMu.Lock()
	defer sw.srcMu.Unlock()
	if o := sw.srcs[shared]; o != nil {
		if o.left--; o.left <= 0 && o.f != nil {
			o.f.Close()
			o.f = nil
		}
	}
}

// reopen opens f's path again, or returns nil when it cannot or the path now
// names another file.
func reopen(f *os.File) *os.File {
	g, err := os.Open(f.Name())
	if err != nil {
		return nil
	}
	a, errA := f.Stat()
	b, errB := g.Stat()
	if errA != nil || errB != nil || !os.SameFile(a, b) {
		g.Close()
		return nil
	}
	return g
}

// closeSources closes the files ownSource opened.
func (sw *shardWriter) closeSources() {
	sw.srcMu.Lock()
	defer sw.srcMu.Unlock()
	for _, o := range sw.srcs {
		if o.f != nil {
			o.f.Close()
		}
	}
	sw.srcs = nil
}

// writeShard writes one planned shard to DST.partial and returns its size and
// block digest, and the digest of the source bytes it was made from (which
// --resume checks before it reuses the shard); on any error or cancellation
// nothing is left at its name.
func (w *run) writeShard(ctx context.Context, s *shardPlan) (fi layout.FileInfo, src string, err error) {
	path := filepath.Join(w.partial, s.name)
	chunks, err := s.planChunks()
	if err != nil {
		return layout.FileInfo{}, "", err
	}
	defer s.releaseBands()
	tmp := path + ".tmp"
	out, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return layout.FileInfo{}, "", err
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(tmp)
		}
	}()
	if err := preallocate(out, s.size); err != nil {
		return layout.FileInfo{}, "", fmt.Errorf("%s: reserving %d bytes: %w", tmp, s.size, err)
	}
	bs := shardBlockSize
	nb := (s.size + bs - 1) / bs
	sw := &shardWriter{path: tmp, out: out, size: s.size, bs: bs, algo: w.o.Digest, sums: make([][32]byte, nb), srcSums: newSourceDigests(len(chunks))}
	defer sw.closeSources()
	sw.countSources(chunks)

	var dout *os.File
	if directIO && !w.o.BufferedIO && bs%directAlign == 0 {
		dout, _ = openDirect(tmp) // refused: through the page cache
	}
	if dout != nil {
		var st *directStats
		st, err = sw.writeDirect(ctx, dout, s.header, chunks, w.o.Progress.Add)
		if cerr := dout.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("%s: close: %w", tmp, cerr)
		}
		if err == nil {
			if onDirectStats != nil {
				onDirectStats(s.name, st)
			}
			if serr := out.Sync(); serr != nil {
				err = fmt.Errorf("%s: sync: %w", tmp, serr)
			}
		}
	} else {
		err = w.writeBuffered(ctx, s, sw, chunks)
	}
	if err != nil {
		return layout.FileInfo{}, "", err
	}
	if st, err := out.Stat(); err != nil || st.Size() != s.size {
		if err == nil {
			err = fmt.Errorf("file is %d bytes, planned %d", st.Size(), s.size)
		}
		return layout.FileInfo{}, "", fmt.Errorf("%s: %w", tmp, err)
	}
	if err := out.Close(); err != nil {
		return layout.FileInfo{}, "", fmt.Errorf("%s: close: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return layout.FileInfo{}, "", err
	}
	return layout.BlockInfo(sw.algo, s.size, bs, sw.sums), sw.srcSums.root(), nil
}

// writeBuffered writes the shard through the page cache: the header and every
// chunk pwritten, blocks hashed by reading them back, the file synced.
func (w *run) writeBuffered(ctx context.Context, s *shardPlan, sw *shardWriter, chunks []*chunk) error {
	out, tmp, bs := sw.out, sw.path, sw.bs
	nb := len(sw.sums)
	sw.left, sw.ready = make([]atomic.Int64, nb), make(chan int64, nb)
	if startWriteback != nil {
		sw.flush = make(chan int64, nb)
	}
	for b := range sw.left {
		sw.left[b].Store(min(bs, s.size-int64(b)*bs))
	}

	wctx, f := withFailure(ctx)
	defer f.cancel()
	fail := f.fail
	// The flusher starts the write-back of every block the hashers are done
	// with, so the disk writes while later chunks are still being read and
	// copied, rather than all of it in the final fsync.
	flushed := make(chan struct{})
	if sw.flush == nil {
		close(flushed)
	} else {
		go func() {
			defer close(flushed)
			for b := range sw.flush {
				if wctx.Err() == nil {
					startWriteback(sw.out, b*bs, min(bs, s.size-b*bs))
				}
			}
		}()
	}
	var hashers sync.WaitGroup
	for range hashWorkers {
		hashers.Go(func() {
			if err := sw.hash(wctx); err != nil {
				fail(err)
			}
		})
	}
	if _, err := out.WriteAt(s.header, 0); err != nil {
		fail(fmt.Errorf("%s: writing the header: %w", tmp, err))
	} else {
		sw.written(0, int64(len(s.header)))
		w.o.Progress.Add(int64(len(s.header)))
	}
	var next atomic.Int64
	var workers sync.WaitGroup
	for range shardWorkers {
		workers.Go(func() {
			var buf []byte
			for wctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(len(chunks)) {
					return
				}
				c := chunks[i]
				err := sw.put(c, &buf)
				sw.chunkDone(c)
				if err != nil {
					fail(err)
					return
				}
				sw.written(c.dst, c.n)
				w.o.Progress.Add(c.n)
			}
		})
	}
	workers.Wait()
	close(sw.ready)
	// Every byte is written: flush it to disk while the hashers finish.
	synced := make(chan error, 1)
	if wctx.Err() == nil {
		go func() { synced <- out.Sync() }()
	} else {
		synced <- nil
	}
	hashers.Wait()
	if sw.flush != nil {
		close(sw.flush)
	}
	<-flushed
	serr := <-synced
	if err := ctx.Err(); err != nil {
		return err
	}
	if f.err != nil {
		return f.err
	}
	if serr != nil {
		return fmt.Errorf("%s: sync: %w", tmp, serr)
	}
	for b := range sw.left {
		if sw.left[b].Load() != 0 {
			return fmt.Errorf("%s: block %d of %d was not written (a planning bug)", tmp, b, nb)
		}
	}
	return nil
}

// put writes one chunk at its offset.
func (sw *shardWriter) put(c *chunk, buf *[]byte) error {
	r, _ := sw.ownSource(c.p)
	if int64(cap(*buf)) < c.n {
		*buf = make([]byte, max(c.n, chunkSize))
	}
	b := (*buf)[:c.n]
	if err := c.read(b, r, sw.srcSums); err != nil {
		return err
	}
	if _, err := sw.out.WriteAt(b, c.dst); err != nil {
		return fmt.Errorf("%s: writing tensor %s: %w", sw.path, c.p.tensor, err)
	}
	return nil
}

// written notes that [off, off+n) is in the file and hands every block it
// completes to the hashers.
func (sw *shardWriter) written(off, n int64) {
	bs := sw.bs
	for b := off / bs; b*bs < off+n; b++ {
		lo, hi := max(off, b*bs), min(off+n, (b+1)*bs)
		if sw.left[b].Add(lo-hi) == 0 {
			sw.ready <- b // never blocks: the channel holds every block
		}
	}
}

// hash digests finished blocks until there are no more.
func (sw *shardWriter) hash(ctx context.Context) error {
	h := sw.algo.New()
	buf := make([]byte, hashBufSize)
	for b := range sw.ready {
		if ctx.Err() != nil {
			continue // drain
		}
		if err := sw.hashBlock(h, buf, b); err != nil {
			return err
		}
		if sw.flush != nil {
			sw.flush <- b // never blocks: the channel holds every block
		}
	}
	return nil
}

// hashBlock digests block b, read back from the file through buf, into sums[b].
func (sw *shardWriter) hashBlock(h hash.Hash, buf []byte, b int64) error {
	off := b * sw.bs
	end := min(off+sw.bs, sw.size)
	h.Reset()
	for at := off; at < end; {
		n := min(int64(len(buf)), end-at)
		if _, err := sw.out.ReadAt(buf[:n], at); err != nil {
			return fmt.Errorf("%s: reading back to hash: %w", sw.path, err)
		}
		h.Write(buf[:n])
		at += n
	}
	h.Sum(sw.sums[b][:0])
	return nil
}

// failure keeps the first error of a shard's goroutines and cancels their
// context, so the others stop.
type failure struct {
	once   sync.Once
	err    error // read after the goroutines are done
	cancel context.CancelFunc
}

func withFailure(ctx context.Context) (context.Context, *failure) {
	c, cancel := context.WithCancel(ctx)
	return c, &failure{cancel: cancel}
}

func (f *failure) fail(err error) {
	f.once.Do(func() { f.err = err })
	f.cancel()
}
