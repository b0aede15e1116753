package stream

import (
	"io"

	"github.com/moeprep/moeprep/checkpoint"
)

// Install routes the reads of c's stored tensors through the pass: a read
// that one of the planned extents covers waits for its step and is copied
// from the step's buffer; any other read, or one of a step every user has
// released, goes to the tensor's own reader. Views of c made from now on
// read through their base tensor, so they are served too.
func (p *Pass) Install(c *checkpoint.Checkpoint) {
	for _, t := range c.Tensors {
		if _, ok := p.tensors[t]; ok {
			t.Data = &windowData{p: p, t: t, r: t.Data}
		}
	}
}

// windowData is a tensor's reader while a pass runs.
type windowData struct {
	p *Pass
	t *checkpoint.Tensor
	r io.ReaderAt // the tensor's own reader
}

func (w *windowData) ReadAt(b []byte, off int64) (int, error) {
	if held, done, ok := w.Lend(off, int64(len(b))); ok {
		n := copy(b, held)
		done()
		return n, nil
	}
	if w.assemble(b, off) {
		return len(b), nil
	}
	w.p.misses.Add(1)
	n, err := w.r.ReadAt(b, off)
	w.p.missed.Add(int64(n))
	return n, err
}

// Lend returns the tensor's bytes [off, off+n) where a step still holds
// them, pinned (its buffers stay until done is called), waiting for the
// step to be read first (a step waits only for the reads before it).
func (w *windowData) Lend(off, n int64) ([]byte, func(), bool) {
	p := w.p
	end := off + n
	for _, h := range p.tensors[w.t] {
		if h.off > off || h.off+h.n < end {
			continue
		}
		st := p.steps[h.i]
		p.want(int(h.i))
		<-st.ready
		p.mu.Lock()
		if st.freed || st.skip || st.err != nil {
			p.mu.Unlock()
			continue
		}
		st.pins++
		p.mu.Unlock()
		x := st.ext[h.e]
		return x.sp.buf()[x.off+off-h.off : x.off+end-h.off], func() { p.unpin(st) }, true
	}
	return nil, nil, false
}

// Want lets step i in past the budget, as a tensor read that waits for it
// does: a consumer that takes the steps in order (the byte proof) and that
// others wait on asks for the step it needs next, which the readers
// holding the budget would otherwise never let in.
func (p *Pass) Want(i int) {
	if i >= 0 && i < len(p.steps) {
		p.want(i)
	}
}

// want lets step i in past the budget: a tensor read waits for it, and
// the reader may hold steps that fill the budget until it gets it (an
// expert's job holds the layer's head and its earlier steps).
func (p *Pass) want(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i > p.wanted && !p.steps[i].admitted {
		p.wanted = i
		p.cond.Broadcast()
	}
}

// unpin ends a copy out of st's buffers, freeing them if it was released
// meanwhile.
func (p *Pass) unpin(st *step) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st.pins--; st.pins == 0 && st.freed {
		st.free(&p.bufs)
	}
}

// assemble copies bytes [off, off+len(b)) from the held extents that
// cover them together where no one of them does (a band of rows across
// two parts of an expert), and reports whether they did.
func (w *windowData) assemble(b []byte, off int64) bool {
	end := off + int64(len(b))
	for cur := off; cur < end; {
		found := false
		for _, h := range w.p.tensors[w.t] {
			if h.off > cur || h.off+h.n <= cur {
				continue
			}
			n := min(end, h.off+h.n) - cur
			held, done, ok := w.Lend(cur, n)
			if !ok {
				continue
			}
			copy(b[cur-off:], held)
			done()
			cur += n
			found = true
			break
		}
		if !found {
			return false
		}
	}
	return true
}

// Consumed reports bytes [off, off+n) of the tensor consumed: each step
// whose Consume extents they overlap counts them, and one whose every such
// byte is counted is handed to Options.OnConsumed.
func (w *windowData) Consumed(off, n int64) {
	p := w.p
	var done []int
	p.mu.Lock()
	for _, h := range p.tensors[w.t] {
		lo, hi := max(off, h.off), min(off+n, h.off+h.n)
		if !h.consume || lo >= hi {
			continue
		}
		st := p.steps[h.i]
		if st.consume -= hi - lo; st.consume <= 0 && !st.consumed {
			st.consumed = true
			done = append(done, int(h.i))
		}
	}
	p.mu.Unlock()
	if p.o.OnConsumed != nil {
		for _, i := range done {
			p.o.OnConsumed(i)
		}
	}
}
