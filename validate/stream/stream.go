// Package stream reads the bytes a validate run needs once, in a planned
// order, ahead of the code that uses them, in bounded memory.
//
// A plan is a list of steps, each a set of extents: byte ranges of stored
// tensors or of files. A Pass reads the steps in order, a few reads in
// flight and as far ahead as its budget allows, and holds each step until
// every consumer planned for it has released it. Consumers take a step's
// bytes directly (Bytes: the byte proof hashes and compares them), or read
// a tensor as they always do: Install routes a checkpoint's tensor reads
// to the steps that hold those bytes, so a loader that knows nothing of
// the pass finds its expert already in memory. A read that no held step
// covers goes to the file as before (Misses counts them): the plan decides
// how fast the run goes, never what it reads.
//
// Files are read with O_DIRECT where the file system takes it: a cold read
// then costs the CPU almost nothing (buffered reads of this development
// machine's disk cost about a second of system time per GB, BENCHMARKS.md),
// and the bytes go once from the disk into the step's buffer.
package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/internal/cores"
)

// Extent is a byte range of a stored tensor (T set: Off counts from its
// first byte) or of a file (T nil: Off counts from the file's start).
type Extent struct {
	T      *checkpoint.Tensor
	File   string
	Off, N int64
	// Consume: a reader reports these bytes consumed (Consumed) as it
	// finishes with them; once every such byte of a step is reported, the
	// step loses one user through Options.OnConsumed.
	Consume bool
}

// Step is extents read together and released together.
type Step struct {
	Extents []Extent
	// Users is how many Release calls free the step (0 counts as 1).
	Users int
	// Trailing marks a step that only a fast reader takes after the
	// others (validate's byte proof, the rest of DST after the layers):
	// the default budget is four of the largest other step, and two of
	// the largest trailing one (one read while the other is taken), so
	// that one large trailing step does not let the reads run far ahead
	// of the steps that consumers hold for long.
	Trailing bool
}

// Options size a Pass.
type Options struct {
	// Budget bounds the bytes held: read ahead, or read and not yet
	// released by every user. A step larger than the budget is still read,
	// alone. 0: four of the largest step that is not Trailing, or two of
	// the largest Trailing one where that is more, within [MinBudget,
	// MaxBudget].
	Budget int64
	// Depth is how many reads are in flight (0: DefaultDepth).
	Depth int
	// Buffered turns O_DIRECT off: every read goes through the page cache.
	Buffered bool
	// OnRead, when set, is told the bytes each read brought in for a step
	// (called from the reading goroutines).
	OnRead func(step int, n int64)
	// OnConsumed, when set, is told once of each step whose Consume
	// extents have all been reported consumed (called from the reader
	// that reported the last of them, outside the pass's lock): the
	// caller releases its user of the step there, once.
	OnConsumed func(step int)
}

// The default budget: four steps of the largest, enough to keep reads in
// flight ahead of consumers that hold a few (a layer's head, an expert a
// worker; two of a Trailing step, which its reader takes at once),
// within bounds that do not grow with the model: at most MaxBudget, about
// six DeepSeek-V3 expert steps (SRC's and DST's 44 MB in FP8 each).
const (
	MinBudget = 64 << 20
	MaxBudget = 512 << 20
)

// DefaultDepth is the reads in flight: four 4 MB O_DIRECT reads keep this
// development machine's disk as busy as cat does (BENCHMARKS.md, issue 31).
const DefaultDepth = 4

// directAlign is the alignment of O_DIRECT offsets, lengths and buffers:
// the largest logical block size of the disks moeprep meets.
const directAlign = 4096

// maxGap is the most unwanted bytes a read takes in to join two extents of
// one file into one request: a page, the padding convert leaves between
// tensors.
const maxGap = 4 << 10

// Pass reads a plan's steps.
type Pass struct {
	o     Options
	steps []*step

	mu      sync.Mutex
	cond    *sync.Cond
	held    int64
	next    int // the next step to admit
	wanted  int // the furthest step a tensor read waits for, -1: none
	closed  bool
	runErr  error
	tensors map[*checkpoint.Tensor][]held // planned extents of each tensor, by tensor
	files   map[string]*file
	misses  atomic.Int64
	reads   atomic.Int64 // reads of the files and readers (tests)
	missed  atomic.Int64 // the bytes those reads took
	bufs    buffers
	wg      sync.WaitGroup
	cancel  context.CancelFunc
}

// held is one planned extent of a tensor: step i's extent e (consume:
// its bytes count towards the step's consumption).
type held struct {
	i, e    int32
	off, n  int64
	consume bool
}

type step struct {
	users   int
	size    int64      // bytes wanted
	mem     int64      // what holding them costs: the buffers' sizes (the budget's unit)
	spans   []span     // its reads, allocated together
	ext     []extentAt // per extent: where its bytes are
	pending int        // spans not yet read
	ready   chan struct{}
	err     error
	// admitted: counted in the budget (unless skip: released before it
	// was read, so never read); freed: released by every user.
	admitted, skip, freed bool
	pins                  int // readers copying out of its buffers now
	// consume is the bytes of its Consume extents not yet reported
	// consumed; consumed, that OnConsumed was told.
	consume  int64
	consumed bool
}

// extentAt locates an extent in a span's buffer.
type extentAt struct {
	sp  *span
	off int64 // within sp.buf's wanted bytes
	n   int64
}

// span is one read: bytes [off, off+n) of a file (or of a tensor's own
// reader when it is not a plain file range). A step of a small model's
// expert is a few reads of a kilobyte, and a pass of 200,000 tensors has
// as many spans: they are kept small, and a step's allocated together.
type span struct {
	f      *file
	r      io.ReaderAt // when f is nil: the tensor's reader
	off, n int64
	mem    []byte // what the wanted bytes were read into (returned to the pool, or the joint read's)
	at     int32  // where the wanted bytes start in mem (under an O_DIRECT block)
	step   int32
	read   bool   // the read is over (under the pass's lock)
	j      *joint // the read that takes this span with its neighbours, if any
}

// joint is one read of small spans of nearby steps that lie side by side
// in a file: a small model's expert is a few reads of a kilobyte or two
// (each stacked weight's slice of it, and its scales), and a stacked
// weight's slices of consecutive experts touch, so one read of up to
// maxJoint bytes takes many of them (the 208,215-tensor checkpoint of issue
// 45: 163,000 reads of a kilobyte a validate run, before). The first of
// its steps to be let in reads it; each span then points into its buffer,
// which goes back to the pool when the last of them is freed. The steps
// after the first are read before the budget counts them: at most maxJoint
// bytes a joint, a few joints at once.
type joint struct {
	f       *file
	off, n  int64   // the bytes read: from the first span's start to the last one's end
	members []*span // in file order
	sent    bool    // a reader has it (under the pass's lock)
	mem     []byte
	at      int32 // where off lies in mem
	refs    int   // members holding mem
}

// Joint reads: spans of at most maxJoinSpan bytes, of steps at most
// maxJoinSteps apart, at most maxGap apart in their file, in reads of at
// most maxJoint bytes. Small enough that what a joint holds before the
// budget counts it, or after its first step is freed, is a rounding error
// of the budget (MinBudget: 64 MiB).
const (
	maxJoinSpan  = 256 << 10
	maxJoint     = 1 << 20
	maxJoinSteps = 64
	// maxOpenRuns bounds the runs a file keeps open, so that a plan whose
	// small spans never continue one another costs a bounded look each: an
	// expert's step continues 6-12 runs of a file (each stacked weight and
	// its scales).
	maxOpenRuns = 32
)

// buf is the wanted bytes, once read.
func (sp *span) buf() []byte { return sp.mem[sp.at : int64(sp.at)+sp.n] }

// file is one file a pass reads, opened on first use.
type file struct {
	path   string
	once   sync.Once
	direct *os.File // nil when O_DIRECT is not available
	plain  *os.File
	err    error
	noDir  atomic.Bool // O_DIRECT refused a read: read through the cache
}

// New resolves a plan's extents to reads. Nothing is read before Start.
func New(steps []Step, o Options) (*Pass, error) {
	if o.Depth <= 0 {
		o.Depth = DefaultDepth
	}
	p := &Pass{o: o, tensors: map[*checkpoint.Tensor][]held{}, files: map[string]*file{}, wanted: -1}
	p.cond = sync.NewCond(&p.mu)
	var largest, trailing int64
	for i, s := range steps {
		st := &step{users: max(s.Users, 1), ready: make(chan struct{})}
		if err := p.resolve(i, st, s.Extents); err != nil {
			return nil, err
		}
		p.steps = append(p.steps, st)
		if s.Trailing {
			trailing = max(trailing, st.mem)
		} else {
			largest = max(largest, st.mem)
		}
	}
	if p.o.Budget <= 0 {
		p.o.Budget = min(max(4*largest, 2*trailing, MinBudget), MaxBudget)
	}
	p.bufs.keep = p.o.Budget
	p.join()
	return p, nil
}

// join gathers the small spans of nearby steps that lie side by side in a
// file into joint reads. Spans are taken in plan order; a file has a joint
// open for each run of its spans being read in that order (an expert's
// step takes a slice of each of the layer's stacked weights: the next
// expert's slices continue each run), and a small span extends the run it
// continues (within maxGap) where it fits, or opens one. A run whose first
// step is more than maxJoinSteps back is closed.
func (p *Pass) join() {
	type open struct {
		members   []*span
		end       int64
		firstStep int32
	}
	opens := map[*file][]*open{}
	closeJoint := func(o *open) {
		if len(o.members) < 2 {
			return
		}
		first := o.members[0]
		j := &joint{f: first.f, off: first.off, n: o.end - first.off, members: slices.Clip(o.members)}
		for _, m := range j.members {
			m.j = j
		}
	}
	for i, st := range p.steps {
		if i%maxJoinSteps == 0 { // close the runs no span can extend any more
			for f, os := range opens {
				os = slices.DeleteFunc(os, func(o *open) bool {
					if int32(i)-o.firstStep > maxJoinSteps {
						closeJoint(o)
						return true
					}
					return false
				})
				if len(os) == 0 {
					delete(opens, f) // the look costs the files read now, not every file read so far
				} else {
					opens[f] = os
				}
			}
		}
		for k := range st.spans {
			sp := &st.spans[k]
			if sp.f == nil || sp.n > maxJoinSpan {
				continue
			}
			extended := false
			for _, o := range opens[sp.f] {
				if sp.off >= o.end && sp.off <= o.end+maxGap && sp.off+sp.n-o.members[0].off <= maxJoint && sp.step-o.firstStep <= maxJoinSteps {
					o.members = append(o.members, sp)
					o.end = sp.off + sp.n
					extended = true
					break
				}
			}
			if !extended {
				if os := opens[sp.f]; len(os) == maxOpenRuns { // the oldest run goes: each span looks through at most this many
					closeJoint(os[0])
					opens[sp.f] = slices.Delete(os, 0, 1)
				}
				opens[sp.f] = append(opens[sp.f], &open{members: []*span{sp}, end: sp.off + sp.n, firstStep: sp.step})
			}
		}
	}
	for _, os := range opens {
		for _, o := range os {
			closeJoint(o)
		}
	}
}

// where is an extent as a file range, or a range of a reader that is not
// one.
type where struct {
	f   *file
	r   io.ReaderAt
	off int64
}

// resolve turns step i's extents into its spans, joining extents of one
// file that lie close together into one read.
func (p *Pass) resolve(i int, st *step, exts []Extent) error {
	type item struct {
		e int
		w where
		n int64
	}
	var items []item
	for e, x := range exts {
		if x.Off < 0 || x.N < 0 {
			return fmt.Errorf("stream: extent %d of step %d: bytes [%d,+%d)", e, i, x.Off, x.N)
		}
		w, err := p.locate(x)
		if err != nil {
			return err
		}
		items = append(items, item{e, w, x.N})
		if x.T != nil {
			p.tensors[x.T] = append(p.tensors[x.T], held{i: int32(i), e: int32(e), off: x.Off, n: x.N, consume: x.Consume})
			if x.Consume {
				st.consume += x.N
			}
		}
	}
	st.ext = make([]extentAt, len(exts))
	// Plain file ranges sorted by file and offset; other readers alone.
	slices.SortStableFunc(items, func(a, b item) int {
		switch {
		case a.w.f == nil || b.w.f == nil:
			return 0
		case a.w.f.path != b.w.f.path:
			if a.w.f.path < b.w.f.path {
				return -1
			}
			return 1
		case a.w.off < b.w.off:
			return -1
		case a.w.off > b.w.off:
			return 1
		}
		return 0
	})
	// The spans first (a slice that then stays put), then where each
	// extent lies in them.
	at := make([]int, len(items)) // each item's span
	for j, it := range items {
		if n := len(st.spans); it.w.f != nil && n > 0 && st.spans[n-1].f == it.w.f && it.w.off <= st.spans[n-1].off+st.spans[n-1].n+maxGap {
			cur := &st.spans[n-1]
			cur.n = max(cur.n, it.w.off+it.n-cur.off)
		} else {
			st.spans = append(st.spans, span{step: int32(i), f: it.w.f, r: it.w.r, off: it.w.off, n: it.n})
		}
		at[j] = len(st.spans) - 1
	}
	st.spans = slices.Clone(st.spans) // no room left to grow into
	for j, it := range items {
		sp := &st.spans[at[j]]
		st.ext[it.e] = extentAt{sp: sp, off: it.w.off - sp.off, n: it.n}
	}
	for k := range st.spans {
		sp := &st.spans[k]
		st.size += sp.n
		lo := sp.off &^ (directAlign - 1) // an O_DIRECT read starts on a block, and ends on one
		st.mem += bufSize(sp.off + sp.n + directAlign - lo)
	}
	return nil
}

// locate finds an extent's bytes: a range of a plain file where the
// tensor's reader is a section of one (safetensors), else its reader.
func (p *Pass) locate(x Extent) (where, error) {
	if x.T == nil {
		return where{f: p.file(x.File), off: x.Off}, nil
	}
	if x.Off+x.N > x.T.NumBytes() {
		return where{}, fmt.Errorf("stream: %s: bytes [%d,+%d) of a %d-byte tensor", x.T.Name, x.Off, x.N, x.T.NumBytes())
	}
	if sr, ok := x.T.Data.(*io.SectionReader); ok {
		if r, base, _ := sr.Outer(); r != nil {
			if f, ok := r.(*os.File); ok {
				return where{f: p.file(f.Name()), off: base + x.Off}, nil
			}
		}
	}
	return where{r: x.T.Data, off: x.Off}, nil
}

func (p *Pass) file(path string) *file {
	f, ok := p.files[path]
	if !ok {
		f = &file{path: path}
		p.files[path] = f
	}
	return f
}

// Start reads the steps in the background until they are all read, ctx
// ends or Close.
func (p *Pass) Start(ctx context.Context) {
	ctx, p.cancel = context.WithCancel(ctx)
	jobs := make(chan *span)
	// Each reader blocks in pread for milliseconds at a time, holding a P
	// while it does: lend the runtime one P a reader, given back when the
	// last reader ends, so the consumers keep every core (package cores).
	giveBack := cores.Lend(p.o.Depth)
	var readers atomic.Int32
	readers.Store(int32(p.o.Depth))
	for range p.o.Depth {
		p.wg.Go(func() {
			defer func() {
				if readers.Add(-1) == 0 {
					giveBack()
				}
			}()
			for sp := range jobs {
				if sp.j != nil {
					p.doneJoint(sp.j, p.readJoint(sp.j))
				} else {
					p.done(sp, p.read(sp))
				}
			}
		})
	}
	p.wg.Go(func() {
		defer close(jobs)
		for i, st := range p.steps {
			if !p.admit(i) {
				return
			}
			if st.skip {
				continue
			}
			for k := range st.spans {
				sp := &st.spans[k]
				if sp.j != nil && !p.claim(sp.j) {
					continue // an earlier step's span read it, or reads it now
				}
				select {
				case jobs <- sp:
				case <-ctx.Done():
					if sp.j != nil {
						p.doneJoint(sp.j, ctx.Err())
					} else {
						p.done(sp, ctx.Err()) // the step ends, failed
					}
				}
			}
		}
	})
	go func() {
		<-ctx.Done()
		p.stop(ctx.Err())
	}()
}

// admit waits until step i fits the budget (a step when nothing else is
// held always fits, and so does one a tensor read is waiting for: its
// reader may hold what fills the budget) and reports false once the pass
// is stopped. A step its users released before it was read is not read at
// all.
func (p *Pass) admit(i int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.steps[i]
	for !p.closed && !st.freed && p.held > 0 && p.held+st.mem > p.o.Budget && p.wanted < i {
		p.cond.Wait()
	}
	if p.closed {
		return false
	}
	p.next = i + 1
	st.admitted = true
	st.skip = st.freed
	if !st.skip {
		p.held += st.mem
		// Spans a joint read of an earlier step took are read already,
		// or come with it.
		for k := range st.spans {
			if !st.spans[k].read {
				st.pending++
			}
		}
	}
	if st.skip || st.pending == 0 {
		close(st.ready)
	}
	return true
}

// read fills a span's buffer.
func (p *Pass) read(sp *span) error {
	if sp.f == nil {
		p.reads.Add(1)
		sp.mem, sp.at = p.bufs.get(sp.n), 0
		return readFull(sp.r, sp.buf(), sp.off)
	}
	var err error
	sp.mem, sp.at, err = p.readRange(sp.f, sp.off, sp.n)
	return err
}

// readJoint fills a joint read's buffer.
func (p *Pass) readJoint(j *joint) error {
	var err error
	j.mem, j.at, err = p.readRange(j.f, j.off, j.n)
	return err
}

// readRange reads bytes [off, off+n) of f into a buffer of the pool: the
// buffer, and where the bytes start in it.
func (p *Pass) readRange(f *file, off, n int64) ([]byte, int32, error) {
	p.reads.Add(1)
	f.once.Do(func() { f.open(p.o.Buffered) })
	if f.err != nil {
		return nil, 0, f.err
	}
	if f.direct != nil && !f.noDir.Load() {
		lo := off &^ (directAlign - 1)
		hi := (off + n + directAlign - 1) &^ (directAlign - 1)
		mem := p.bufs.get(hi - lo)
		got, err := f.direct.ReadAt(mem, lo)
		if got >= int(off+n-lo) {
			return mem, int32(off - lo), nil
		}
		p.bufs.put(mem)
		if !errors.Is(err, syscall.EINVAL) {
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, 0, fmt.Errorf("%s: %w", f.path, err)
		}
		f.noDir.Store(true) // the file system takes no O_DIRECT reads here
	}
	mem := p.bufs.get(n)
	if err := readFull(f.plain, mem[:n], off); err != nil {
		p.bufs.put(mem)
		return nil, 0, fmt.Errorf("%s: %w", f.path, err)
	}
	return mem, 0, nil
}

func readFull(r io.ReaderAt, b []byte, off int64) error {
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

func (f *file) open(buffered bool) {
	if f.plain, f.err = os.Open(f.path); f.err != nil {
		return
	}
	if !buffered {
		if d, err := openDirect(f.path); err == nil {
			f.direct = d
		}
	}
}

// done records a span's read.
func (p *Pass) done(sp *span, err error) {
	if err == nil && p.o.OnRead != nil {
		p.o.OnRead(int(sp.step), sp.n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.steps[sp.step]
	if err != nil && st.err == nil {
		st.err = err
	}
	p.doneLocked(st, sp)
}

// doneLocked records sp's read, under the pass's lock. A span a joint
// read took ahead of its step's admission counts nothing yet: admit counts
// only the spans not read.
func (p *Pass) doneLocked(st *step, sp *span) {
	sp.read = true
	if st.freed && st.pins == 0 {
		sp.free(&p.bufs)
	}
	if !st.admitted || st.skip {
		return
	}
	if st.pending--; st.pending == 0 {
		close(st.ready)
	}
}

// claim reports whether the caller is the first to send joint j to a
// reader.
func (p *Pass) claim(j *joint) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if j.sent {
		return false
	}
	j.sent = true
	return true
}

// doneJoint records a joint read: each of its spans is read, pointing into
// its buffer, or failed with err.
func (p *Pass) doneJoint(j *joint, err error) {
	if err == nil && p.o.OnRead != nil {
		for _, m := range j.members {
			p.o.OnRead(int(m.step), m.n)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		j.refs = len(j.members)
	}
	for _, m := range j.members {
		st := p.steps[m.step]
		if err != nil {
			if st.err == nil {
				st.err = err
			}
		} else {
			m.mem, m.at = j.mem, j.at+int32(m.off-j.off)
		}
		p.doneLocked(st, m)
	}
}

// stop ends the reading: steps not admitted yet fail with err.
func (p *Pass) stop(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed, p.runErr = true, err
	for _, st := range p.steps[p.next:] {
		st.err = err
		close(st.ready)
	}
	p.next = len(p.steps)
	p.cond.Broadcast()
}

// Wait returns once step i is read, with its read error if any.
func (p *Pass) Wait(ctx context.Context, i int) error {
	st := p.steps[i]
	select {
	case <-st.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return st.err
}

// Bytes is extent e of step i, valid from Wait until the step is freed.
func (p *Pass) Bytes(i, e int) []byte {
	x := p.steps[i].ext[e]
	return x.sp.buf()[x.off : x.off+x.n]
}

// Release is one user done with step i: the last one frees its buffers.
func (p *Pass) Release(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.steps[i]
	if st.users == 0 {
		return
	}
	if st.users--; st.users > 0 {
		return
	}
	st.freed = true
	if st.admitted && !st.skip {
		p.held -= st.mem
		p.cond.Broadcast()
	}
	if st.pins == 0 {
		st.free(&p.bufs)
	}
}

// free returns the buffers of the spans read so far; the others return
// theirs as they finish (done). The pass's lock is held.
func (st *step) free(bufs *buffers) {
	for k := range st.spans {
		st.spans[k].free(bufs)
	}
}

func (sp *span) free(bufs *buffers) {
	if !sp.read || sp.mem == nil { // a read in flight frees its own (done)
		return
	}
	mem := sp.mem
	sp.mem = nil
	if j := sp.j; j != nil {
		if j.refs--; j.refs > 0 {
			return
		}
		mem, j.mem = j.mem, nil
	}
	bufs.put(mem)
}

// Close stops reading, waits for the reads in flight and frees every
// buffer; the pass is then done with.
func (p *Pass) Close() {
	if p.cancel != nil {
		p.cancel()
	}
	p.stop(errClosed)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, st := range p.steps {
		if !st.freed {
			st.freed = true
			if st.pins == 0 {
				st.free(&p.bufs)
			}
		}
	}
	for _, f := range p.files {
		for _, h := range []*os.File{f.direct, f.plain} {
			if h != nil {
				h.Close()
			}
		}
	}
	p.bufs.close()
}

var errClosed = errors.New("stream: closed")

// StepBytes is the bytes step i reads (OnRead reports them as they come).
func (p *Pass) StepBytes(i int) int64 { return p.steps[i].size }

// Budget is the bytes the pass holds at most (Options.Budget, or its
// default).
func (p *Pass) Budget() int64 { return p.o.Budget }

// Misses is how many tensor reads no step held.
func (p *Pass) Misses() int64 { return p.misses.Load() }

// MissedBytes is the bytes the tensor reads no step held read from the
// files: read again, or read around the plan.
func (p *Pass) MissedBytes() int64 { return p.missed.Load() }
