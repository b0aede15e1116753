// Package human formats sizes, rates and counts for people, one way
// everywhere: decimal units (kB, MB, GB, TB, as disks and `df -H` count,
// and as --max-shard-size's GB is read), scaled so a value never prints as
// 0.00, and nouns that agree with their counts; prose wrapped at spaces.
package human

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Bytes formats n bytes: "512 B", "3.1 kB", "820 MB", "23.4 GB", "1.30 TB".
func Bytes(n int64) string {
	if n < 0 {
		return "-" + Bytes(-n)
	}
	units := []string{"B", "kB", "MB", "GB", "TB", "PB"}
	v, u := float64(n), 0
	for v >= 1000 && u < len(units)-1 {
		v /= 1000
		u++
	}
	switch {
	case u == 0:
		return fmt.Sprintf("%d B", n)
	case v < 10:
		return fmt.Sprintf("%.2f %s", v, units[u])
	case v < 100:
		return fmt.Sprintf("%.1f %s", v, units[u])
	}
	return fmt.Sprintf("%.0f %s", v, units[u])
}

// Rate formats a byte rate: "1.24 GB/s".
func Rate(bytes int64, d time.Duration) string {
	if d <= 0 {
		return "- B/s"
	}
	return Bytes(int64(float64(bytes)/d.Seconds())) + "/s"
}

// Count formats n with noun, plural when n is not 1: "1 shard", "3 shards".
// plural may be given for irregular nouns ("1 index", "2 indexes").
func Count(n int, noun string, plural ...string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, noun)
	}
	if len(plural) > 0 {
		return fmt.Sprintf("%d %s", n, plural[0])
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// Duration formats a duration for progress and summaries: "0.4 s", "12 s",
// "3m05s", "1h02m".
func Duration(d time.Duration) string {
	switch {
	case d < 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%.0f s", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

// Wrap breaks s at spaces into lines of at most width columns, keeping
// s's own leading spaces (an indented line stays indented), each later
// line indented by them and indent more; a word longer than a line (a
// path) stays whole. The last line has no newline.
func Wrap(s string, width int, indent string) string {
	lead := s[:len(s)-len(strings.TrimLeft(s, " "))]
	var b strings.Builder
	line := lead
	for _, word := range strings.Split(s[len(lead):], " ") {
		switch {
		case line == lead:
			line += word
		case utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) <= width:
			line += " " + word
		default:
			b.WriteString(line + "\n")
			line = lead + indent + word
		}
	}
	b.WriteString(line)
	return b.String()
}
