// Package cores says how many goroutines of work moeprep runs at once, and
// lends the Go runtime extra Ps while goroutines sit in blocking reads.
//
// Why: a goroutine in a read(2) or pread(2) keeps its P until the runtime's
// monitor takes it back, and that monitor sleeps up to 10 ms when it has
// found nothing to do for a while. An O_DIRECT read of a few MB takes 1-5 ms,
// so on a 2-core machine the validate pass's four readers held one core or
// both for most of each read while expert jobs waited to run (an execution
// trace of the Kimi-shaped CPU row: 0.3 s of its 0.9 s with a job runnable,
// a core idle and a reader in the kernel). Raising GOMAXPROCS by the number
// of readers while they run gives the jobs their cores back; everything that
// sizes work by the machine (job counts, worker pools) asks N, which leaves
// the lent Ps out.
package cores

import (
	"runtime"
	"sync"
	"sync/atomic"
)

var (
	mu   sync.Mutex
	lent int // Ps lent to readers now
	base int // GOMAXPROCS before the first of them was lent
	// lentBase is base while any P is lent, 0 otherwise: N reads it
	// without the lock (it is asked once an expert or a weight).
	lentBase atomic.Int64
)

// N is the number of goroutines of work to run at once: GOMAXPROCS, less
// the Ps lent to blocked readers.
func N() int {
	if b := lentBase.Load(); b > 0 {
		return int(b)
	}
	return runtime.GOMAXPROCS(0)
}

// Lend raises GOMAXPROCS by readers for as long as that many goroutines
// may block in reads; the func it returns gives them back (once, however
// often it is called). Lends nest: GOMAXPROCS is restored when the last
// is given back. Setting it turns off the runtime's own updates of
// GOMAXPROCS (a container's CPU quota changing while moeprep runs) for the
// rest of the process: a command's run is short beside such changes.
func Lend(readers int) (giveBack func()) {
	if readers <= 0 {
		return func() {}
	}
	mu.Lock()
	if lent == 0 {
		base = runtime.GOMAXPROCS(0)
		lentBase.Store(int64(base))
	}
	lent += readers
	runtime.GOMAXPROCS(base + lent)
	mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			lent -= readers
			runtime.GOMAXPROCS(base + lent)
			if lent == 0 {
				lentBase.Store(0)
			}
		})
	}
}
