// Package progress reports byte progress of long work on stderr, in one
// style for every command: a line with a bar redrawn in place when stderr
// is a terminal, fitted to its width, otherwise (CI logs) a plain line every
// few seconds. Workers only call Add; they never print.
package progress

import (
	"os"
	"sync"
	"time"
)

// Reporter counts bytes of work done.
type Reporter interface {
	// Total sets the number of bytes the whole job will process.
	Total(n int64)
	// Add records n more bytes done. Safe for concurrent use.
	Add(n int64)
	// Done stops reporting; the caller prints its own summary.
	Done()
}

// Discard reports nothing.
type Discard struct{}

func (Discard) Total(int64) {}
func (Discard) Add(int64)   {}
func (Discard) Done()       {}

// New reports on w for a job with no stages (convert, inspect --read,
// fixture synth), in the same style as validate's Status: a line redrawn
// in place on a terminal, a plain line every five seconds elsewhere;
// disabled gives Discard.
func New(w *os.File, label string, disabled bool) Reporter {
	if disabled {
		return Discard{}
	}
	return NewStatusFor(w, w, label)
}

// ticker calls a reporter's function every interval, on a goroutine of its
// own, until halted.
type ticker struct {
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

func (k *ticker) start(interval time.Duration, f func()) {
	k.stop = make(chan struct{})
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		Every(interval, k.stop, func() bool { f(); return true })
	}()
}

// Every calls f every interval until done is closed or f returns false
// (a watcher that has seen what it waited for).
func Every(interval time.Duration, done <-chan struct{}, f func() bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			if !f() {
				return
			}
		}
	}
}

// halt stops the ticks and waits for one under way to finish.
func (k *ticker) halt() {
	k.stopOnce.Do(func() { close(k.stop) })
	k.wg.Wait()
}
