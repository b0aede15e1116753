package safetensors

import (
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// maxJSONDepth bounds how deeply the values the readers skip may nest (an
// index's unknown keys and metadata). Real headers and indexes nest three
// deep; the bound keeps a document of a hundred million '[' from costing a
// stack frame each.
const maxJSONDepth = 1000

// scanner walks a JSON document held in memory, as strictly as
// encoding/json accepts it, and decodes strings exactly as encoding/json
// does. It exists because a header or an index can be a hundred megabytes:
// json.Decoder's tokens cost about 1.5 KB of garbage and 56 allocations for
// every tensor of a header (393 MB and 1.1 s for 262,144 tensors), where
// this costs the strings it returns and nothing else. Skipping and counting
// allocate nothing, so a document can be measured before anything is built
// from it. The document must be valid UTF-8 (both callers check first).
type scanner struct {
	b       []byte
	i       int
	what    string // "header" or "index": names the document in errors
	scratch []byte // decoded strings with escapes
}

// space skips JSON whitespace.
func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next skips whitespace and returns the next byte without consuming it, 0
// at the end of the document.
func (s *scanner) next() byte {
	s.space()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) atEnd() bool { return s.i >= len(s.b) }

func (s *scanner) eof() error { return fmt.Errorf("%s JSON ends early", s.what) }

// bad reports the character at the current position as unexpected.
func (s *scanner) bad() error {
	if s.atEnd() {
		return s.eof()
	}
	r, _ := utf8.DecodeRune(s.b[s.i:])
	return fmt.Errorf("%s is not valid JSON: unexpected %q at byte %d", s.what, r, s.i)
}

// expect consumes the byte c, after whitespace.
func (s *scanner) expect(c byte) error {
	if s.next() != c {
		return s.bad()
	}
	s.i++
	return nil
}

// kindOf names the JSON value that starts with c, "" if none does.
func kindOf(c byte) string {
	switch {
	case c == '{':
		return "an object"
	case c == '[':
		return "an array"
	case c == '"':
		return "a string"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	case c == '-' || c >= '0' && c <= '9':
		return "a number"
	}
	return ""
}

// valueKind consumes the next value and names its kind, for an error
// message about a value of the wrong kind. A malformed value is reported as
// such instead.
func (s *scanner) valueKind() (string, error) {
	k := kindOf(s.next())
	if k == "" {
		return "", s.bad()
	}
	if err := s.skipValue(1); err != nil {
		return "", err
	}
	return k, nil
}

// isNull consumes a null if one comes next.
func (s *scanner) isNull() (bool, error) {
	if s.next() != 'n' {
		return false, nil
	}
	return true, s.literal("null")
}

func (s *scanner) literal(word string) error {
	for j := 0; j < len(word); j++ {
		if s.atEnd() {
			return s.eof()
		}
		if s.b[s.i] != word[j] {
			return s.bad()
		}
		s.i++
	}
	return nil
}

// str reads a string and returns its decoded bytes, valid only until the
// next call: without escapes a view of the document, with escapes the
// scanner's scratch buffer. Callers convert what they keep.
func (s *scanner) str() ([]byte, error) {
	if s.next() != '"' {
		return nil, s.bad()
	}
	s.i++
	start := s.i
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], nil
		case c == '\\':
			b, err := s.strEscaped(append(s.scratch[:0], s.b[start:s.i]...))
			s.scratch = b[:0]
			return b, err
		case c < 0x20:
			return nil, s.bad()
		}
		s.i++
	}
	return nil, s.eof()
}

// strEscaped finishes a string from its first backslash, decoding into buf.
// A \u escape of half a surrogate pair that is not followed by the other
// half becomes U+FFFD, as encoding/json decodes it.
func (s *scanner) strEscaped(buf []byte) ([]byte, error) {
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return buf, nil
		case c < 0x20:
			return nil, s.bad()
		case c != '\\':
			buf = append(buf, c)
			s.i++
			continue
		}
		s.i++
		if s.atEnd() {
			return nil, s.eof()
		}
		switch e := s.b[s.i]; e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			s.i++
			r, err := s.hex4()
			if err != nil {
				return nil, err
			}
			if utf16.IsSurrogate(r) {
				if r2, ok := s.peekU4(); ok {
					if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
						s.i += 6
						buf = utf8.AppendRune(buf, d)
						continue
					}
				}
				r = utf8.RuneError
			}
			buf = utf8.AppendRune(buf, r)
			continue
		default:
			return nil, s.bad()
		}
		s.i++
	}
	return nil, s.eof()
}

// hex4 consumes the four hex digits of a \u escape.
func (s *scanner) hex4() (rune, error) {
	var r rune
	for range 4 {
		if s.atEnd() {
			return 0, s.eof()
		}
		d, ok := hexDigit(s.b[s.i])
		if !ok {
			return 0, s.bad()
		}
		r = r<<4 | d
		s.i++
	}
	return r, nil
}

// peekU4 reads a \uXXXX escape at the current position without consuming it.
func (s *scanner) peekU4() (rune, bool) {
	if len(s.b)-s.i < 6 || s.b[s.i] != '\\' || s.b[s.i+1] != 'u' {
		return 0, false
	}
	var r rune
	for _, c := range s.b[s.i+2 : s.i+6] {
		d, ok := hexDigit(c)
		if !ok {
			return 0, false
		}
		r = r<<4 | d
	}
	return r, true
}

func hexDigit(c byte) (rune, bool) {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0'), true
	case c >= 'a' && c <= 'f':
		return rune(c - 'a' + 10), true
	case c >= 'A' && c <= 'F':
		return rune(c - 'A' + 10), true
	}
	return 0, false
}

// skipString consumes a string, checking its escapes, without decoding it.
func (s *scanner) skipString() error {
	if s.next() != '"' {
		return s.bad()
	}
	s.i++
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return nil
		case c < 0x20:
			return s.bad()
		case c == '\\':
			s.i++
			if s.atEnd() {
				return s.eof()
			}
			switch s.b[s.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				s.i++
				if _, err := s.hex4(); err != nil {
					return err
				}
				continue
			default:
				return s.bad()
			}
		}
		s.i++
	}
	return s.eof()
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// digits consumes one or more decimal digits.
func (s *scanner) digits() error {
	if s.atEnd() {
		return s.eof()
	}
	if !isDigit(s.b[s.i]) {
		return s.bad()
	}
	for s.i < len(s.b) && isDigit(s.b[s.i]) {
		s.i++
	}
	return nil
}

// number consumes a JSON number and returns its literal.
func (s *scanner) number() ([]byte, error) {
	s.space()
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	if s.i < len(s.b) && s.b[s.i] == '0' {
		s.i++
	} else if err := s.digits(); err != nil {
		return nil, err
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if err := s.digits(); err != nil {
			return nil, err
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if err := s.digits(); err != nil {
			return nil, err
		}
	}
	return s.b[start:s.i], nil
}

// skipValue consumes one value of any kind, checking it is well formed,
// without building anything. depth is the nesting of the value itself.
func (s *scanner) skipValue(depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("%s nests values more than %d deep (not a real %s?)", s.what, maxJSONDepth, s.what)
	}
	switch c := s.next(); c {
	case '{', '[':
		closing := byte(']')
		if c == '{' {
			closing = '}'
		}
		s.i++
		if s.next() == closing {
			s.i++
			return nil
		}
		for {
			if c == '{' { // a member's key
				if err := s.skipString(); err != nil {
					return err
				}
				if err := s.expect(':'); err != nil {
					return err
				}
			}
			if err := s.skipValue(depth + 1); err != nil {
				return err
			}
			if done, err := s.endOf(closing); done || err != nil {
				return err
			}
		}
	case '"':
		return s.skipString()
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	}
	_, err := s.number()
	return err
}

// endOf consumes the ',' between members or elements (done false) or the
// closing delimiter (done true).
func (s *scanner) endOf(closing byte) (done bool, err error) {
	switch s.next() {
	case ',':
		s.i++
		return false, nil
	case closing:
		s.i++
		return true, nil
	}
	return false, s.bad()
}

// countMembers counts the members of the object at the current position,
// checking the whole object is well formed, without consuming it or
// building anything; members whose key is spelled exactly skipKey are not
// counted. Callers size what they build by it, or refuse before building.
func (s *scanner) countMembers(skipKey string) (int, error) {
	save := s.i
	defer func() { s.i = save }()
	if err := s.expect('{'); err != nil {
		return 0, err
	}
	if s.next() == '}' {
		return 0, nil
	}
	quoted := `"` + skipKey + `"`
	n := 0
	for {
		s.space()
		start := s.i
		if err := s.skipString(); err != nil {
			return 0, err
		}
		if skipKey == "" || string(s.b[start:s.i]) != quoted {
			n++
		}
		if err := s.expect(':'); err != nil {
			return 0, err
		}
		if err := s.skipValue(2); err != nil {
			return 0, err
		}
		if done, err := s.endOf('}'); err != nil {
			return 0, err
		} else if done {
			return n, nil
		}
	}
}

// atObject checks that the next value is an object, without consuming its
// '{'; what names the value in the error.
func (s *scanner) atObject(what string) error {
	if s.next() == '{' {
		return nil
	}
	kind, err := s.valueKind()
	if err != nil {
		return err
	}
	return fmt.Errorf("%s is %s, not a JSON object", what, kind)
}

// notEmpty checks that the document (what) holds a value at all.
func (s *scanner) notEmpty(what string) error {
	if s.next(); s.atEnd() {
		return fmt.Errorf("%s is empty, not a JSON object", what)
	}
	return nil
}

// enter opens the object at the current position (what names it in
// errors): its members (those not spelled skipKey) are counted first, more
// than limit refused with tooMany (a format of the count and the limit),
// then its '{' is consumed.
func (s *scanner) enter(what, skipKey string, limit int, tooMany string) (int, error) {
	if err := s.atObject(what); err != nil {
		return 0, err
	}
	n, err := s.countMembers(skipKey)
	if err != nil {
		return 0, err
	}
	if n > limit {
		return 0, fmt.Errorf(tooMany, n, limit)
	}
	s.i++ // the '{'
	return n, nil
}

// trailing checks that only whitespace follows the document's value.
func (s *scanner) trailing() error {
	if s.next() != 0 || !s.atEnd() {
		return fmt.Errorf("%s has trailing data after the JSON object (at byte %d)", s.what, s.i)
	}
	return nil
}
