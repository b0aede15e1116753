package pyre

import (
	"fmt"
	"strings"
	"unicode"
)

// BudgetError is a match that took more steps than it was allowed.
type BudgetError struct {
	Pattern string
	Input   string
	Steps   int64
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("matching %q took more than %d steps", e.Input, e.Steps)
}

// Input is a name to match, decoded once for all the patterns tried on it.
type Input struct {
	s  string
	rs []rune
}

// NewInput decodes s.
func NewInput(s string) *Input { return &Input{s: s, rs: []rune(s)} }

// String is the name.
func (in *Input) String() string { return in.s }

// Match reports whether the pattern matches at the start of s, as Python's
// re.match(pattern, s) does (a prefix, not the whole of s). It takes at
// most limit steps (a step is one node of the pattern tried at one
// position): past that it returns a *BudgetError. used is the steps taken.
func (re *Regexp) Match(s string, limit int64) (matched bool, used int64, err error) {
	return re.MatchInput(NewInput(s), limit)
}

// MatchInput is Match on a decoded name. A name that lacks a literal the
// pattern needs, or is shorter than its shortest match, costs one step.
func (re *Regexp) MatchInput(in *Input, limit int64) (matched bool, used int64, err error) {
	if int64(len(in.rs)) < re.minLen {
		return false, 1, nil
	}
	for _, lit := range re.literals {
		if !strings.Contains(in.s, lit) {
			return false, 1, nil
		}
	}
	m := &machine{in: in.rs, limit: limit}
	defer func() {
		if r := recover(); r != nil {
			if r != errBudget {
				panic(r)
			}
			matched, used, err = false, m.steps, &BudgetError{Pattern: re.src, Input: in.s, Steps: limit}
		}
	}()
	ok := m.match(re.root, 0, func(int) bool { return true })
	return ok, m.steps, nil
}

// MinLen is the fewest characters a match takes.
func (re *Regexp) MinLen() int64 { return re.minLen }

// machine is one match in progress: backtracking in continuation-passing
// style, each node calling k with every end position it can reach, in
// Python's order of preference, until k accepts one. Python's sre
// backtracks too, so a pattern is as costly here as there; the budget
// makes the cost bounded.
type machine struct {
	in    []rune
	steps int64
	limit int64
	// depth counts the nested iterations of repeats of more than one
	// character, the one way the recursion grows with the input rather
	// than the pattern: past maxDepth a match is refused like one past its
	// budget, so a megabyte-long name cannot grow the stack by gigabytes.
	depth int
}

// maxDepth bounds nested repeat iterations (a module name has a few
// hundred characters).
const maxDepth = 1 << 14

func (m *machine) step() {
	m.steps++
	if m.steps > m.limit {
		panic(errBudget)
	}
}

func (m *machine) match(n *node, i int, k func(int) bool) bool {
	m.step()
	switch n.kind {
	case kEmpty:
		return k(i)
	case kChar:
		if i < len(m.in) && sameRune(m.in[i], n.r, n.fold) {
			return k(i + 1)
		}
		return false
	case kAny:
		if i < len(m.in) && (n.dotall || m.in[i] != '\n') {
			return k(i + 1)
		}
		return false
	case kClass:
		if i < len(m.in) && n.class.has(m.in[i], n.fold, n.ascii) {
			return k(i + 1)
		}
		return false
	case kSeq:
		return m.seq(n.subs, i, k)
	case kAlt:
		for _, s := range n.subs {
			if m.match(s, i, k) {
				return true
			}
		}
		return false
	case kRepeat:
		if n.possess {
			// a*+ is (?>a*): the greedy repeat's first end, kept.
			greedy := *n
			greedy.possess = false
			return m.first(&greedy, i, k)
		}
		if single(n.subs[0]) {
			return m.repeatSingle(n, i, k)
		}
		return m.repeat(n, 0, i, k)
	case kAtomic:
		return m.first(n.subs[0], i, k)
	case kLook:
		var ok bool
		if n.behind {
			start := i - n.width
			ok = start >= 0 && m.match(n.subs[0], start, func(j int) bool { return j == i })
		} else {
			ok = m.match(n.subs[0], i, func(int) bool { return true })
		}
		if ok == n.neg {
			return false
		}
		return k(i)
	case kAssert:
		if m.holds(n, i) {
			return k(i)
		}
		return false
	}
	panic("pyre: unknown node")
}

// first continues from the first end n reaches, never backtracking into n
// (atomic groups, possessive repeats).
func (m *machine) first(n *node, i int, k func(int) bool) bool {
	end := -1
	m.match(n, i, func(j int) bool { end = j; return true })
	return end >= 0 && k(end)
}

func (m *machine) seq(subs []*node, i int, k func(int) bool) bool {
	if len(subs) == 0 {
		return k(i)
	}
	return m.match(subs[0], i, func(j int) bool { return m.seq(subs[1:], j, k) })
}

// repeat matches n's body from iteration count on. An iteration that
// consumes nothing ends the loop as in sre: once count has reached min,
// the tail is tried at the same place anyway; before that, it stands for
// all the iterations still needed (they would match empty the same way),
// so "(?:){1000000000}" costs one step, not a billion.
func (m *machine) repeat(n *node, count int64, i int, k func(int) bool) bool {
	m.step()
	more := func() bool {
		if n.max >= 0 && count >= n.max {
			return false
		}
		return m.match(n.subs[0], i, func(j int) bool {
			if j == i {
				if count+1 >= n.min {
					return false
				}
				return m.repeat(n, n.min, i, k)
			}
			if m.depth++; m.depth > maxDepth {
				panic(errBudget)
			}
			ok := m.repeat(n, count+1, j, k)
			m.depth--
			return ok
		})
	}
	done := count >= n.min
	if n.greedy {
		return more() || done && k(i)
	}
	return done && k(i) || more()
}

// single reports whether n matches exactly one character, by itself.
func single(n *node) bool {
	return n.kind == kChar || n.kind == kAny || n.kind == kClass
}

// one reports whether the single-character node n matches at i.
func (m *machine) one(n *node, i int) bool {
	if i >= len(m.in) {
		return false
	}
	switch n.kind {
	case kChar:
		return sameRune(m.in[i], n.r, n.fold)
	case kAny:
		return n.dotall || m.in[i] != '\n'
	}
	return n.class.has(m.in[i], n.fold, n.ascii)
}

// repeatSingle is repeat for a body of one character (.*, [^.]+, \d{2}):
// the run it can take is counted in a loop, and the tail tried at each
// length in Python's order, longest first when greedy. The same answer as
// repeat, without a frame per character.
func (m *machine) repeatSingle(n *node, i int, k func(int) bool) bool {
	sub := n.subs[0]
	run := 0
	for (n.max < 0 || int64(run) < n.max) && m.one(sub, i+run) {
		m.step()
		run++
	}
	if int64(run) < n.min {
		return false
	}
	lo := int(n.min)
	if n.greedy {
		for j := run; j >= lo; j-- {
			m.step()
			if k(i + j) {
				return true
			}
		}
		return false
	}
	for j := lo; j <= run; j++ {
		m.step()
		if k(i + j) {
			return true
		}
	}
	return false
}

func (m *machine) holds(n *node, i int) bool {
	in := m.in
	switch n.assert {
	case aBegin:
		return i == 0
	case aLineBegin:
		return i == 0 || in[i-1] == '\n'
	case aEnd:
		return i == len(in) || i == len(in)-1 && in[i] == '\n'
	case aLineEnd:
		return i == len(in) || in[i] == '\n'
	case aEndStrict:
		return i == len(in)
	case aWordB, aNotWordB:
		before := i > 0 && isWord(in[i-1], n.ascii)
		after := i < len(in) && isWord(in[i], n.ascii)
		return (before != after) == (n.assert == aWordB)
	}
	return false
}

func sameRune(a, b rune, fold bool) bool {
	if a == b {
		return true
	}
	if !fold {
		return false
	}
	for f := unicode.SimpleFold(b); f != b; f = unicode.SimpleFold(f) {
		if f == a {
			return true
		}
	}
	return false
}

func (c *charClass) has(r rune, fold, ascii bool) bool {
	in := c.contains(r, ascii)
	if !in && fold {
		for f := unicode.SimpleFold(r); f != r && !in; f = unicode.SimpleFold(f) {
			in = c.contains(f, ascii)
		}
	}
	return in != c.neg
}

func (c *charClass) contains(r rune, ascii bool) bool {
	for j := 0; j < len(c.ranges); j += 2 {
		if r >= c.ranges[j] && r <= c.ranges[j+1] {
			return true
		}
	}
	for _, s := range c.named {
		var in bool
		switch s.kind {
		case 'd':
			in = r >= '0' && r <= '9' || !ascii && unicode.IsDigit(r)
		case 'w':
			in = isWord(r, ascii)
		case 's':
			in = strings.ContainsRune(" \t\n\r\f\v", r) || !ascii && (unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f)
		}
		if in != s.neg {
			return true
		}
	}
	return false
}

// isWord is \w: Python's str.isalnum() or '_' (ASCII letters, digits and
// '_' in ASCII mode).
func isWord(r rune, ascii bool) bool {
	if r < 0x80 || ascii {
		return r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
	}
	return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsNumber(r)
}

// requiredLiterals are runs of case-sensitive characters that every match
// contains: those of n's sequence, and of parts every match passes
// through (groups, repeats taken at least once, positive lookaheads).
func requiredLiterals(n *node) []string {
	var out []string
	var run []rune
	flush := func() {
		if len(run) > 0 {
			out = append(out, string(run))
			run = run[:0]
		}
	}
	var walk func(n *node)
	walk = func(n *node) {
		switch n.kind {
		case kChar:
			if n.fold {
				flush()
				return
			}
			run = append(run, n.r)
		case kSeq:
			for _, s := range n.subs {
				walk(s)
			}
		case kAssert, kEmpty:
			// zero-width: the run goes on
		case kRepeat:
			flush()
			if n.min >= 1 {
				walk(n.subs[0])
				flush()
			}
		case kAtomic:
			flush()
			walk(n.subs[0])
			flush()
		case kLook:
			flush()
			if !n.neg && !n.behind {
				walk(n.subs[0])
				flush()
			}
		default:
			flush()
		}
	}
	walk(n)
	flush()
	return out
}

// minLength is the fewest runes any match of n takes (capped, so a
// billion-fold repeat does not overflow): a name shorter than that cannot
// match, which answers ".{1000}" repeated 145 times in one step.
func minLength(n *node) int64 {
	const ceiling = 1 << 40
	switch n.kind {
	case kChar, kAny, kClass:
		return 1
	case kSeq:
		var t int64
		for _, s := range n.subs {
			t = min(t+minLength(s), ceiling)
		}
		return t
	case kAlt:
		best := int64(ceiling)
		for _, s := range n.subs {
			best = min(best, minLength(s))
		}
		return best
	case kRepeat:
		w := minLength(n.subs[0])
		if w == 0 || n.min == 0 {
			return 0
		}
		if w > ceiling/n.min {
			return ceiling
		}
		return min(w*n.min, ceiling)
	case kAtomic:
		return minLength(n.subs[0])
	}
	return 0 // empty, assertions, lookarounds
}
