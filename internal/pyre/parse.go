// Package pyre matches module names the way the Python tools that write
// quantisation configs do: compressed-tensors' `re:` entries with Python's
// re.match (lookaheads, lookbehinds, lazy and possessive repeats, inline
// flags), and ModelOpt's exclude lists with fnmatch.fnmatchcase.
//
// Go's regexp (RE2) is the wrong tool for both: it has no lookarounds, so
// valid lists are refused, and it expands counted repeats when it compiles,
// so a 1 KB pattern such as ".{1000}" repeated 145 times compiles to
// ~145,000 instructions and a gigabyte of heap. Here a pattern is parsed to
// a tree no larger than its text (a repeat is one node whatever its count)
// and matched by backtracking, as Python does, under a step budget: a
// pattern that would take Python seconds on a module name is an error that
// says so, never a hang.
package pyre

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Bounds on what Parse accepts. Real ignore lists hold patterns of a few
// dozen bytes, nested a level or two.
const (
	MaxPatternLen = 4096 // bytes of one pattern
	maxNesting    = 64   // groups inside groups
	maxRepeat     = 1<<32 - 1
)

// Regexp is a parsed Python regular expression.
type Regexp struct {
	src  string
	root *node
	// literals are substrings every match must contain (case-sensitive
	// patterns only): a name lacking one cannot match, which spares the
	// engine most names of a large checkpoint.
	literals []string
	// minLen is the fewest runes a match takes.
	minLen int64
}

// String is the pattern as given.
func (re *Regexp) String() string { return re.src }

type nodeKind uint8

const (
	kEmpty  nodeKind = iota
	kChar            // one rune (r), folded when fold
	kAny             // . (newline too when dotall)
	kClass           // [...] or \d \w \s and their negations
	kSeq             // subs in order
	kAlt             // subs, first that matches
	kRepeat          // sub min..max times
	kAtomic          // (?>...): the first way sub matches, no backtracking into it
	kLook            // lookahead / lookbehind
	kAssert          // ^ $ \A \Z \b \B
)

type assertKind uint8

const (
	aBegin     assertKind = iota // ^ (without multiline), \A
	aLineBegin                   // ^ with multiline
	aEnd                         // $ without multiline: end, or before a final \n
	aLineEnd                     // $ with multiline
	aEndStrict                   // \Z
	aWordB                       // \b
	aNotWordB                    // \B
)

type node struct {
	kind    nodeKind
	r       rune
	fold    bool // case-insensitive (kChar, kClass)
	dotall  bool // kAny
	ascii   bool // \w \d \s \b in ASCII mode
	class   *charClass
	subs    []*node
	min     int64
	max     int64 // -1: unbounded
	greedy  bool
	possess bool
	behind  bool // kLook: lookbehind
	neg     bool // kLook: negative
	width   int  // kLook behind: the fixed width
	assert  assertKind
}

// charClass is a set: ranges, named sets (\d \w \s, their negations), negated as a whole.
type charClass struct {
	neg    bool
	ranges []rune // pairs lo, hi
	named  []namedSet
}

type namedSet struct {
	kind byte // 'd', 'w', 's'
	neg  bool
}

type flags struct {
	ignoreCase, multiline, dotall, verbose, ascii bool
}

type parser struct {
	src   string
	pos   int
	fl    flags
	depth int
	// groups counts capturing groups, for the error a backreference gets.
	groups int
}

// Error is a pattern Python would refuse, or one this package does not
// read (backreferences, conditionals), with the byte offset.
type Error struct {
	Pattern string
	Offset  int
	Msg     string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s at position %d", e.Msg, e.Offset)
}

// Parse reads a pattern as Python's re.compile does with default flags.
func Parse(pattern string) (*Regexp, error) {
	if len(pattern) > MaxPatternLen {
		return nil, &Error{pattern, 0, fmt.Sprintf("%d bytes, over the limit of %d", len(pattern), MaxPatternLen)}
	}
	if !utf8.ValidString(pattern) {
		return nil, &Error{pattern, 0, "not valid UTF-8"}
	}
	p := &parser{src: pattern}
	if err := p.leadingFlags(); err != nil {
		return nil, err
	}
	root, err := p.alt()
	if err != nil {
		return nil, err
	}
	if p.pos < len(p.src) {
		// Only an unbalanced ")" stops alt early.
		return nil, p.errorf("unbalanced parenthesis")
	}
	re := &Regexp{src: pattern, root: root}
	re.literals = requiredLiterals(root)
	re.minLen = minLength(root)
	return re, nil
}

func (p *parser) errorf(format string, args ...any) error {
	return &Error{p.src, p.pos, fmt.Sprintf(format, args...)}
}

// leadingFlags reads global inline flags, (?imsx) at the very start (Python
// 3.11 refuses them anywhere else).
func (p *parser) leadingFlags() error {
	for strings.HasPrefix(p.src[p.pos:], "(?") {
		j := p.pos + 2
		for j < len(p.src) && strings.IndexByte("aiLmsux", p.src[j]) >= 0 {
			j++
		}
		if j == p.pos+2 || j >= len(p.src) || p.src[j] != ')' {
			return nil
		}
		if err := p.setFlags(&p.fl, p.src[p.pos+2:j], true); err != nil {
			return err
		}
		p.pos = j + 1
	}
	return nil
}

func (p *parser) setFlags(f *flags, letters string, on bool) error {
	for _, c := range letters {
		switch c {
		case 'i':
			f.ignoreCase = on
		case 'm':
			f.multiline = on
		case 's':
			f.dotall = on
		case 'x':
			f.verbose = on
		case 'a':
			f.ascii = on
		case 'u':
			if !on {
				return p.errorf("bad inline flag: cannot turn off flag 'u'")
			}
			f.ascii = false
		case 'L':
			return p.errorf("bad inline flag: 'L' is for byte patterns only")
		default:
			return p.errorf("unknown flag %q", c)
		}
	}
	return nil
}

func (p *parser) more() bool { return p.pos < len(p.src) }

func (p *parser) peek() rune {
	r, _ := utf8.DecodeRuneInString(p.src[p.pos:])
	return r
}

func (p *parser) next() rune {
	r, n := utf8.DecodeRuneInString(p.src[p.pos:])
	p.pos += n
	return r
}

// skipVerbose skips whitespace and # comments in verbose mode.
func (p *parser) skipVerbose() {
	if !p.fl.verbose {
		return
	}
	for p.more() {
		c := p.src[p.pos]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			p.pos++
		case c == '#':
			for p.more() && p.src[p.pos] != '\n' {
				p.pos++
			}
		default:
			return
		}
	}
}

func (p *parser) alt() (*node, error) {
	var branches []*node
	for {
		s, err := p.seq()
		if err != nil {
			return nil, err
		}
		branches = append(branches, s)
		if p.more() && p.src[p.pos] == '|' {
			p.pos++
			continue
		}
		break
	}
	if len(branches) == 1 {
		return branches[0], nil
	}
	return &node{kind: kAlt, subs: branches}, nil
}

func (p *parser) seq() (*node, error) {
	var items []*node
	for {
		p.skipVerbose()
		if !p.more() || p.src[p.pos] == '|' || p.src[p.pos] == ')' {
			break
		}
		atom, err := p.atom()
		if err != nil {
			return nil, err
		}
		if atom == nil {
			continue // a comment or scoped flags that took nothing
		}
		atom, err = p.quantifiers(atom)
		if err != nil {
			return nil, err
		}
		items = append(items, atom)
	}
	switch len(items) {
	case 0:
		return &node{kind: kEmpty}, nil
	case 1:
		return items[0], nil
	}
	return &node{kind: kSeq, subs: items}, nil
}

// quantifiers reads the quantifier after an atom, if any. Python refuses a
// second quantifier ("multiple repeat") except the lazy and possessive
// suffixes.
func (p *parser) quantifiers(atom *node) (*node, error) {
	p.skipVerbose()
	if !p.more() {
		return atom, nil
	}
	start := p.pos
	var lo, hi int64
	switch p.src[p.pos] {
	case '*':
		lo, hi = 0, -1
		p.pos++
	case '+':
		lo, hi = 1, -1
		p.pos++
	case '?':
		lo, hi = 0, 1
		p.pos++
	case '{':
		l, h, ok, err := p.braces()
		if err != nil {
			return nil, err
		}
		if !ok {
			return atom, nil // a literal '{': the next atom reads it
		}
		lo, hi = l, h
	default:
		return atom, nil
	}
	if atom.kind == kAssert {
		p.pos = start
		return nil, p.errorf("nothing to repeat")
	}
	rep := &node{kind: kRepeat, subs: []*node{atom}, min: lo, max: hi, greedy: true}
	if p.more() {
		switch p.src[p.pos] {
		case '?':
			rep.greedy = false
			p.pos++
		case '+':
			rep.possess = true
			p.pos++
		}
	}
	p.skipVerbose()
	if p.more() && strings.IndexByte("*+?", p.src[p.pos]) >= 0 {
		return nil, p.errorf("multiple repeat")
	}
	if p.more() && p.src[p.pos] == '{' {
		save := p.pos
		if _, _, ok, _ := p.braces(); ok {
			p.pos = save
			return nil, p.errorf("multiple repeat")
		}
		p.pos = save
	}
	return rep, nil
}

// braces reads {m}, {m,}, {,n} or {m,n}; ok is false (and nothing read)
// when the text is not one, as Python then reads '{' as a literal.
func (p *parser) braces() (lo, hi int64, ok bool, err error) {
	end := strings.IndexByte(p.src[p.pos:], '}')
	if end < 0 {
		return 0, 0, false, nil
	}
	body := p.src[p.pos+1 : p.pos+end]
	a, b, comma := strings.Cut(body, ",")
	digits := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				return false
			}
		}
		return true
	}
	if !digits(a) || !digits(b) || (!comma && a == "") {
		return 0, 0, false, nil
	}
	num := func(s string, def int64) (int64, error) {
		if s == "" {
			return def, nil
		}
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil || v > maxRepeat {
			return 0, p.errorf("the repetition number is too large")
		}
		return int64(v), nil
	}
	if lo, err = num(a, 0); err != nil {
		return 0, 0, false, err
	}
	if !comma {
		hi = lo
	} else if hi, err = num(b, -1); err != nil {
		return 0, 0, false, err
	}
	if hi >= 0 && hi < lo {
		return 0, 0, false, p.errorf("min repeat greater than max repeat")
	}
	p.pos += end + 1
	return lo, hi, true, nil
}

func (p *parser) atom() (*node, error) {
	c := p.src[p.pos]
	switch c {
	case '(':
		return p.group()
	case '[':
		p.pos++
		cl, err := p.class()
		if err != nil {
			return nil, err
		}
		return &node{kind: kClass, class: cl, fold: p.fl.ignoreCase, ascii: p.fl.ascii}, nil
	case '.':
		p.pos++
		return &node{kind: kAny, dotall: p.fl.dotall}, nil
	case '^':
		p.pos++
		if p.fl.multiline {
			return &node{kind: kAssert, assert: aLineBegin}, nil
		}
		return &node{kind: kAssert, assert: aBegin}, nil
	case '$':
		p.pos++
		if p.fl.multiline {
			return &node{kind: kAssert, assert: aLineEnd}, nil
		}
		return &node{kind: kAssert, assert: aEnd}, nil
	case '*', '+', '?':
		return nil, p.errorf("nothing to repeat")
	case '{':
		save := p.pos
		if _, _, ok, err := p.braces(); err != nil {
			return nil, err
		} else if ok {
			p.pos = save
			return nil, p.errorf("nothing to repeat")
		}
		p.pos++
		return p.char('{'), nil
	case '\\':
		return p.escape()
	}
	return p.char(p.next()), nil
}

func (p *parser) char(r rune) *node {
	return &node{kind: kChar, r: r, fold: p.fl.ignoreCase}
}

func (p *parser) group() (*node, error) {
	open := p.pos
	p.pos++ // (
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxNesting {
		return nil, p.errorf("groups nested over %d deep", maxNesting)
	}
	saved := p.fl
	defer func() { p.fl = saved }()
	kind := kEmpty // a plain group: its alternation
	var look *node
	if strings.HasPrefix(p.src[p.pos:], "?") {
		p.pos++
		if !p.more() {
			return nil, p.errorf("unexpected end of pattern")
		}
		switch c := p.src[p.pos]; {
		case c == ':':
			p.pos++
		case c == '>':
			p.pos++
			kind = kAtomic
		case c == '=' || c == '!':
			p.pos++
			look = &node{kind: kLook, neg: c == '!'}
		case strings.HasPrefix(p.src[p.pos:], "<=") || strings.HasPrefix(p.src[p.pos:], "<!"):
			look = &node{kind: kLook, behind: true, neg: p.src[p.pos+1] == '!'}
			p.pos += 2
		case c == 'P' && strings.HasPrefix(p.src[p.pos:], "P<") || c == '<':
			if c == 'P' {
				p.pos++
			}
			p.pos++
			end := strings.IndexByte(p.src[p.pos:], '>')
			if end < 0 {
				return nil, p.errorf("missing >, unterminated name")
			}
			name := p.src[p.pos : p.pos+end]
			if !validGroupName(name) {
				return nil, p.errorf("bad character in group name %q", name)
			}
			p.pos += end + 1
			p.groups++
		case c == 'P' && strings.HasPrefix(p.src[p.pos:], "P="):
			return nil, p.errorf("backreferences are not read (a module-name pattern has no use for them)")
		case c == '#':
			end := strings.IndexByte(p.src[p.pos:], ')')
			if end < 0 {
				return nil, p.errorf("missing ), unterminated comment")
			}
			p.pos += end + 1
			return nil, nil
		case c == '(':
			return nil, p.errorf("conditional groups are not read")
		default:
			// Scoped flags (?aimsx-imsx:...).
			j := p.pos
			for j < len(p.src) && strings.IndexByte("aiLmsux-", p.src[j]) >= 0 {
				j++
			}
			if j == p.pos || j >= len(p.src) || p.src[j] != ':' {
				if j < len(p.src) && p.src[j] == ')' {
					return nil, p.errorf("global flags not at the start of the expression")
				}
				return nil, p.errorf("unknown extension ?%c", c)
			}
			on, off, _ := strings.Cut(p.src[p.pos:j], "-")
			if err := p.setFlags(&p.fl, on, true); err != nil {
				return nil, err
			}
			if err := p.setFlags(&p.fl, off, false); err != nil {
				return nil, err
			}
			p.pos = j + 1
		}
	} else {
		p.groups++
	}
	body, err := p.alt()
	if err != nil {
		return nil, err
	}
	if !p.more() || p.src[p.pos] != ')' {
		p.pos = open
		return nil, p.errorf("missing ), unterminated subpattern")
	}
	p.pos++
	switch {
	case look != nil:
		look.subs = []*node{body}
		if look.behind {
			w, ok := fixedWidth(body)
			if !ok {
				p.pos = open
				return nil, p.errorf("look-behind requires fixed-width pattern")
			}
			look.width = w
		}
		return look, nil
	case kind == kAtomic:
		return &node{kind: kAtomic, subs: []*node{body}}, nil
	}
	return body, nil
}

func validGroupName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r == '_' || unicode.IsLetter(r) || i > 0 && unicode.IsDigit(r)) {
			return false
		}
	}
	return true
}

// fixedWidth is how many runes every match of n takes, when that is one number.
func fixedWidth(n *node) (int, bool) {
	switch n.kind {
	case kEmpty, kAssert, kLook:
		return 0, true
	case kChar, kAny, kClass:
		return 1, true
	case kSeq:
		t := 0
		for _, s := range n.subs {
			w, ok := fixedWidth(s)
			if !ok {
				return 0, false
			}
			t += w
		}
		return t, true
	case kAlt:
		w0 := -1
		for _, s := range n.subs {
			w, ok := fixedWidth(s)
			if !ok || w0 >= 0 && w != w0 {
				return 0, false
			}
			w0 = w
		}
		return w0, true
	case kRepeat:
		if n.max != n.min {
			return 0, false
		}
		w, ok := fixedWidth(n.subs[0])
		if !ok || n.min > 1<<20 {
			return 0, false
		}
		return w * int(n.min), true
	case kAtomic:
		return fixedWidth(n.subs[0])
	}
	return 0, false
}

// escape reads a backslash escape outside a class.
func (p *parser) escape() (*node, error) {
	p.pos++ // backslash
	if !p.more() {
		return nil, p.errorf("bad escape (end of pattern)")
	}
	c := p.src[p.pos]
	switch c {
	case 'A':
		p.pos++
		return &node{kind: kAssert, assert: aBegin}, nil
	case 'Z':
		p.pos++
		return &node{kind: kAssert, assert: aEndStrict}, nil
	case 'b':
		p.pos++
		return &node{kind: kAssert, assert: aWordB, ascii: p.fl.ascii}, nil
	case 'B':
		p.pos++
		return &node{kind: kAssert, assert: aNotWordB, ascii: p.fl.ascii}, nil
	case 'd', 'D', 'w', 'W', 's', 'S':
		p.pos++
		cl := &charClass{named: []namedSet{{kind: lower(c), neg: c < 'a'}}}
		return &node{kind: kClass, class: cl, fold: p.fl.ignoreCase, ascii: p.fl.ascii}, nil
	}
	if c >= '1' && c <= '9' {
		// \1..\99 are backreferences; three octal digits are a character.
		if p.pos+2 < len(p.src) && isOctal(c) && isOctal(p.src[p.pos+1]) && isOctal(p.src[p.pos+2]) {
			r, err := p.octal()
			if err != nil {
				return nil, err
			}
			return p.char(r), nil
		}
		return nil, p.errorf("backreferences are not read (a module-name pattern has no use for them)")
	}
	r, err := p.charEscape()
	if err != nil {
		return nil, err
	}
	return p.char(r), nil
}

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

func (p *parser) octal() (rune, error) {
	v := 0
	n := 0
	for n < 3 && p.more() && isOctal(p.src[p.pos]) {
		v = v*8 + int(p.src[p.pos]-'0')
		p.pos++
		n++
	}
	if v > 0o377 {
		return 0, p.errorf("octal escape value is outside of range 0-0o377")
	}
	return rune(v), nil
}

// charEscape reads an escape that stands for one character (p.pos at the
// character after the backslash), in or out of a class.
func (p *parser) charEscape() (rune, error) {
	c := p.src[p.pos]
	simple := map[byte]rune{'a': 7, 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t', 'v': '\v'}
	if r, ok := simple[c]; ok {
		p.pos++
		return r, nil
	}
	switch c {
	case '0':
		return p.octal()
	case 'x', 'u', 'U':
		n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[c]
		p.pos++
		if p.pos+n > len(p.src) {
			return 0, p.errorf("incomplete escape \\%c", c)
		}
		v, err := strconv.ParseUint(p.src[p.pos:p.pos+n], 16, 32)
		if err != nil {
			return 0, p.errorf("incomplete escape \\%c%s", c, p.src[p.pos:p.pos+n])
		}
		if v > unicode.MaxRune {
			return 0, p.errorf("bad escape \\%c%s", c, p.src[p.pos:p.pos+n])
		}
		p.pos += n
		return rune(v), nil
	case 'N':
		return 0, p.errorf("named Unicode escapes (\\N{...}) are not read")
	}
	r := p.peek()
	if r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
		return 0, p.errorf("bad escape \\%c", r)
	}
	p.next()
	return r, nil
}

// class reads a set after its '['.
func (p *parser) class() (*charClass, error) {
	start := p.pos - 1
	cl := &charClass{}
	if p.more() && p.src[p.pos] == '^' {
		cl.neg = true
		p.pos++
	}
	first := true
	for {
		if !p.more() {
			p.pos = start
			return nil, p.errorf("unterminated character set")
		}
		if p.src[p.pos] == ']' && !first {
			p.pos++
			return cl, nil
		}
		first = false
		lo, named, err := p.classItem()
		if err != nil {
			return nil, err
		}
		if named != nil {
			cl.named = append(cl.named, *named)
			continue
		}
		hi := lo
		if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.pos++
			h, named, err := p.classItem()
			if err != nil {
				return nil, err
			}
			if named != nil {
				return nil, p.errorf("bad character range")
			}
			if h < lo {
				return nil, p.errorf("bad character range %c-%c", lo, h)
			}
			hi = h
		}
		cl.ranges = append(cl.ranges, lo, hi)
	}
}

func (p *parser) classItem() (rune, *namedSet, error) {
	if p.src[p.pos] != '\\' {
		return p.next(), nil, nil
	}
	p.pos++
	if !p.more() {
		return 0, nil, p.errorf("bad escape (end of pattern)")
	}
	c := p.src[p.pos]
	switch c {
	case 'd', 'D', 'w', 'W', 's', 'S':
		p.pos++
		return 0, &namedSet{kind: lower(c), neg: c < 'a'}, nil
	case 'b':
		p.pos++
		return '\b', nil, nil
	}
	if c >= '1' && c <= '7' {
		r, err := p.octal()
		return r, nil, err
	}
	if c == '8' || c == '9' {
		return 0, nil, p.errorf("bad escape \\%c", c)
	}
	r, err := p.charEscape()
	return r, nil, err
}

var errBudget = errors.New("step budget spent")
