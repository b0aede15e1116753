package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/term"

	"github.com/moeprep/moeprep/internal/human"
	"github.com/moeprep/moeprep/internal/termsafe"
)

// Status reports the byte progress of a job whose phases read different
// things, with what it is doing now (its stage):
//
//	validate: layer 12 (5 of 58) reading SRC experts — 41.2 GB of 120 GB (34%), 1.30 GB/s, ETA 1m05s
//
// On a terminal that line, with a bar, is redrawn in place; elsewhere (CI
// logs) it is printed every interval. The job's own messages go through
// Println, above the bar, so the two never tear each other's lines.
type Status struct {
	label  string
	tty    bool
	width  func() int // terminal columns, 0 when unknown
	now    func() time.Time
	total  atomic.Int64
	done   atomic.Int64
	ticker ticker

	mu      sync.Mutex // guards everything below and every write to w
	w       io.Writer
	stage   string
	start   time.Time
	samples []sample
	drawn   bool // a bar line is on the terminal now
}

// sample is the byte count at one tick, for the rate over the last
// rateWindow: the phases of a job run at very different speeds (validate's
// layer checks against its byte proof), and an ETA from the average since
// the start would be wrong after every change of phase.
type sample struct {
	at   time.Time
	done int64
}

const rateWindow = 30 * time.Second

// NewStatusFor starts a Status for the process's stderr: a line redrawn
// in place on tty when tty is a terminal, else a plain line on w every
// five seconds (w is where the job's other messages go, so that lines
// stay in order).
func NewStatusFor(tty *os.File, w io.Writer, label string) *Status {
	fd := int(tty.Fd())
	if term.IsTerminal(fd) {
		s := NewStatus(tty, label, true, 200*time.Millisecond)
		s.width = func() int {
			if c, _, err := term.GetSize(fd); err == nil {
				return c
			}
			return 0
		}
		return s
	}
	return NewStatus(w, label, false, 5*time.Second)
}

// NewStatus starts a Status that writes to w every interval: redrawing one
// line in place when tty is set, printing a new line otherwise.
func NewStatus(w io.Writer, label string, tty bool, interval time.Duration) *Status {
	s := &Status{w: w, label: label, tty: tty, now: time.Now, width: func() int { return 0 }}
	s.start = s.now()
	s.ticker.start(interval, s.tick)
	return s
}

// Total sets the bytes the whole job will process.
func (s *Status) Total(n int64) { s.total.Store(n) }

// Add records n more bytes done; safe for concurrent use.
func (s *Status) Add(n int64) { s.done.Add(n) }

// Stage says what the job is doing now; shown from the next line on.
func (s *Status) Stage(stage string) {
	s.mu.Lock()
	s.stage = stage
	s.mu.Unlock()
}

// Println prints msg on a line of its own (above the bar on a terminal).
func (s *Status) Println(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tty && s.drawn {
		io.WriteString(s.w, "\r\x1b[K")
		s.drawn = false
	}
	io.WriteString(s.w, termsafe.Escape(msg)+"\n")
	if s.tty {
		s.draw(s.now())
	}
}

// Done stops reporting and, on a terminal, clears the bar so that what the
// job prints next starts on a clean line.
func (s *Status) Done() {
	s.ticker.halt()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tty && s.drawn {
		io.WriteString(s.w, "\r\x1b[K")
		s.drawn = false
	}
}

func (s *Status) tick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.samples = append(s.samples, sample{now, s.done.Load()})
	for len(s.samples) > 1 && now.Sub(s.samples[0].at) > rateWindow {
		s.samples = s.samples[1:]
	}
	if s.stage == "" && s.total.Load() == 0 && s.done.Load() == 0 {
		return // nothing planned or done yet: a line would say nothing
	}
	if s.tty {
		s.draw(now)
		return
	}
	io.WriteString(s.w, s.line(now, false)+"\n")
}

// draw redraws the bar line, fitted to the terminal's width (one column
// spare, so that the cursor never wraps); s.mu is held.
func (s *Status) draw(now time.Time) {
	done, total, rate := s.measure(now)
	line := FitLine(s.label, s.stage, done, total, rate, s.width()-1)
	io.WriteString(s.w, "\r"+line+"\x1b[K")
	s.drawn = true
}

// line is the status now, for a log; s.mu is held.
func (s *Status) line(now time.Time, bar bool) string {
	done, total, rate := s.measure(now)
	return FormatLine(s.label, s.stage, done, total, rate, bar)
}

// measure is the count, the total and the rate now (bytes a second over
// the last rateWindow, else since the start; negative while not known);
// s.mu is held.
func (s *Status) measure(now time.Time) (done, total int64, rate float64) {
	done, total = s.done.Load(), s.total.Load()
	rate = -1.0
	if len(s.samples) > 0 {
		if old := s.samples[0]; now.Sub(old.at) >= time.Second && done >= old.done {
			rate = float64(done-old.done) / now.Sub(old.at).Seconds()
		}
	}
	if rate < 0 && now.Sub(s.start) >= time.Second {
		rate = float64(done) / now.Sub(s.start).Seconds()
	}
	return done, total, rate
}

// FitLine is FormatLine with a bar, made to fit width columns (0 or less:
// any width). What a narrow terminal loses first is what says least about
// how far the job is: the bar, then the label (the command the user typed),
// then the end of the stage, then the stage; the counts, the rate and the
// ETA go last, cut at the end only when nothing else is left to drop.
func FitLine(label, stage string, done, total int64, rate float64, width int) string {
	full := FormatLine(label, stage, done, total, rate, true)
	if width <= 0 || runes(full) <= width {
		return full
	}
	if l := FormatLine(label, stage, done, total, rate, false); runes(l) <= width {
		return l
	}
	figures := FormatLine("", "", done, total, rate, false) // ": 1.00 MB of ..."
	figures = strings.TrimPrefix(figures, ": ")
	if stage != "" {
		stage = termsafe.Escape(stage)
		if l := stage + " — " + figures; runes(l) <= width {
			return l
		}
		// The stage's start says where the job is ("layer 12 (5 of 58)").
		const minStage = 8
		if room := width - runes(figures) - runes(" — ") - 1; room >= minStage {
			return string([]rune(stage)[:room]) + "…" + " — " + figures
		}
	}
	if runes(figures) <= width {
		return figures
	}
	return strings.TrimRight(string([]rune(figures)[:max(width, 1)]), " ,")
}

func runes(s string) int { return utf8.RuneCountInString(s) }

// FormatLine is one status line, "label: stage — done of total (pct),
// rate, ETA", in decimal units. rate is bytes a second, negative while not
// known; bar adds a bar, for a terminal.
func FormatLine(label, stage string, done, total int64, rate float64, bar bool) string {
	var b strings.Builder
	b.WriteString(label)
	sep := ": "
	if stage != "" {
		b.WriteString(": " + termsafe.Escape(stage))
		sep = " — "
	}
	if total <= 0 {
		b.WriteString(sep + human.Bytes(done))
	} else {
		done = min(done, total)
		pct := 100 * float64(done) / float64(total)
		if bar {
			const width = 20
			fill := min(width, int(pct/100*width))
			fmt.Fprintf(&b, " [%s%s]", strings.Repeat("#", fill), strings.Repeat("-", width-fill))
			if stage == "" {
				sep = " "
			}
		}
		fmt.Fprintf(&b, "%s%s of %s (%.0f%%)", sep, human.Bytes(done), human.Bytes(total), pct)
	}
	if rate >= 0 {
		b.WriteString(", " + human.Bytes(int64(rate)) + "/s")
		if total > done && rate > 0 {
			eta := time.Duration(float64(total-done) / rate * float64(time.Second))
			b.WriteString(", ETA " + human.Duration(eta))
		}
	}
	return b.String()
}
