package human

import (
	"strings"
	"testing"
	"time"
)

func TestBytes(t *testing.T) {
	cases := []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {999, "999 B"}, {1000, "1.00 kB"}, {3_100, "3.10 kB"},
		{820_000_000, "820 MB"}, {23_400_000_000, "23.4 GB"}, {1_300_000_000_000, "1.30 TB"},
		{4_999_999, "5.00 MB"}, {-2_000, "-2.00 kB"},
	}
	for _, c := range cases {
		if got := Bytes(c.n); got != c.want {
			t.Errorf("Bytes(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

func TestCountAndRate(t *testing.T) {
	if got := Count(1, "shard"); got != "1 shard" {
		t.Error(got)
	}
	if got := Count(0, "shard"); got != "0 shards" {
		t.Error(got)
	}
	if got := Count(2, "index", "indexes"); got != "2 indexes" {
		t.Error(got)
	}
	if got := Rate(3_000_000_000, 2*time.Second); got != "1.50 GB/s" {
		t.Error(got)
	}
	if got := Duration(185 * time.Second); got != "3m05s" {
		t.Error(got)
	}
	if got := Duration(400 * time.Millisecond); got != "0.4 s" {
		t.Error(got)
	}
}

// Prose wraps at spaces to the width (the report's 100 columns here),
// counted in runes, an indented line keeping its indent, a word longer
// than a line whole, no newline after the last line.
func TestWrap(t *testing.T) {
	long := "bytes: PASS: " + strings.Repeat("x", 120)
	for _, tc := range []struct{ in, want string }{
		{"note: short", "note: short"},
		{"note: " + strings.Repeat("word ", 20) + "end",
			"note: " + strings.Repeat("word ", 18) + "word\n  word end"},
		{"  layer 1: " + strings.Repeat("7, ", 40) + "8",
			"  layer 1: " + strings.Repeat("7, ", 29) + "7,\n    " + strings.Repeat("7, ", 10) + "8"},
		{long, "bytes: PASS:\n  " + strings.Repeat("x", 120)},
		{strings.Repeat("é", 98) + " x", strings.Repeat("é", 98) + " x"},
		{strings.Repeat("é", 99) + " x", strings.Repeat("é", 99) + "\n  x"},
	} {
		if got := Wrap(tc.in, 100, "  "); got != tc.want {
			t.Errorf("Wrap(%q):\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
}
