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
// steps more, however far apart the readers are.
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
// window is how many steps a reader may run ahead (at least 1).
func newLayerPace(order []int, routed int, readers [numReaders]bool, window int, release func(bank int)) *layerPace {
	p := &layerPace{pos: map[int]int{}, order: order, left: make([]int, len(order)), window: max(window, 1), release: release}
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
// not yet released, or ctx ends; once ctx has ended it refuses at once,
// within the window too, so that a reader stops at its next expert when
// the layer has failed elsewhere.
func (p *layerPace) take(ctx context.Context, b int) error {
	i, ok := p.pos[b]
	if !ok {
		return fmt.Errorf("bank expert %d is not in the layer's pass", b)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.low+p.window <= i {
		if err := ctx.Err(); err != nil {
			return err
		}
		p.cond.Wait()
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
