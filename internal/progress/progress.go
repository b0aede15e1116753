// Package progress reports byte progress of long work on stderr: a progress
// bar when stderr is a terminal, otherwise (CI logs) a plain line every few
// seconds. Workers only call Add; they never print.
package progress

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
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

// New picks a bar for a terminal and plain lines otherwise; disabled gives Discard.
func New(w *os.File, label string, disabled bool) Reporter {
	if disabled {
		return Discard{}
	}
	if term.IsTerminal(int(w.Fd())) {
		return newBar(w, label)
	}
	return NewLines(w, label, 5*time.Second)
}

type bar struct {
	mu  sync.Mutex
	bar *progressbar.ProgressBar
}

func newBar(w io.Writer, label string) *bar {
	return &bar{bar: progressbar.NewOptions64(-1,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(label),
		progressbar.OptionShowBytes(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionClearOnFinish(),
	)}
}

func (b *bar) Total(n int64) { b.mu.Lock(); b.bar.ChangeMax64(n); b.mu.Unlock() }
func (b *bar) Add(n int64)   { b.mu.Lock(); _ = b.bar.Add64(n); b.mu.Unlock() }
func (b *bar) Done()         { b.mu.Lock(); _ = b.bar.Finish(); b.mu.Unlock() }

// Lines prints "label: 1.20 GB of 8.00 GB (15%), 1.10 GB/s, ETA 6.2 s" every
// interval (decimal units, as internal/human prints every size).
type Lines struct {
	w      io.Writer
	label  string
	total  atomic.Int64
	done   atomic.Int64
	start  time.Time
	ticker ticker
}

// NewLines starts a reporter that prints a line every interval.
func NewLines(w io.Writer, label string, interval time.Duration) *Lines {
	l := &Lines{w: w, label: label, start: time.Now()}
	l.ticker.start(interval, l.print)
	return l
}

func (l *Lines) Total(n int64) { l.total.Store(n) }
func (l *Lines) Add(n int64)   { l.done.Add(n) }

// Done stops the ticker.
func (l *Lines) Done() { l.ticker.halt() }

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
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-k.stop:
				return
			case <-t.C:
				f()
			}
		}
	}()
}

// halt stops the ticks and waits for one under way to finish.
func (k *ticker) halt() {
	k.stopOnce.Do(func() { close(k.stop) })
	k.wg.Wait()
}

func (l *Lines) print() {
	secs := time.Since(l.start).Seconds()
	rate := -1.0
	if secs > 0 {
		rate = float64(l.done.Load()) / secs
	}
	fmt.Fprintln(l.w, FormatLine(l.label, "", l.done.Load(), l.total.Load(), rate, false))
}
