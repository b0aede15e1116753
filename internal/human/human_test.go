package human

import (
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

// Wrap breaks at spaces within the width, an indented line keeping its
// indent plus indent on later lines, a word longer than a line whole, and
// no newline after the last line.
func TestWrap(t *testing.T) {
	for _, c := range []struct {
		s      string
		width  int
		indent string
		want   string
	}{
		{"one two three", 20, "  ", "one two three"},
		{"one two three", 8, "  ", "one two\n  three"},
		{"  a bb cc", 6, "", "  a bb\n  cc"},
		{"x averyveryverylongword y", 8, "-", "x\n-averyveryverylongword\n-y"},
		{"héé héé", 7, "", "héé héé"},
	} {
		if got := Wrap(c.s, c.width, c.indent); got != c.want {
			t.Errorf("Wrap(%q, %d, %q) = %q, want %q", c.s, c.width, c.indent, got, c.want)
		}
	}
}
