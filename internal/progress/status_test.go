package progress

import (
	"strings"
	"testing"
	"time"
)

func TestFormatLine(t *testing.T) {
	tests := []struct {
		name         string
		label, stage string
		done, total  int64
		rate         float64
		bar          bool
		want         string
	}{
		{"stage, rate and ETA", "validate", "layer 12 (5 of 58) reading SRC experts", 41_200_000_000, 120_000_000_000, 1.3e9, false,
			"validate: layer 12 (5 of 58) reading SRC experts — 41.2 GB of 120 GB (34%), 1.30 GB/s, ETA 1m00s"},
		{"rate not known yet", "validate", "layer 1 (1 of 3)", 0, 3_000_000, -1, false,
			"validate: layer 1 (1 of 3) — 0 B of 3.00 MB (0%)"},
		{"no stage", "convert", "", 500_000, 1_000_000, 250_000, false,
			"convert: 500 kB of 1.00 MB (50%), 250 kB/s, ETA 2.0 s"},
		{"finished: no ETA", "validate", "byte proof", 2_000, 2_000, 1000, false,
			"validate: byte proof — 2.00 kB of 2.00 kB (100%), 1.00 kB/s"},
		{"more done than planned is shown as the total", "validate", "x", 3_000, 2_000, 1000, false,
			"validate: x — 2.00 kB of 2.00 kB (100%), 1.00 kB/s"},
		{"no total", "reading", "", 12_000, 0, -1, false, "reading: 12.0 kB"},
		{"bar", "validate", "layer 2 (2 of 2)", 50, 100, -1, true,
			"validate: layer 2 (2 of 2) [##########----------] — 50 B of 100 B (50%)"},
		{"bar without a stage", "convert", "", 100, 100, -1, true,
			"convert [####################] 100 B of 100 B (100%)"},
		{"a stage cannot steer the terminal", "validate", "layer \x1b[2J", 0, 0, -1, false, `validate: layer \x1b[2J — 0 B`},
	}
	for _, tt := range tests {
		if got := FormatLine(tt.label, tt.stage, tt.done, tt.total, tt.rate, tt.bar); got != tt.want {
			t.Errorf("%s:\n got %q\nwant %q", tt.name, got, tt.want)
		}
	}
}

// In a log, Status prints its line every interval with the latest stage,
// and Println's lines come out whole between them.
func TestStatusLines(t *testing.T) {
	var buf syncBuf
	s := NewStatus(&buf, "validate", false, 10*time.Millisecond)
	s.Total(4_000_000)
	s.Stage("layer 3 (2 of 2) reading DST experts")
	s.Add(1_000_000)
	s.Println("validate: layer 3: 16 tokens")
	waitFor(t, &buf, "validate: layer 3 (2 of 2) reading DST experts — 1.00 MB of 4.00 MB (25%)")
	s.Done()
	s.Done() // a second Done is harmless
	out := buf.String()
	if !strings.Contains(out, "validate: layer 3: 16 tokens\n") {
		t.Errorf("Println's line is missing or torn: %q", out)
	}
	n := strings.Count(out, "\n")
	time.Sleep(30 * time.Millisecond)
	if strings.Count(buf.String(), "\n") != n {
		t.Error("lines printed after Done")
	}
	if strings.Contains(out, "\r") || strings.Contains(out, "\x1b") {
		t.Errorf("a log got terminal controls: %q", out)
	}
}

// On a terminal the line is redrawn in place, Println clears it first and
// Done leaves the terminal on a clean line.
func TestStatusTerminal(t *testing.T) {
	var buf syncBuf
	s := NewStatus(&buf, "validate", true, 5*time.Millisecond)
	s.Total(100)
	s.Add(50)
	s.Stage("byte proof")
	waitFor(t, &buf, "\rvalidate: byte proof [##########----------] — 50 B of 100 B (50%)\x1b[K")
	s.Println("note")
	s.Done()
	out := buf.String()
	if !strings.Contains(out, "\r\x1b[Knote\n") {
		t.Errorf("Println did not clear the bar first: %q", out)
	}
	if !strings.HasSuffix(out, "\r\x1b[K") {
		t.Errorf("Done left the bar on screen: %q", out)
	}
}

func waitFor(t *testing.T, buf *syncBuf, want string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !strings.Contains(buf.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in %q", want, buf.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Before the job has planned or done anything there is nothing to say.
func TestStatusQuietUntilPlanned(t *testing.T) {
	var buf syncBuf
	s := NewStatus(&buf, "validate", false, 2*time.Millisecond)
	time.Sleep(30 * time.Millisecond)
	if buf.String() != "" {
		t.Errorf("printed before anything was planned: %q", buf.String())
	}
	s.Total(10)
	waitFor(t, &buf, "validate: 0 B of 10 B (0%)")
	s.Done()
}

// A narrow terminal loses the bar, then the label, then the stage's end,
// and keeps the counts, the rate and the ETA (issue 46).
func TestFitLine(t *testing.T) {
	const (
		stage = "layer 12 (5 of 58) reading SRC experts"
		done  = 41_200_000_000
		total = 120_000_000_000
		rate  = 1.3e9
	)
	tests := []struct {
		name         string
		label, stage string
		width        int
		want         string
	}{
		{"wide: everything", "validate", stage, 140,
			"validate: layer 12 (5 of 58) reading SRC experts [######--------------] — 41.2 GB of 120 GB (34%), 1.30 GB/s, ETA 1m00s"},
		{"100 columns: no bar", "validate", stage, 99,
			"validate: layer 12 (5 of 58) reading SRC experts — 41.2 GB of 120 GB (34%), 1.30 GB/s, ETA 1m00s"},
		{"90 columns: no label", "validate", stage, 89,
			"layer 12 (5 of 58) reading SRC experts — 41.2 GB of 120 GB (34%), 1.30 GB/s, ETA 1m00s"},
		{"60 columns: the stage's start", "validate", stage, 59,
			"layer 12 (… — 41.2 GB of 120 GB (34%), 1.30 GB/s, ETA 1m00s"},
		{"50 columns: the figures alone", "validate", stage, 49,
			"41.2 GB of 120 GB (34%), 1.30 GB/s, ETA 1m00s"},
		{"60 columns without a stage", "convert", "", 59,
			"convert: 41.2 GB of 120 GB (34%), 1.30 GB/s, ETA 1m00s"},
		{"40 columns: cut at the end", "convert", "", 30,
			"41.2 GB of 120 GB (34%), 1.30"},
		{"unknown width", "convert", "", 0,
			"convert [######--------------] 41.2 GB of 120 GB (34%), 1.30 GB/s, ETA 1m00s"},
	}
	for _, tt := range tests {
		got := FitLine(tt.label, tt.stage, done, total, rate, tt.width)
		if got != tt.want {
			t.Errorf("%s:\n got %q\nwant %q", tt.name, got, tt.want)
		}
		if tt.width > 0 && len([]rune(got)) > tt.width {
			t.Errorf("%s: %d columns, more than %d", tt.name, len([]rune(got)), tt.width)
		}
	}
}

// Drawn on a terminal of 60 columns, every line fits in 59 and keeps the
// counts; the label goes before the stage's start.
func TestStatusTerminalNarrow(t *testing.T) {
	var buf syncBuf
	s := NewStatus(&buf, "validate", true, 5*time.Millisecond)
	s.width = func() int { return 60 }
	s.Total(100)
	s.Add(50)
	s.Stage("layer 12 (5 of 58) reading SRC experts")
	waitFor(t, &buf, "50 B of 100 B (50%)")
	s.Done()
	for _, l := range strings.Split(buf.String(), "\r") {
		l = strings.TrimSuffix(l, "\x1b[K")
		if l == "" {
			continue
		}
		if n := len([]rune(l)); n > 59 || !strings.HasPrefix(l, "layer 12 (5") || !strings.Contains(l, "50 B of 100 B (50%)") {
			t.Fatalf("line of %d columns on a 60-column terminal: %q", n, l)
		}
	}
}
