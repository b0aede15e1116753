package convert

import (
	"context"
	"errors"
	"fmt"
	"github.com/zeebo/xxh3"
	"os"
	"sync"
	"sync/atomic"
)

// The direct writer: a shard is assembled in
// memory, one hash block at a time, and every finished block is hashed from
// that memory and written with O_DIRECT. The output never enters the page
// cache.
//
// Why: on this machine copying the output into the page cache is most of
// the work. Writing a 1.6 GB file through the page cache costs 2.2-3.3 s of
// system time, nearly all of it in copy_folio_from_iter_atomic: every new
// page-cache page faults memory back from the host (the VM reports its free
// pages: page_reporting). The same bytes written with O_DIRECT cost 0.1-0.3 s
// of system time and finish sooner, fsync included (2.4-3.1 s against
// 4.6-5.3 s). The blocks hashed from memory no longer need reading back.
//
// How: chunks are still read in source order, each straight into the
// staging buffer of every block it lands in. A block is written once its
// last byte is in. Reading in source order fills several blocks at once (a
// stacked layer fills its gate, up and down regions side by side, and a
// block that spans two tensors stays open until both are read), so up to
// maxStaged blocks are staged at a time. When every staging buffer holds an
// unfinished block, the next new block is spilled: its bytes go through the
// page cache as in the buffered writer and it is hashed by reading it back.
// The output bytes are the same either way.
//
// Where the file system refuses O_DIRECT (tmpfs, some network file systems)
// the shard is written through the page cache (shardwrite.go); a direct
// write refused with EINVAL mid-way sends that block and the rest through
// the page cache too.

// maxStaged is the most blocks a shard stages at once: with 4 MiB blocks,
// 32 MiB a shard, --jobs shards at a time. A DeepSeek-V3-shaped layer keeps
// about five open (gate, up and down fronts, and the blocks across tensor
// boundaries).
var maxStaged = 8 // a variable: tests shrink it to make blocks spill

// directAlign is the alignment O_DIRECT needs of offsets, lengths and
// memory: the largest logical block size of common disks. Blocks start at
// multiples of the block size, a multiple of this; the last one is written
// rounded up and the file truncated after.
const directAlign = 4096

// directIO says whether shards are written with O_DIRECT where the file
// system allows it; Options.BufferedIO and the tests turn it off.
var directIO = true

// onDirectStats, when set (tests), hears what the direct writer did for each shard.
var onDirectStats func(shard string, st *directStats)

// writeDirectAt is the direct write; tests make it fail.
var writeDirectAt = (*os.File).WriteAt

// directShard is the state of one shard written by the direct writer. The
// single reader owns left, staged and spilled; the writers own the rest.
type directShard struct {
	sw   *shardWriter
	dout *os.File // the shard opened with O_DIRECT

	left    []int64  // bytes of each block not yet in
	staged  [][]byte // each block's staging buffer while it fills
	spilled []bool   // blocks written through the page cache
	open    int      // blocks staged and not yet finished

	free  chan []byte    // buffers back from the writers
	made  int            // buffers allocated
	frees []func()       // unmap every buffer allocated
	done  chan doneBlock // finished blocks, to hash and write
	stats directStats

	direct atomic.Bool // false once a direct write was refused
	padded atomic.Bool // the last block was written rounded up
}

// doneBlock is a finished block and its staging buffer (nil: spilled).
type doneBlock struct {
	b   int64
	buf []byte
}

// directStats counts how the direct writer wrote a shard's blocks, for tests.
type directStats struct {
	direct, spilled, buffered atomic.Int64 // blocks written each way
}

// newDirectShard is the direct writer's state for sw's shard, every block
// still to fill.
func newDirectShard(sw *shardWriter, dout *os.File) *directShard {
	nb := (sw.size + sw.bs - 1) / sw.bs
	d := &directShard{sw: sw, dout: dout,
		left: make([]int64, nb), staged: make([][]byte, nb), spilled: make([]bool, nb),
		free: make(chan []byte, maxStaged), done: make(chan doneBlock, nb)}
	d.direct.Store(true)
	for b := range d.left {
		d.left[b] = min(sw.bs, sw.size-int64(b)*sw.bs)
	}
	return d
}

// writeDirect fills and writes every block of the shard; the caller has
// written nothing yet and syncs, checks and renames after.
func (sw *shardWriter) writeDirect(ctx context.Context, dout *os.File, header []byte, chunks []*chunk, progress func(int64)) (st *directStats, err error) {
	d := newDirectShard(sw, dout)
	nb := len(d.left)
	defer d.release()

	wctx, f := withFailure(ctx)
	defer f.cancel()
	fail := f.fail
	// One writer: four, with 32 staging buffers, were no faster on A, cold
	// (4.49 s against 4.54 s, medians of 5 rotated rounds).
	var writers sync.WaitGroup
	writers.Go(func() {
		if err := d.write(wctx); err != nil {
			fail(err)
		}
	})
	if err := d.fill(wctx, 0, header); err != nil {
		fail(fmt.Errorf("%s: writing the header: %w", sw.path, err))
	} else {
		progress(int64(len(header)))
	}
	var scratch []byte
	for _, c := range chunks {
		if wctx.Err() != nil {
			break
		}
		err := d.put(wctx, c, &scratch)
		sw.chunkDone(c)
		if err != nil {
			fail(err)
			break
		}
		progress(c.n)
	}
	close(d.done)
	writers.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if f.err != nil {
		return nil, f.err
	}
	for b, n := range d.left {
		if n != 0 {
			return nil, fmt.Errorf("%s: block %d of %d was not written (a planning bug)", sw.path, b, nb)
		}
	}
	if d.padded.Load() {
		if err := sw.out.Truncate(sw.size); err != nil {
			return nil, fmt.Errorf("%s: truncating the last block's padding: %w", sw.path, err)
		}
	}
	return &d.stats, nil
}

// put reads one chunk into the blocks it lands in: straight into their
// staging buffers, or through scratch when the part is transformed (folding
// needs whole elements, and a block boundary may split one; dequantising
// computes the bytes) or the block was spilled.
func (d *directShard) put(ctx context.Context, c *chunk, scratch *[]byte) error {
	r, _ := d.sw.ownSource(c.p)
	buf := func(n int64) []byte {
		if int64(cap(*scratch)) < n {
			*scratch = make([]byte, max(n, chunkSize))
		}
		return (*scratch)[:n]
	}
	var whole []byte
	var src *xxh3.Hasher // the source bytes read piece by piece, for the chunk's digest
	if c.p.transformed() {
		whole = buf(c.n)
		if err := c.read(whole, r, d.sw.srcSums); err != nil {
			return err
		}
	} else {
		src = xxh3.New()
	}
	bs := d.sw.bs
	for lo := int64(0); lo < c.n; {
		off := c.dst + lo
		b := off / bs
		hi := min(c.n, (b+1)*bs-c.dst)
		stage, err := d.stage(ctx, b)
		if err != nil {
			return err
		}
		switch {
		case stage != nil && whole != nil:
			copy(stage[off-b*bs:], whole[lo:hi])
		case stage != nil:
			p := stage[off-b*bs : off-b*bs+hi-lo]
			if err = r.readAt(p, c.pos+lo); err == nil {
				src.Write(p)
			}
		default:
			p := whole
			if p == nil {
				p = buf(hi - lo)
				if err = r.readAt(p, c.pos+lo); err == nil {
					src.Write(p)
				}
			} else {
				p = p[lo:hi]
			}
			if err == nil {
				if _, err = d.sw.out.WriteAt(p, off); err != nil {
					err = fmt.Errorf("%s: writing tensor %s: %w", d.sw.path, c.p.tensor, err)
				}
			}
		}
		if err != nil {
			return err
		}
		d.filled(b, hi-lo)
		lo = hi
	}
	if src != nil {
		d.sw.srcSums.set(c, src)
	}
	return nil
}

// fill puts bytes held in memory (the header) at off.
func (d *directShard) fill(ctx context.Context, off int64, p []byte) error {
	bs := d.sw.bs
	for len(p) > 0 {
		b := off / bs
		n := min(int64(len(p)), (b+1)*bs-off)
		stage, err := d.stage(ctx, b)
		if err != nil {
			return err
		}
		if stage != nil {
			copy(stage[off-b*bs:], p[:n])
		} else if _, err := d.sw.out.WriteAt(p[:n], off); err != nil {
			return err
		}
		d.filled(b, n)
		off, p = off+n, p[n:]
	}
	return nil
}

// stage returns block b's staging buffer, giving it one when it has none
// yet, or nil when the block is spilled.
func (d *directShard) stage(ctx context.Context, b int64) ([]byte, error) {
	if d.spilled[b] {
		return nil, nil
	}
	if d.staged[b] != nil {
		return d.staged[b], nil
	}
	var buf []byte
	select {
	case buf = <-d.free:
	default:
		switch {
		case d.made < maxStaged:
			b, free, err := alignedBuffer(int(d.sw.bs))
			if err != nil {
				return nil, fmt.Errorf("%s: a staging buffer of %d bytes: %w", d.sw.path, d.sw.bs, err)
			}
			buf = b
			d.frees = append(d.frees, free)
			d.made++
		case d.made > d.open:
			// Some buffers are with the writer, which always hands them back.
			select {
			case buf = <-d.free:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	if buf == nil {
		d.spilled[b] = true
		return nil, nil
	}
	d.staged[b] = buf
	d.open++
	return buf, nil
}

// filled notes n more bytes of block b in and hands the block to the writer
// when it is complete.
func (d *directShard) filled(b, n int64) {
	if d.left[b] -= n; d.left[b] != 0 {
		return
	}
	buf := d.staged[b]
	if buf != nil {
		d.staged[b] = nil
		d.open--
	}
	d.done <- doneBlock{b, buf} // never blocks: the channel holds every block
}

// write hashes and writes finished blocks until there are no more, handing
// every buffer back, also after an error.
func (d *directShard) write(ctx context.Context) error {
	sw := d.sw
	h := sw.algo.New()
	var readBack []byte
	var first error
	for db := range d.done {
		if ctx.Err() != nil || first != nil {
			d.giveBack(db.buf)
			continue
		}
		off := db.b * sw.bs
		n := min(sw.bs, sw.size-off)
		if db.buf == nil {
			if readBack == nil {
				readBack = make([]byte, hashBufSize)
			}
			first = sw.hashBlock(h, readBack, db.b)
			d.stats.spilled.Add(1)
			continue
		}
		h.Reset()
		h.Write(db.buf[:n])
		h.Sum(sw.sums[db.b][:0])
		first = d.writeBlock(db.buf, off, n)
		d.giveBack(db.buf)
	}
	return first
}

func (d *directShard) giveBack(buf []byte) {
	if buf != nil {
		d.free <- buf // never blocks: the channel holds every buffer
	}
}

// writeBlock writes n bytes of buf at off: with O_DIRECT, rounded up to
// directAlign, or through the page cache once O_DIRECT was refused.
func (d *directShard) writeBlock(buf []byte, off, n int64) error {
	if d.direct.Load() {
		m := (n + directAlign - 1) / directAlign * directAlign
		clear(buf[n:m])
		_, err := writeDirectAt(d.dout, buf[:m], off)
		if err == nil {
			if m > n {
				d.padded.Store(true)
			}
			d.stats.direct.Add(1)
			return nil
		}
		if !directRefused(err) {
			return fmt.Errorf("%s: writing bytes %d..%d: %w", d.sw.path, off, off+n, err)
		}
		d.direct.Store(false)
	}
	if _, err := d.sw.out.WriteAt(buf[:n], off); err != nil {
		return fmt.Errorf("%s: writing bytes %d..%d: %w", d.sw.path, off, off+n, err)
	}
	d.stats.buffered.Add(1)
	return nil
}

// release frees the staging buffers once the writer is done with them.
func (d *directShard) release() {
	for _, free := range d.frees {
		free()
	}
	d.frees = nil
}

// errDirectUnsupported says this platform has no O_DIRECT.
var errDirectUnsupported = errors.New("direct I/O is not supported here")
