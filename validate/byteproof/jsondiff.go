package byteproof

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// JSON compared as loaders read it: key order and layout do not matter,
// values do. Numbers stay as their text (json.Number) so that no float64
// rounding can make two different numbers look equal; two texts of one
// value (1e-05 and 0.00001) are equal, an integer and a float are not
// (Python's json gives int and float, and range(3.0) fails where range(3)
// does not).

// maxJSONDepth bounds nesting, as encoding/json's own decoder does.
const maxJSONDepth = 10000

// decodeJSON decodes one JSON value and nothing after it. Objects become
// map[string]any (the last of duplicate keys wins, as in Python and Go);
// dups lists the paths of keys that appeared more than once.
func decodeJSON(b []byte) (v any, dups []string, err error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if v, err = readJSON(dec, "", &dups, 0); err != nil {
		return nil, nil, fmt.Errorf("not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, errors.New("not valid JSON: data after the top-level value")
	}
	return v, dups, nil
}

func readJSON(dec *json.Decoder, at string, dups *[]string, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("nested deeper than %d at %s", maxJSONDepth, at)
	}
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return tok, nil
	}
	switch d {
	case '{':
		m := map[string]any{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, err
			}
			k, _ := kt.(string)
			kp := keyPath(at, k)
			v, err := readJSON(dec, kp, dups, depth+1)
			if err != nil {
				return nil, err
			}
			if _, dup := m[k]; dup {
				*dups = append(*dups, kp)
			}
			m[k] = v
		}
		_, err := dec.Token() // the closing brace
		return m, err
	case '[':
		a := []any{}
		for dec.More() {
			v, err := readJSON(dec, fmt.Sprintf("%s[%d]", at, len(a)), dups, depth+1)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := dec.Token()
		return a, err
	}
	return nil, fmt.Errorf("unexpected %v at %s", d, at)
}

var plainKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// keyPath appends an object key to a path: rope_parameters.rope_theta, or
// the key quoted when it holds anything else (a dot, a newline).
func keyPath(at, k string) string {
	if !plainKey.MatchString(k) {
		k = strconv.Quote(k)
	}
	if at == "" {
		return k
	}
	return at + "." + k
}

// jsonDiff is the first difference between two decoded values.
type jsonDiff struct {
	path     string
	a, b     any
	inA, inB bool
}

// describe words the difference for a one-line detail.
func (d *jsonDiff) describe(aName, bName string) string {
	p := d.path
	if p == "" {
		p = "the whole value"
	}
	switch {
	case !d.inA:
		return fmt.Sprintf("%s is in %s (%s), not in %s", p, bName, render(d.b), aName)
	case !d.inB:
		return fmt.Sprintf("%s is in %s (%s), not in %s", p, aName, render(d.a), bName)
	}
	return fmt.Sprintf("%s is %s in %s, %s in %s", p, render(d.a), aName, render(d.b), bName)
}

// firstJSONDiff compares a with b and returns the first difference in
// sorted key order, nil when equal. kinds: an integer and a float of the
// same value differ.
func firstJSONDiff(a, b any, at string, kinds bool) *jsonDiff {
	differ := &jsonDiff{path: at, a: a, b: b, inA: true, inB: true}
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok {
			return differ
		}
		keys := sortedKeys(x)
		for k := range y {
			if _, ok := x[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			va, okA := x[k]
			vb, okB := y[k]
			if !okA || !okB {
				return &jsonDiff{path: keyPath(at, k), a: va, b: vb, inA: okA, inB: okB}
			}
			if d := firstJSONDiff(va, vb, keyPath(at, k), kinds); d != nil {
				return d
			}
		}
		return nil
	case []any:
		y, ok := b.([]any)
		if !ok {
			return differ
		}
		for i := range min(len(x), len(y)) {
			if d := firstJSONDiff(x[i], y[i], fmt.Sprintf("%s[%d]", at, i), kinds); d != nil {
				return d
			}
		}
		if len(x) != len(y) {
			return differ
		}
		return nil
	case json.Number:
		if y, ok := b.(json.Number); ok && sameNumber(x, y, kinds) {
			return nil
		}
		return differ
	}
	if a == b { // strings, booleans, null
		return nil
	}
	return differ
}

// sameNumber compares two JSON numbers exactly, by decimal value (and, with
// kinds, integer or not).
func sameNumber(a, b json.Number, kinds bool) bool {
	if a == b {
		return true
	}
	ca, ia, okA := canonNumber(string(a))
	cb, ib, okB := canonNumber(string(b))
	return okA && okB && ca == cb && (!kinds || ia == ib)
}

// canonNumber writes a JSON number as sign, significant digits and a power
// of ten (1e-05 and 0.00001 are both 1e-5), and says whether it was written
// as an integer. ok is false for an exponent past int32, which is compared
// as text instead.
func canonNumber(s string) (canon string, integer, ok bool) {
	integer = !strings.ContainsAny(s, ".eE")
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, exp := s, int64(0)
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.ParseInt(s[i+1:], 10, 32)
		if err != nil {
			return "", false, false
		}
		mant, exp = s[:i], e
	}
	whole, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(whole+frac, "0")
	exp -= int64(len(frac))
	if digits == "" {
		return "0", integer, true // zero, whatever its sign and exponent
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	sign := ""
	if neg {
		sign = "-"
	}
	return fmt.Sprintf("%s%se%d", sign, trimmed, exp), integer, true
}

// shown is text render passes through as it is (a description such as
// "absent", not a JSON value).
type shown string

// render shows a decoded value on one line, shortened.
func render(v any) string {
	if s, ok := v.(shown); ok {
		return string(s)
	}
	b, err := jsonMarshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	const max = 80
	if len(b) <= max {
		return string(b)
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return string(b[:cut]) + "..."
}

func newJSONEncoder(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc
}
