package safetensors

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxHeaderSize is the largest header huggingface/safetensors accepts.
const MaxHeaderSize = 100_000_000

// MaxTensorsPerFile bounds the tensors one safetensors file may hold. Real
// shards hold hundreds to a few thousand (DeepSeek-V3: about 91,000 tensors
// over 163 shards, 560 a shard; Kimi-K2 INT4: about 211,000 over 64, 3,300
// a shard), a small model saved unsharded a few thousand, and even the whole
// of Kimi-K2 INT4 in one file would fit. Each tensor costs about 200 bytes
// here and more in the callers' maps and plans, so a header of a million
// empty tensors (60 MB of JSON) is refused, before anything is built for
// them, instead of costing gigabytes. Callers that add files up bound the
// total themselves.
const MaxTensorsPerFile = 1 << 18

// maxRank bounds the dimensions of one tensor. Real weights have one to
// five (PyTorch's kernels take at most 25); 16 keeps the shapes of a
// maximal header to 128 bytes a tensor.
const maxRank = 16

// maxMetadataEntries and maxMetadataBytes bound __metadata__, which an open
// file keeps for as long as it is open (every shard of a checkpoint at
// once). Checkpoints write {"format":"pt"} or a few keys like it; even the
// training notes some tools add stay far under 1 MiB.
const (
	maxMetadataEntries = 1 << 10
	maxMetadataBytes   = 1 << 20
)

// metadataKey is the one header key that is not a tensor.
const metadataKey = "__metadata__"

// ParseHeader checks a header (the JSON bytes after the 8-byte length) against
// a data section of dataLen bytes. It returns the metadata (nil when absent)
// and the tensors sorted by data offset. Errors name the tensor where known but
// not the file; Open adds the path.
//
// encoding/json is not used: it silently keeps the last of two duplicate
// keys, and its token stream costs over a kilobyte of garbage a tensor. The
// header is measured first (well formed, how many tensors) with nothing
// built, so a header over MaxTensorsPerFile costs no more than its bytes.
func ParseHeader(header []byte, dataLen int64) (map[string]string, []TensorInfo, error) {
	return parseHeader(header, dataLen)
}

func parseHeader(header []byte, dataLen int64) (map[string]string, []TensorInfo, error) {
	if dataLen < 0 {
		return nil, nil, fmt.Errorf("data section length %d is negative", dataLen)
	}
	if !utf8.Valid(header) {
		return nil, nil, errors.New("header is not valid UTF-8")
	}
	p := &headerParser{s: scanner{b: header, what: "header"}}
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
	s scanner
	// shapes holds one copy of each distinct shape a header spells, keyed
	// by its JSON text: the experts of a layer share a handful of shapes,
	// so 200,000 tensors need a few hundred slices, not 200,000. Bounded
	// by maxSharedShapes; past it each tensor gets its own.
	shapes map[string][]int64
}

// maxSharedShapes bounds headerParser.shapes, so a hostile header of
// distinct shapes costs no more than one of plain ones.
const maxSharedShapes = 1 << 12

// openObject reads a '{'; what names the value for the error.
func (p *headerParser) openObject(what string) error {
	if err := p.s.atObject(what); err != nil {
		return err
	}
	p.s.i++
	return nil
}

// key reads the next object key (a view, valid until the next string is
// read), or reports ok=false at the closing '}'. first is true for the
// object's first key, which no ',' precedes.
func (p *headerParser) key(first bool) (k []byte, ok bool, err error) {
	switch p.s.next() {
	case '}':
		p.s.i++
		return nil, false, nil
	case ',':
		if first {
			return nil, false, p.s.bad()
		}
		p.s.i++
	default:
		if !first {
			return nil, false, p.s.bad()
		}
	}
	k, err = p.s.str()
	if err != nil {
		return nil, false, err
	}
	if err := p.s.expect(':'); err != nil {
		return nil, false, err
	}
	return k, true, nil
}

func (p *headerParser) parse() (map[string]string, []TensorInfo, error) {
	s := &p.s
	if err := s.notEmpty("header"); err != nil {
		return nil, nil, err
	}
	// Measure before building: the whole header is checked to be well
	// formed and its tensors counted, allocating nothing.
	n, err := s.enter("header", metadataKey, MaxTensorsPerFile, "header lists %d tensors, over the limit of %d for one file (real shards hold a few thousand)")
	if err != nil {
		return nil, nil, err
	}
	var meta map[string]string
	tensors := make([]TensorInfo, 0, n)
	// byName finds duplicate keys as they come, so the first one in the
	// document is the one reported; it is dropped after the parse.
	byName := make(map[string]struct{}, n)
	haveMeta := false
	for first := true; ; first = false {
		k, ok, err := p.key(first)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			break
		}
		if string(k) == metadataKey {
			if haveMeta {
				return nil, nil, fmt.Errorf("duplicate key %q in header", metadataKey)
			}
			haveMeta = true
			if meta, err = p.metadata(); err != nil {
				return nil, nil, err
			}
			continue
		}
		if _, dup := byName[string(k)]; dup {
			return nil, nil, fmt.Errorf("duplicate key %q in header", k)
		}
		if len(tensors) == n { // cannot happen after the count; no path builds more than it
			return nil, nil, fmt.Errorf("header lists more than %d tensors", n)
		}
		name := string(k)
		t, err := p.tensor(name)
		if err != nil {
			return nil, nil, err
		}
		byName[name] = struct{}{}
		tensors = append(tensors, t)
	}
	// Only whitespace may follow the object (writers pad with spaces).
	if err := s.trailing(); err != nil {
		return nil, nil, err
	}
	return meta, tensors, nil
}

// metadata reads __metadata__: an object of string to string. null is taken
// as no metadata, as huggingface/safetensors does.
func (p *headerParser) metadata() (map[string]string, error) {
	if null, err := p.s.isNull(); null || err != nil {
		return nil, err
	}
	if p.s.next() != '{' {
		kind, err := p.s.valueKind()
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%s is %s, not an object of strings", metadataKey, kind)
	}
	p.s.i++
	meta := map[string]string{}
	size := 0
	err := p.stringMembers(func(k string) error {
		if _, dup := meta[k]; dup {
			return fmt.Errorf("%s: duplicate key %q", metadataKey, k)
		}
		if len(meta) == maxMetadataEntries {
			return fmt.Errorf("%s has more than %d keys (real files have a few)", metadataKey, maxMetadataEntries)
		}
		return nil
	}, func(k, kind string) error {
		return fmt.Errorf("%s: value of %q is %s, not a string", metadataKey, k, kind)
	}, func(k string, v []byte) error {
		if size += len(k) + len(v); size > maxMetadataBytes {
			return fmt.Errorf("%s holds more than %d bytes (real files hold a few)", metadataKey, maxMetadataBytes)
		}
		meta[k] = string(v)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return meta, nil
}

// stringMembers reads the members of the object just opened up to its '}',
// every value a string: key vets each key before its value is read,
// notString words a value of another kind, and value takes each value (a
// view, valid until the next string is read).
func (p *headerParser) stringMembers(key func(k string) error, notString func(k, kind string) error, value func(k string, v []byte) error) error {
	for first := true; ; first = false {
		kb, ok, err := p.key(first)
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		k := string(kb)
		if err := key(k); err != nil {
			return err
		}
		if p.s.next() != '"' {
			kind, err := p.s.valueKind()
			if err != nil {
				return err
			}
			return notString(k, kind)
		}
		v, err := p.s.str()
		if err != nil {
			return err
		}
		if err := value(k, v); err != nil {
			return err
		}
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
	var dims [maxRank]int64
	for first := true; ; first = false {
		k, ok, err := p.key(first)
		if err != nil {
			return fail("%v", err)
		}
		if !ok {
			break
		}
		switch string(k) {
		case "dtype":
			if haveDType {
				return fail("duplicate field %q", k)
			}
			haveDType = true
			if p.s.next() != '"' {
				kind, err := p.s.valueKind()
				if err != nil {
					return fail("%v", err)
				}
				return fail("dtype is %s, not a string", kind)
			}
			v, err := p.s.str()
			if err != nil {
				return fail("%v", err)
			}
			var ok bool
			if t.DType, ok = dtypeOf(v); !ok {
				return fail("unknown dtype %q", v)
			}
		case "shape":
			if haveShape {
				return fail("duplicate field %q", k)
			}
			haveShape = true
			start := p.s.i
			n, err := p.intArray("shape", dims[:])
			if err != nil {
				return fail("%v", err)
			}
			if n > maxRank {
				return fail("shape has %d dimensions, over the limit of %d", n, maxRank)
			}
			t.Shape = p.shape(p.s.b[start:p.s.i], dims[:n])
		case "data_offsets":
			if haveOffsets {
				return fail("duplicate field %q", k)
			}
			haveOffsets = true
			n, err := p.intArray("data_offsets", dims[:2])
			if err != nil {
				return fail("%v", err)
			}
			if n != 2 {
				return fail("data_offsets has %d numbers, want [begin,end]", n)
			}
			t.Begin, t.End = dims[0], dims[1]
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

// shape returns dims (the shape just read, spelled text in the header) as
// a slice shared with every other tensor of the header spelled the same.
// The shared slices are never written: callers replace a Shape, they do not
// edit it.
func (p *headerParser) shape(text []byte, dims []int64) []int64 {
	if s, ok := p.shapes[string(text)]; ok {
		return s
	}
	s := slices.Clone(dims)
	if s == nil {
		s = []int64{}
	}
	if p.shapes == nil {
		p.shapes = map[string][]int64{}
	}
	if len(p.shapes) < maxSharedShapes {
		p.shapes[string(text)] = s
	}
	return s
}

// intArray reads an array of non-negative integers that fit in int64 into
// out, and returns how many it held; those past len(out) are checked and
// counted but not kept.
func (p *headerParser) intArray(what string, out []int64) (int, error) {
	if p.s.next() != '[' {
		kind, err := p.s.valueKind()
		if err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%s is %s, not an array of integers", what, kind)
	}
	p.s.i++
	if p.s.next() == ']' {
		p.s.i++
		return 0, nil
	}
	for n := 0; ; n++ {
		if c := p.s.next(); c != '-' && !isDigit(c) {
			kind, err := p.s.valueKind()
			if err != nil {
				return 0, err
			}
			return 0, fmt.Errorf("%s holds %s, not a non-negative integer", what, kind)
		}
		num, err := p.s.number()
		if err != nil {
			return 0, err
		}
		v, err := parseNonNegative(num)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		if n < len(out) {
			out[n] = v
		}
		if done, err := p.s.endOf(']'); err != nil {
			return 0, err
		} else if done {
			return n + 1, nil
		}
	}
}

// allDTypes lists dtypeSizes' keys in a fixed order.
var allDTypes = []DType{BF16, F32, F16, F8E4M3, I64, I32, U8, BOOL, I8, I16, U16, U32, U64, F64, F8E5M2, F8E8M0}

// dtypeOf finds the dtype a header spells, without allocating.
func dtypeOf(b []byte) (DType, bool) {
	for _, d := range allDTypes {
		if string(b) == string(d) {
			return d, true
		}
	}
	return "", false
}

// parseNonNegative accepts only a plain decimal literal: no sign, fraction or
// exponent, as a Rust usize field would.
func parseNonNegative(b []byte) (int64, error) {
	for _, c := range b {
		if !isDigit(c) {
			return 0, fmt.Errorf("%s is not a non-negative integer", b)
		}
	}
	if len(b) == 0 {
		return 0, errors.New("empty number")
	}
	var v int64
	for _, c := range b {
		d := int64(c - '0')
		if v > (math.MaxInt64-d)/10 {
			return 0, fmt.Errorf("%s is too large (limit %d)", b, int64(math.MaxInt64))
		}
		v = v*10 + d
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
	slices.SortStableFunc(tensors, func(a, b TensorInfo) int {
		if c := cmp.Compare(a.Begin, b.Begin); c != 0 {
			return c
		}
		return cmp.Compare(a.End, b.End)
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
