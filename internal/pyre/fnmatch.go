package pyre

import "strings"

// Glob is a shell-style pattern as Python's fnmatch.fnmatchcase reads it
// (ModelOpt matches its exclude_modules so): '*' any run of characters
// (dots too), '?' one character, "[seq]" and "[!seq]" sets with ranges, an
// unclosed '[' a literal; the whole name must match. Matching takes time
// linear in the name for each '*' (the classic two-pointer algorithm), so
// no glob is costly.
type Glob struct {
	src   string
	items []globItem
	// minLen counts the items that take one character; prefix and suffix
	// are the literal text before the first and after the last wildcard.
	// A name failing them costs one step.
	minLen         int64
	prefix, suffix string
}

type globItem struct {
	star bool
	any  bool // ?
	lit  rune
	set  *charClass
}

// String is the pattern as given.
func (g *Glob) String() string { return g.src }

// ParseGlob reads an fnmatch pattern; it never fails (fnmatch has no
// invalid patterns) beyond the length bound.
func ParseGlob(pattern string) (*Glob, error) {
	if len(pattern) > MaxPatternLen {
		return nil, &Error{pattern, 0, "over the length limit"}
	}
	g := &Glob{src: pattern}
	rs := []rune(pattern)
	for i := 0; i < len(rs); i++ {
		switch rs[i] {
		case '*':
			if n := len(g.items); n == 0 || !g.items[n-1].star {
				g.items = append(g.items, globItem{star: true})
			}
		case '?':
			g.items = append(g.items, globItem{any: true})
		case '[':
			set, next, ok := globSet(rs, i+1)
			if !ok {
				g.items = append(g.items, globItem{lit: '['})
				continue
			}
			g.items = append(g.items, globItem{set: set})
			i = next - 1
		default:
			g.items = append(g.items, globItem{lit: rs[i]})
		}
	}
	lit := func(items []globItem) string {
		var b strings.Builder
		for _, it := range items {
			if it.star || it.any || it.set != nil {
				break
			}
			b.WriteRune(it.lit)
		}
		return b.String()
	}
	g.prefix = lit(g.items)
	var rev []globItem
	for i := len(g.items) - 1; i >= 0; i-- {
		rev = append(rev, g.items[i])
		if !g.items[i].star {
			g.minLen++
		}
	}
	r := []rune(lit(rev))
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	g.suffix = string(r)
	return g, nil
}

// MinLen is the fewest characters a match takes.
func (g *Glob) MinLen() int64 { return g.minLen }

// globSet reads a set after '[' as fnmatch.translate does: a leading '!'
// negates, a ']' first is a member, ranges a-z; ok is false when no ']'
// closes it. next is the index after the ']'.
func globSet(rs []rune, i int) (set *charClass, next int, ok bool) {
	set = &charClass{}
	if i < len(rs) && rs[i] == '!' {
		set.neg = true
		i++
	}
	start := i
	for ; i < len(rs); i++ {
		if rs[i] == ']' && i > start {
			return set, i + 1, true
		}
		lo, hi := rs[i], rs[i]
		if i+2 < len(rs) && rs[i+1] == '-' && rs[i+2] != ']' {
			hi = rs[i+2]
			i += 2
		}
		if lo <= hi {
			// fnmatch drops a reversed range (it can match nothing).
			set.ranges = append(set.ranges, lo, hi)
		}
	}
	return nil, 0, false
}

// Match reports whether the whole of s matches the glob.
func (g *Glob) Match(s string) bool {
	ok, _, _ := g.MatchInput(NewInput(s), 1<<62)
	return ok
}

// MatchInput is Match on a decoded name, in at most limit steps (a step is
// one item tried at one character; the worst case is the name's length
// times the glob's): past that it returns a *BudgetError.
func (g *Glob) MatchInput(name *Input, limit int64) (matched bool, used int64, err error) {
	in := name.rs
	if int64(len(in)) < g.minLen || !strings.HasPrefix(name.s, g.prefix) || !strings.HasSuffix(name.s, g.suffix) {
		return false, 1, nil
	}
	if len(g.items) == 1 && g.items[0].star {
		return true, 1, nil
	}
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(in) {
		used++
		if used > limit {
			return false, used, &BudgetError{Pattern: g.src, Input: name.s, Steps: limit}
		}
		if pi < len(g.items) && !g.items[pi].star && g.items[pi].matches(in[si]) {
			pi++
			si++
			continue
		}
		if pi < len(g.items) && g.items[pi].star {
			star, mark = pi, si
			pi++
			continue
		}
		if star < 0 {
			return false, used, nil
		}
		// Let the last '*' take one more character and try again.
		pi = star + 1
		mark++
		si = mark
	}
	for pi < len(g.items) && g.items[pi].star {
		pi++
	}
	return pi == len(g.items), used, nil
}

func (it globItem) matches(r rune) bool {
	switch {
	case it.any:
		return true
	case it.set != nil:
		return it.set.has(r, false, false)
	}
	return it.lit == r
}

// HasMeta reports whether an entry is a glob rather than a plain name.
func HasMeta(s string) bool { return strings.ContainsAny(s, "*?[") }
