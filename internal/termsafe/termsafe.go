// Package termsafe keeps text that came from a file from steering the
// terminal it is printed on. A tensor name, file name or JSON value can hold
// escape sequences; printed raw, a crafted checkpoint could erase an error
// line and paint a fake "PASS" in its place. Everything moeprep prints for
// people goes through Escape or a Writer.
//
// C0 controls and invalid UTF-8 bytes are shown as \xNN, DEL and the C1
// controls (U+0080..U+009F, which some terminals obey) as \u00NN. The second
// form is also a valid JSON escape of the same character, and encoding/json
// never leaves a raw C0 control inside a string, so a Writer can sit in
// front of --json output without changing what a JSON parser reads.
package termsafe

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"unicode/utf8"
)

// Escape makes s safe to print on one line: every control character,
// newlines and tabs included, is escaped.
func Escape(s string) string { return escape(s, false) }

// Text is Escape for multi-line text: newlines and tabs stay as they are.
func Text(s string) string { return escape(s, true) }

func escape(s string, keepLayout bool) string {
	if clean(s, keepLayout) {
		return s
	}
	var b strings.Builder
	appendEscaped(&b, []byte(s), keepLayout)
	return b.String()
}

func clean(s string, keepLayout bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == 0x7f || c >= 0x80 {
			if keepLayout && (c == '\n' || c == '\t') {
				continue
			}
			if c >= 0x80 {
				r, n := utf8.DecodeRuneInString(s[i:])
				if r != utf8.RuneError && !isC1(r) {
					i += n - 1
					continue
				}
			}
			return false
		}
	}
	return true
}

func isC1(r rune) bool { return r >= 0x80 && r <= 0x9f }

// appendEscaped writes p to b escaped; keepLayout leaves newlines and tabs.
func appendEscaped(b *strings.Builder, p []byte, keepLayout bool) {
	for i := 0; i < len(p); {
		c := p[i]
		switch {
		case c == '\n' || c == '\t':
			if keepLayout {
				b.WriteByte(c)
			} else {
				fmt.Fprintf(b, `\x%02x`, c)
			}
			i++
		case c < 0x20:
			fmt.Fprintf(b, `\x%02x`, c)
			i++
		case c == 0x7f:
			b.WriteString(`\u007f`)
			i++
		case c < 0x80:
			b.WriteByte(c)
			i++
		default:
			r, n := utf8.DecodeRune(p[i:])
			switch {
			case r == utf8.RuneError && n <= 1:
				fmt.Fprintf(b, `\x%02x`, c)
				i++
			case isC1(r):
				fmt.Fprintf(b, `\u%04x`, r)
				i += n
			default:
				b.Write(p[i : i+n])
				i += n
			}
		}
	}
}

// Writer escapes everything written through it as Text does. A rune split
// across two writes is held back until the rest arrives.
type Writer struct {
	mu      sync.Mutex
	w       io.Writer
	pending []byte
}

// NewWriter wraps w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write escapes p and writes it; it reports len(p) on success.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	data := p
	if len(w.pending) > 0 {
		data = append(w.pending, p...)
		w.pending = nil
	}
	// Hold back an incomplete UTF-8 sequence at the end.
	cut := len(data)
	for k := 1; k <= 3 && k <= len(data); k++ {
		c := data[len(data)-k]
		if c < 0x80 {
			break
		}
		if c >= 0xc0 { // a lead byte: complete only if its length fits
			if need := leadLen(c); need > k {
				cut = len(data) - k
			}
			break
		}
	}
	var b strings.Builder
	appendEscaped(&b, data[:cut], true)
	if cut < len(data) {
		w.pending = append([]byte(nil), data[cut:]...)
	}
	if _, err := io.WriteString(w.w, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes out whatever incomplete sequence is held back, escaped.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.pending) == 0 {
		return nil
	}
	var b strings.Builder
	for _, c := range w.pending {
		fmt.Fprintf(&b, `\x%02x`, c)
	}
	w.pending = nil
	_, err := io.WriteString(w.w, b.String())
	return err
}

func leadLen(c byte) int {
	switch {
	case c >= 0xf0:
		return 4
	case c >= 0xe0:
		return 3
	}
	return 2
}
