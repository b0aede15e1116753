// Package suggest finds what a mistyped name was probably meant to be, so
// an error can say "did you mean X?" instead of listing every name.
package suggest

import (
	"slices"
	"strings"
)

// Distance is the optimal-string-alignment distance between a and b:
// insertions, deletions, substitutions and swaps of neighbours each cost
// one. Names longer than 64 bytes are never close (no table is built).
func Distance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// Closest are up to n candidates near word: within two edits (a third of
// the word's length for long words), or holding the word, or held by it,
// nearest first and then in the candidates' order.
func Closest(word string, candidates []string, n int) []string {
	limit := max(2, len(word)/3)
	type hit struct {
		name string
		d    int
		at   int
	}
	var hits []hit
	lw := strings.ToLower(word)
	for i, c := range candidates {
		lc := strings.ToLower(c)
		d := Distance(lw, lc)
		if d > limit && len(lw) >= 3 && (strings.Contains(lc, lw) || strings.Contains(lw, lc)) {
			d = limit // a part of the name, or the name with something more
		}
		if d <= limit {
			hits = append(hits, hit{c, d, i})
		}
	}
	slices.SortStableFunc(hits, func(a, b hit) int { return a.d - b.d })
	out := make([]string, 0, n)
	for _, h := range hits {
		if len(out) == n {
			break
		}
		out = append(out, h.name)
	}
	return out
}

// Phrase is "; did you mean a, b or c?" for the closest candidates, "" when
// none is close.
func Phrase(word string, candidates []string) string {
	c := Closest(word, candidates, 3)
	switch len(c) {
	case 0:
		return ""
	case 1:
		return "; did you mean " + c[0] + "?"
	}
	return "; did you mean " + strings.Join(c[:len(c)-1], ", ") + " or " + c[len(c)-1] + "?"
}
