package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxHeaderSize is the largest header huggingface/safetensors accepts.
const MaxHeaderSize = 100_000_000

// metadataKey is the one header key that is not a tensor.
const metadataKey = "__metadata__"

// ParseHeader checks a header (the JSON bytes after the 8-byte length) against
// a data section of dataLen bytes. It returns the metadata (nil when absent)
// and the tensors sorted by data offset. Errors name the tensor where known but
// not the file; Open adds the path.
//
// encoding/json cannot be used directly: it silently keeps the last of two
// duplicate keys, so the header is walked token by token.
func ParseHeader(header []byte, dataLen int64) (map[string]string, []TensorInfo, error) {
	if dataLen < 0 {
		return nil, nil, fmt.Errorf("data section length %d is negative", dataLen)
	}
	if !utf8.Valid(header) {
		return nil, nil, errors.New("header is not valid UTF-8")
	}
	p := &headerParser{dec: json.NewDecoder(bytes.NewReader(header))}
	p.dec.UseNumber()
	meta, tensors, err := p.parse()
	if err != nil {
		return nil, nil, err
	}
	if err := checkLayout(tensors, dataLen); err != nil {
		return nil, nil, err
	}
	return meta, tensors, nil
}

type headerParser struct {
	dec *json.Decoder
}

// token reads the next JSON token, turning a premature end into a clear error.
func (p *headerParser) token() (json.Token, error) {
	tok, err := p.dec.Token()
	if errors.Is(err, io.EOF) {
		return nil, errors.New("header JSON ends early")
	}
	if err != nil {
		return nil, fmt.Errorf("header is not valid JSON: %w", err)
	}
	return tok, nil
}

// openObject reads a '{' token; what names the value for the error.
func (p *headerParser) openObject(what string) error {
	tok, err := p.token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("%s is %s, not a JSON object", what, describe(tok))
	}
	return nil
}

// key reads the next object key, or reports ok=false at the closing '}'.
func (p *headerParser) key() (k string, ok bool, err error) {
	tok, err := p.token()
	if err != nil {
		return "", false, err
	}
	switch t := tok.(type) {
	case string:
		return t, true, nil
	case json.Delim:
		if t == '}' {
			return "", false, nil
		}
	}
	return "", false, fmt.Errorf("header is not valid JSON: unexpected %s", describe(tok))
}

func (p *headerParser) parse() (map[string]string, []TensorInfo, error) {
	tok, err := p.dec.Token()
	if errors.Is(err, io.EOF) {
		return nil, nil, errors.New("header is empty, not a JSON object")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("header is not a JSON object: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, nil, fmt.Errorf("header is %s, not a JSON object", describe(tok))
	}
	var meta map[string]string
	var tensors []TensorInfo
	seen := map[string]bool{}
	for {
		k, ok, err := p.key()
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			break
		}
		if seen[k] {
			return nil, nil, fmt.Errorf("duplicate key %q in header", k)
		}
		seen[k] = true
		if k == metadataKey {
			if meta, err = p.metadata(); err != nil {
				return nil, nil, err
			}
			continue
		}
		t, err := p.tensor(k)
		if err != nil {
			return nil, nil, err
		}
		tensors = append(tensors, t)
	}
	// Only whitespace may follow the object (writers pad with spaces).
	if tok, err := p.dec.Token(); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, nil, fmt.Errorf("header has trailing bytes after the JSON object: %w", err)
		}
		return nil, nil, fmt.Errorf("header has trailing data after the JSON object: %s", describe(tok))
	}
	return meta, tensors, nil
}

// metadata reads __metadata__: an object of string to string. null is taken
// as no metadata, as huggingface/safetensors does.
func (p *headerParser) metadata() (map[string]string, error) {
	tok, err := p.token()
	if err != nil {
		return nil, err
	}
	if tok == nil {
		return nil, nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("%s is %s, not an object of strings", metadataKey, describe(tok))
	}
	meta := map[string]string{}
	for {
		k, ok, err := p.key()
		if err != nil {
			return nil, err
		}
		if !ok {
			return meta, nil
		}
		if _, dup := meta[k]; dup {
			return nil, fmt.Errorf("%s: duplicate key %q", metadataKey, k)
		}
		tok, err := p.token()
		if err != nil {
			return nil, err
		}
		v, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("%s: value of %q is %s, not a string", metadataKey, k, describe(tok))
		}
		meta[k] = v
	}
}

// tensor reads one tensor entry: exactly dtype, shape and data_offsets.
func (p *headerParser) tensor(name string) (TensorInfo, error) {
	t := TensorInfo{Name: name}
	fail := func(format string, args ...any) (TensorInfo, error) {
		return TensorInfo{}, fmt.Errorf("tensor %q: %s", name, fmt.Sprintf(format, args...))
	}
	if err := p.openObject("entry"); err != nil {
		return fail("%v", err)
	}
	var haveDType, haveShape, haveOffsets bool
	for {
		k, ok, err := p.key()
		if err != nil {
			return fail("%v", err)
		}
		if !ok {
			break
		}
		switch k {
		case "dtype":
			if haveDType {
				return fail("duplicate field %q", k)
			}
			haveDType = true
			tok, err := p.token()
			if err != nil {
				return fail("%v", err)
			}
			s, ok := tok.(string)
			if !ok {
				return fail("dtype is %s, not a string", describe(tok))
			}
			if t.DType, err = ParseDType(s); err != nil {
				return fail("%v", err)
			}
		case "shape":
			if haveShape {
				return fail("duplicate field %q", k)
			}
			haveShape = true
			if t.Shape, err = p.intArray("shape"); err != nil {
				return fail("%v", err)
			}
		case "data_offsets":
			if haveOffsets {
				return fail("duplicate field %q", k)
			}
			haveOffsets = true
			offs, err := p.intArray("data_offsets")
			if err != nil {
				return fail("%v", err)
			}
			if len(offs) != 2 {
				return fail("data_offsets has %d numbers, want [begin,end]", len(offs))
			}
			t.Begin, t.End = offs[0], offs[1]
		default:
			return fail("unknown field %q (want only dtype, shape, data_offsets)", k)
		}
	}
	switch {
	case !haveDType:
		return fail("missing field \"dtype\"")
	case !haveShape:
		return fail("missing field \"shape\"")
	case !haveOffsets:
		return fail("missing field \"data_offsets\"")
	}
	if t.Begin > t.End {
		return fail("data_offsets [%d,%d] begin after end", t.Begin, t.End)
	}
	need, err := byteSize(t.DType, t.Shape)
	if err != nil {
		return fail("%v", err)
	}
	if have := t.End - t.Begin; have != need {
		return fail("data_offsets [%d,%d] hold %d bytes, shape %s %s needs %d",
			t.Begin, t.End, have, formatShape(t.Shape), t.DType, need)
	}
	return t, nil
}

// intArray reads an array of non-negative integers that fit in int64.
func (p *headerParser) intArray(what string) ([]int64, error) {
	tok, err := p.token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, fmt.Errorf("%s is %s, not an array of integers", what, describe(tok))
	}
	out := []int64{}
	for {
		tok, err := p.token()
		if err != nil {
			return nil, err
		}
		if d, ok := tok.(json.Delim); ok && d == ']' {
			return out, nil
		}
		num, ok := tok.(json.Number)
		if !ok {
			return nil, fmt.Errorf("%s holds %s, not a non-negative integer", what, describe(tok))
		}
		v, err := parseNonNegative(string(num))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, v)
	}
}

// parseNonNegative accepts only a plain decimal literal: no sign, fraction or
// exponent, as a Rust usize field would.
func parseNonNegative(s string) (int64, error) {
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("%s is not a non-negative integer", s)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s is too large (limit %d)", s, int64(math.MaxInt64))
	}
	return v, nil
}

// numElements is the product of shape, overflow-checked in int64.
func numElements(shape []int64) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("shape %s has a negative dimension", formatShape(shape))
		}
		if d != 0 && n > math.MaxInt64/d {
			return 0, fmt.Errorf("shape %s has more elements than fit in int64", formatShape(shape))
		}
		n *= d
	}
	return n, nil
}

// byteSize is numElements(shape)*dtype size, overflow-checked.
func byteSize(dt DType, shape []int64) (int64, error) {
	n, err := numElements(shape)
	if err != nil {
		return 0, err
	}
	size := int64(dt.Size())
	if size == 0 {
		return 0, fmt.Errorf("unknown dtype %q", string(dt))
	}
	if n > math.MaxInt64/size {
		return 0, fmt.Errorf("shape %s %s needs more bytes than fit in int64", formatShape(shape), dt)
	}
	return n * size, nil
}

// checkLayout sorts tensors by offset and checks they tile the data section
// exactly: contiguous from 0, no hole, no overlap, ending at dataLen.
func checkLayout(tensors []TensorInfo, dataLen int64) error {
	sort.SliceStable(tensors, func(i, j int) bool {
		if tensors[i].Begin != tensors[j].Begin {
			return tensors[i].Begin < tensors[j].Begin
		}
		return tensors[i].End < tensors[j].End
	})
	end := int64(0)
	prev := ""
	for _, t := range tensors {
		switch {
		case t.Begin > end && prev == "":
			return fmt.Errorf("tensor %q: data_offsets [%d,%d] leave a hole: the data section starts at 0", t.Name, t.Begin, t.End)
		case t.Begin > end:
			return fmt.Errorf("tensor %q: data_offsets [%d,%d] leave a hole after tensor %q, which ends at %d", t.Name, t.Begin, t.End, prev, end)
		case t.Begin < end:
			return fmt.Errorf("tensor %q: data_offsets [%d,%d] overlap tensor %q, which ends at %d", t.Name, t.Begin, t.End, prev, end)
		}
		end, prev = t.End, t.Name
	}
	switch {
	case end > dataLen:
		return fmt.Errorf("tensor %q: data_offsets end at %d but the data section has only %d bytes (file truncated?)", prev, end, dataLen)
	case end < dataLen:
		return fmt.Errorf("%d trailing bytes after the last tensor (tensors end at %d, data section is %d bytes)", dataLen-end, end, dataLen)
	}
	return nil
}

// describe names a JSON token's kind for error messages.
func describe(tok json.Token) string {
	switch t := tok.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case json.Delim:
		switch t {
		case '{':
			return "an object"
		case '[':
			return "an array"
		}
		return fmt.Sprintf("%q", string(t))
	}
	return fmt.Sprintf("%T", tok)
}

// formatShape writes a shape as [a,b,c].
func formatShape(shape []int64) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, d := range shape {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(d, 10))
	}
	b.WriteByte(']')
	return b.String()
}
