package validate

import (
	"context"
	"fmt"
	"sync"

	"github.com/moeprep/moeprep/validate/moelayer"
)

// layerPace paces the readers of one layer's bank expert steps in a
// streamed GPU run: the fused bank's upload, the GPU unfused path and the
// CPU reference read the same steps, each at its own speed. A step goes
// (release) once every reader that reads it is done with it; a reader may
// take an expert only while it is at most window steps ahead of the first
// step not yet gone, so memory holds the pass's budget and at most window
// steps more, however far apart the readers are. The byte proof, the
// pass's other user of every step, is held to the same window: a reader
// may take the expert at position i only once the proof has taken the
// step window positions before it (proofPast), so the readers never make
// the pass read past its budget for steps only the proof still holds.
type layerPace struct {
	mu      sync.Mutex
	cond    *sync.Cond
	pos     map[int]int // bank expert -> its position in the pass's order
	order   []int       // position -> bank expert
	left    []int       // per position: readers not yet done with it
	doneBy  [][]bool    // per reader, per position
	low     int         // the first position not yet released
	window  int
	release func(bank int)
	// proofPast waits until the byte proof has taken a bank expert's step
	// (nil: nothing to wait for).
	proofPast func(ctx context.Context, bank int) error
}

// The readers of a layer's bank steps.
const (
	readerBank    = iota // the fused bank's upload: every bank expert
	readerUnfused        // the GPU unfused path: the routed experts
	readerRef            // the CPU reference: the routed experts
	numReaders
)

// newLayerPace paces order (the bank experts in the pass's order); the
// routed experts are bank experts 0 to routed-1, the rest shared
// replicas, which only the bank reads. readers says which readers run;
// window is how many steps a reader may run ahead (at least 1), of the
// other readers and of the byte proof (proofPast, nil: no proof).
func newLayerPace(order []int, routed int, readers [numReaders]bool, window int, release func(bank int), proofPast func(ctx context.Context, bank int) error) *layerPace {
	p := &layerPace{pos: map[int]int{}, order: order, left: make([]int, len(order)), window: max(window, 1), release: release, proofPast: proofPast}
	p.cond = sync.NewCond(&p.mu)
	for range numReaders {
		p.doneBy = append(p.doneBy, make([]bool, len(order)))
	}
	for i, b := range order {
		p.pos[b] = i
		for r := range numReaders {
			if readers[r] && (r == readerBank || b < routed) {
				p.left[i]++
			} else {
				p.doneBy[r][i] = true
			}
		}
	}
	for i, n := range p.left {
		if n == 0 {
			release(order[i]) // no reader reads it
		}
	}
	p.advance()
	return p
}

// reader is reader r's view of the pace.
func (p *layerPace) reader(r int) moelayer.Pace { return paceReader{p, r} }

type paceReader struct {
	p *layerPace
	r int
}

func (pr paceReader) Take(ctx context.Context, b int) error { return pr.p.take(ctx, b) }
func (pr paceReader) Done(b int)                            { pr.p.done(pr.r, b) }

// take waits until bank expert b is within the window of the first step
// not yet released and of the byte proof's last taken step, or ctx ends;
// once ctx has ended it refuses at once, within the window too, so that a
// reader stops at its next expert when the layer has failed elsewhere.
func (p *layerPace) take(ctx context.Context, b int) error {
	i, ok := p.pos[b]
	if !ok {
		return fmt.Errorf("bank expert %d is not in the layer's pass", b)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.proofPast != nil && i >= p.window {
		if err := p.proofPast(ctx, p.order[i-p.window]); err != nil {
			return err
		}
	}
	return condWait(ctx, p.cond, func() bool { return p.low+p.window > i }, nil)
}

// condWait waits on cond (its lock not held by the caller) until ready
// reports true or ctx ends, calling before (when set) ahead of each wait;
// both run under the lock.
func condWait(ctx context.Context, cond *sync.Cond, ready func() bool, before func()) error {
	stop := context.AfterFunc(ctx, func() {
		cond.L.Lock()
		cond.Broadcast()
		cond.L.Unlock()
	})
	defer stop()
	cond.L.Lock()
	defer cond.L.Unlock()
	for !ready() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if before != nil {
			before()
		}
		cond.Wait()
	}
	return nil
}

// done marks reader r done with bank expert b (again: nothing).
func (p *layerPace) done(r, b int) {
	i, ok := p.pos[b]
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mark(r, i)
	p.advance()
}

// finish marks reader r done with every step: it ended, and the others
// must not wait for it.
func (p *layerPace) finish(r int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.order {
		p.mark(r, i)
	}
	p.advance()
}

func (p *layerPace) mark(r, i int) {
	if p.doneBy[r][i] {
		return
	}
	p.doneBy[r][i] = true
	if p.left[i]--; p.left[i] == 0 {
		p.release(p.order[i])
	}
}

// advance moves low past the released steps and wakes the waiting readers.
func (p *layerPace) advance() {
	for p.low < len(p.left) && p.left[p.low] == 0 {
		p.low++
	}
	p.cond.Broadcast()
}
