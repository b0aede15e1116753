package torchbin

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// scanPickle walks the opcode stream of a pickle up to its STOP opcode and
// simulates the unpickler's stack, without building any object. It returns
// the length of the pickle up to and including STOP.
//
// It exists because gopickle trusts its input. It allocates whatever length
// an opcode announces before reading, indexes its dispatch table with
// opcode 0xff, pairs DICT/SETITEMS items without checking their count,
// hashes bytes objects used as dict keys and decodes empty LONG1 payloads,
// all of which crash the process; it decodes long ints in quadratic time;
// and it formats values with %#v into its errors, which for a large
// container prints every element. It also has no limits: every opcode,
// MARK and container costs memory. Refusing such streams here, against the
// limits in limits.go, keeps all of that unreachable, and a refused stream
// costs nothing but this scan.
//
// The simulation records per stack and memo slot what kind of value it
// holds (see slot), enough to know that a dict key is hashable, that REDUCE
// calls a class or function, and how large gopickle's error for a call
// could print.
func scanPickle(p []byte) (int, error) {
	s := newScanner(p, len(p), nil)
	if err := s.run(); err != nil {
		return 0, err
	}
	return s.pos, nil
}

// kind is what the scanner knows of a value.
type kind uint8

const (
	kAbsent    kind = iota // an unset memo entry (gopickle's GET of it pushes None)
	kScalar                // None, bool, int, float
	kStr                   // str
	kBytes                 // bytes: unhashable in gopickle
	kGlobal                // a class or function from GLOBAL or STACK_GLOBAL
	kTuple                 // tuple
	kContainer             // list, dict, set, frozenset, bytearray
	kObject                // the result of a call or a persistent load
)

var kindNames = [...]string{"nothing", "a scalar", "a str", "a bytes object", "a class", "a tuple", "a container", "an object"}

// slot packs a kind (top 4 bits) and a weight (the rest): the length of a
// str or bytes value, or for a tuple the bytes its items print as in a
// gopickle error (see printWeight). Weights saturate at maxWeight.
type slot uint32

const maxWeight = 1<<28 - 1

func mkSlot(k kind, w uint64) slot { return slot(k)<<28 | slot(min(w, maxWeight)) }

func (v slot) kind() kind     { return kind(v >> 28) }
func (v slot) weight() uint64 { return uint64(v & maxWeight) }

// printWeight bounds the bytes %#v prints for a value inside a container:
// a str or bytes value in full (escapes take up to 6 bytes per byte),
// anything else as a pointer or a number.
func (v slot) printWeight() uint64 {
	if k := v.kind(); k == kStr || k == kBytes {
		return 24 + 6*v.weight()
	}
	return 24
}

// fillChunk is the least the scanner reads from a streamed pickle at a time.
const fillChunk = 256 << 10

type scanner struct {
	p     []byte    // the pickle's bytes read so far
	total int       // the pickle's whole length
	src   io.Reader // the bytes after p; nil when p is whole
	pos   int

	stack     []slot // every MARK level's values, bottom first
	marks     []int  // stack heights saved by MARK
	memo      []slot // kAbsent where unset
	memoCount int    // entries set

	ops, nmarks, objects, items int
	maxStack, maxMarkDepth      int // high-water marks, for TestLimitsAdmitLargeShard
}

func newScanner(p []byte, total int, src io.Reader) *scanner {
	return &scanner{p: p, total: total, src: src}
}

func (s *scanner) errf(at int, format string, args ...any) error {
	return fmt.Errorf("pickle offset %d: %s", at, fmt.Sprintf(format, args...))
}

// over reports a count limit.
func (s *scanner) over(at, limit int, what string) error {
	return s.errf(at, "more than %d %s, the limit for one checkpoint file", limit, what)
}

// ensure makes p hold the first end bytes of the pickle (end <= total).
func (s *scanner) ensure(end int) error {
	if end <= len(s.p) {
		return nil
	}
	want := min(s.total, max(end, len(s.p)+fillChunk))
	if want > cap(s.p) {
		p := make([]byte, len(s.p), min(s.total, max(want, 2*cap(s.p))))
		copy(p, s.p)
		s.p = p
	}
	n, err := io.ReadFull(s.src, s.p[len(s.p):want])
	s.p = s.p[:len(s.p)+n]
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return fmt.Errorf("ends after %d bytes, before the %d its zip entry declares", len(s.p), s.total)
	}
	return err
}

// take returns the next n bytes, checking they exist.
func (s *scanner) take(at int, n uint64) ([]byte, error) {
	if n > uint64(s.total-s.pos) {
		return nil, s.errf(at, "argument of %d bytes runs past the end of the pickle", n)
	}
	if err := s.ensure(s.pos + int(n)); err != nil {
		return nil, err
	}
	b := s.p[s.pos : s.pos+int(n)]
	s.pos += int(n)
	return b, nil
}

// line returns the next newline-terminated argument, without the newline,
// refusing one longer than limit bytes before reading further.
func (s *scanner) line(at, limit int, what string) ([]byte, error) {
	start, searched := s.pos, s.pos
	end := min(s.total, start+limit+1) // the newline may sit at start+limit
	for {
		if i := bytes.IndexByte(s.p[searched:min(len(s.p), end)], '\n'); i >= 0 {
			s.pos = searched + i + 1
			return s.p[start : searched+i], nil
		}
		searched = min(len(s.p), end)
		if searched == end {
			if end == s.total {
				return nil, s.errf(at, "text argument has no terminating newline")
			}
			return nil, s.errf(at, "%s longer than %d bytes, the limit", what, limit)
		}
		if err := s.ensure(searched + 1); err != nil {
			return nil, err
		}
	}
}

// base is the stack height where the current MARK level starts.
func (s *scanner) base() int {
	if len(s.marks) == 0 {
		return 0
	}
	return s.marks[len(s.marks)-1]
}

// need checks the current MARK level holds n values, as gopickle's pops do.
func (s *scanner) need(at, n int, op string) error {
	if have := len(s.stack) - s.base(); have < n {
		return s.errf(at, "%s needs %d stack items, has %d", op, n, have)
	}
	return nil
}

func (s *scanner) top(i int) slot { return s.stack[len(s.stack)-1-i] }

func (s *scanner) push(v slot) {
	if len(s.stack) == cap(s.stack) {
		s.stack = grow(s.stack, 1, maxStackDepth+1)
	}
	s.stack = append(s.stack, v)
}

// grow returns s with room for n more elements, doubling its capacity but
// not past limit (unless len(s)+n needs more): append grows large slices by
// a quarter at a time, which would allocate five times a full stack or memo
// over its growth, not two.
func grow[T any](s []T, n, limit int) []T {
	if len(s)+n <= cap(s) {
		return s
	}
	g := make([]T, len(s), max(len(s)+n, min(max(2*cap(s), 64), limit)))
	copy(g, s)
	return g
}

func (s *scanner) pop(n int) { s.stack = s.stack[:len(s.stack)-n] }

// popMark returns the values above the last MARK and drops them and the
// MARK. The returned slice is valid until the next push.
func (s *scanner) popMark(at int, op string) ([]slot, error) {
	if len(s.marks) == 0 {
		return nil, s.errf(at, "%s without a MARK", op)
	}
	b := s.base()
	items := s.stack[b:]
	s.stack = s.stack[:b]
	s.marks = s.marks[:len(s.marks)-1]
	return items, nil
}

// lenArg reads a little-endian length of width bytes (1, 4 or 8).
func (s *scanner) lenArg(at, width int, signed bool) (uint64, error) {
	b, err := s.take(at, uint64(width))
	if err != nil {
		return 0, err
	}
	switch width {
	case 1:
		return uint64(b[0]), nil
	case 4:
		v := binary.LittleEndian.Uint32(b)
		if signed && int32(v) < 0 {
			return 0, s.errf(at, "negative length %d", int32(v))
		}
		return uint64(v), nil
	default:
		return binary.LittleEndian.Uint64(b), nil
	}
}

func (s *scanner) run() error {
	for {
		if s.pos >= len(s.p) {
			if s.pos >= s.total {
				return s.errf(s.pos, "pickle ends without a STOP opcode")
			}
			if err := s.ensure(s.pos + 1); err != nil {
				return err
			}
		}
		at := s.pos
		op := s.p[s.pos]
		s.pos++
		if s.ops++; s.ops > maxPickleOps {
			return s.over(at, maxPickleOps, "pickle opcodes")
		}
		done, err := s.step(at, op)
		if err != nil || done {
			return err
		}
		// Each opcode pushes at most one value, MARK and object, so
		// checking after it keeps every count within its limit plus one.
		// (Items come in batches, bounded by the stack.)
		if len(s.stack) > s.maxStack {
			if s.maxStack = len(s.stack); s.maxStack > maxStackDepth {
				return s.over(at, maxStackDepth, "values on the pickle stack")
			}
		}
		if s.objects > maxObjects || s.items > maxContainerItems || len(s.marks) > maxMarkDepth || s.nmarks > maxMarks {
			return s.overCounts(at)
		}
	}
}

// overCounts reports which of the counts checked after every opcode is
// over its limit.
func (s *scanner) overCounts(at int) error {
	switch {
	case len(s.marks) > maxMarkDepth:
		return s.over(at, maxMarkDepth, "nested MARKs")
	case s.nmarks > maxMarks:
		return s.over(at, maxMarks, "MARK opcodes")
	case s.objects > maxObjects:
		return s.over(at, maxObjects, "objects (containers, strings, calls, MARKs)")
	default:
		return s.over(at, maxContainerItems, "items put into containers")
	}
}

// opNames names the opcodes that errors mention.
var opNames = [256]string{
	'R': "REDUCE", '\x81': "NEWOBJ", '\x92': "NEWOBJ_EX", 'o': "OBJ", 'i': "INST",
	't': "TUPLE", 'l': "LIST", 'd': "DICT", '\x91': "FROZENSET",
	'e': "APPENDS", 'u': "SETITEMS", '\x90': "ADDITEMS", 'a': "APPEND", 's': "SETITEM",
	'\x85': "TUPLE1", '\x86': "TUPLE2", '\x87': "TUPLE3", 'Q': "BINPERSID",
	'T': "BINSTRING", 'U': "SHORT_BINSTRING", 'X': "BINUNICODE", '\x8c': "SHORT_BINUNICODE",
	'\x8d': "BINUNICODE8", '\x96': "BYTEARRAY8", 'B': "BINBYTES", 'C': "SHORT_BINBYTES",
	'\x8e': "BINBYTES8", 'S': "STRING", 'V': "UNICODE", 'P': "PERSID",
	'\x8a': "LONG1", '\x8b': "LONG4", 'I': "INT", 'L': "LONG",
}

// step applies one opcode. The stack effects mirror gopickle's handlers.
func (s *scanner) step(at int, op byte) (done bool, err error) {
	switch op {
	case '(': // MARK
		s.marks = append(s.marks, len(s.stack))
		s.maxMarkDepth = max(s.maxMarkDepth, len(s.marks))
		s.nmarks++
		s.objects++
	case '.': // STOP
		return true, s.need(at, 1, "STOP")
	case '0': // POP
		if len(s.stack) == s.base() {
			_, err = s.popMark(at, "POP")
			return false, err
		}
		s.pop(1)
	case '1': // POP_MARK
		_, err = s.popMark(at, "POP_MARK")
	case '2': // DUP
		if err = s.need(at, 1, "DUP"); err == nil {
			s.push(s.top(0))
		}
	case 'F': // FLOAT
		err = s.textScalar(at, maxFloatText, "FLOAT text")
	case 'I': // INT: refused before gopickle parses the digits
		err = s.textScalar(at, maxIntText, "INT text")
	case 'L': // LONG: refused before gopickle parses the digits
		err = s.textScalar(at, maxIntText, "LONG text")
	case 'S', 'V', 'P': // STRING, UNICODE, PERSID
		var b []byte
		if b, err = s.line(at, maxStringBytes, opNames[op]); err == nil {
			s.objects++
			if op == 'P' {
				s.push(mkSlot(kObject, 0))
			} else {
				s.push(mkSlot(kStr, uint64(len(b))))
			}
		}
	case 'J': // BININT
		err = s.fixed(at, 4)
	case 'K': // BININT1
		err = s.fixed(at, 1)
	case 'M': // BININT2
		err = s.fixed(at, 2)
	case 'G': // BINFLOAT
		err = s.fixed(at, 8)
	case 'N', '\x88', '\x89': // NONE, NEWTRUE, NEWFALSE
		s.push(mkSlot(kScalar, 0))
	case '}', ']', '\x8f': // EMPTY_DICT, EMPTY_LIST, EMPTY_SET
		s.objects++
		s.push(mkSlot(kContainer, 0))
	case ')': // EMPTY_TUPLE
		s.objects++
		s.push(mkSlot(kTuple, 0))
	case 'Q': // BINPERSID: our persistent loader takes any value
		if err = s.need(at, 1, "BINPERSID"); err == nil {
			s.pop(1)
			s.objects++
			s.push(mkSlot(kObject, 0))
		}
	case 'R', '\x81', '\x92': // REDUCE, NEWOBJ, NEWOBJ_EX
		err = s.call(at, op)
	case 'o', 'i': // OBJ, INST
		err = s.instantiate(at, op)
	case '\x93': // STACK_GLOBAL
		if err = s.need(at, 2, "STACK_GLOBAL"); err != nil {
			return false, err
		}
		for i := range 2 {
			if v := s.top(i); v.kind() != kStr {
				return false, s.errf(at, "STACK_GLOBAL needs two str values, got %s", kindNames[v.kind()])
			} else if v.weight() > maxGlobalName {
				return false, s.errf(at, "STACK_GLOBAL name longer than %d bytes, the limit", maxGlobalName)
			}
		}
		s.pop(2)
		s.objects++
		s.push(mkSlot(kGlobal, 0))
	case 'c': // GLOBAL
		if _, err = s.line(at, maxGlobalName, "GLOBAL module"); err == nil {
			if _, err = s.line(at, maxGlobalName, "GLOBAL name"); err == nil {
				s.objects++
				s.push(mkSlot(kGlobal, 0))
			}
		}
	case '\x85', '\x86', '\x87': // TUPLE1, TUPLE2, TUPLE3
		n := int(op-'\x85') + 1
		if err = s.need(at, n, opNames[op]); err == nil {
			w := argsWeight(s.stack[len(s.stack)-n:])
			s.pop(n)
			s.objects++
			s.items += n
			s.push(mkSlot(kTuple, w))
		}
	case 't', 'l', 'd', '\x91': // TUPLE, LIST, DICT, FROZENSET
		var items []slot
		if items, err = s.popMark(at, opNames[op]); err != nil {
			return false, err
		}
		switch op {
		case 'd':
			err = s.checkPairs(at, items, "DICT")
		case '\x91':
			err = s.checkHashable(at, items, "FROZENSET")
		}
		s.objects++
		s.items += len(items)
		if op == 't' {
			s.push(mkSlot(kTuple, argsWeight(items)))
		} else {
			s.push(mkSlot(kContainer, 0))
		}
	case 'a': // APPEND: the list stays where it was
		if err = s.need(at, 2, "APPEND"); err == nil {
			s.pop(1)
			s.items++
		}
	case 'e', 'u', '\x90': // APPENDS, SETITEMS, ADDITEMS
		err = s.extend(at, op)
	case 's': // SETITEM
		if err = s.need(at, 3, "SETITEM"); err == nil {
			if err = s.checkKey(at, s.top(1)); err == nil {
				s.pop(2)
				s.items += 2
			}
		}
	case 'b': // BUILD
		err = s.build(at)
	case 'T': // BINSTRING
		err = s.counted(at, op, 4, true, kStr)
	case 'U', '\x8c': // SHORT_BINSTRING, SHORT_BINUNICODE
		err = s.counted(at, op, 1, false, kStr)
	case 'X': // BINUNICODE
		err = s.counted(at, op, 4, false, kStr)
	case '\x8d': // BINUNICODE8
		err = s.counted(at, op, 8, false, kStr)
	case '\x96': // BYTEARRAY8 (a *ByteArray in gopickle: hashable)
		err = s.counted(at, op, 8, false, kContainer)
	case 'B': // BINBYTES
		err = s.counted(at, op, 4, false, kBytes)
	case 'C': // SHORT_BINBYTES
		err = s.counted(at, op, 1, false, kBytes)
	case '\x8e': // BINBYTES8
		err = s.counted(at, op, 8, false, kBytes)
	case '\x8a', '\x8b': // LONG1, LONG4
		err = s.long(at, op)
	case 'g', 'h', 'j': // GET, BINGET, LONG_BINGET
		err = s.get(at, op)
	case 'p', 'q', 'r': // PUT, BINPUT, LONG_BINPUT
		err = s.put(at, op)
	case '\x94': // MEMOIZE: gopickle stores at index len(memo), its entry count
		if err = s.need(at, 1, "MEMOIZE"); err == nil {
			err = s.store(at, s.memoCount)
		}
	case '\x80': // PROTO
		err = s.skip(at, 1)
	case '\x95': // FRAME: frames only chunk the stream; check the length
		var n uint64
		if n, err = s.lenArg(at, 8, false); err != nil {
			return false, err
		}
		if n > uint64(s.total-s.pos) {
			return false, s.errf(at, "frame of %d bytes runs past the end of the pickle", n)
		}
		if n > maxFrameBytes {
			return false, s.errf(at, "frame of %d bytes is larger than %d bytes, the limit", n, maxFrameBytes)
		}
	case '\x98': // READONLY_BUFFER: a no-op in gopickle
	default:
		// EXT1/2/4, NEXT_BUFFER and unknown opcodes: a state dict never
		// holds them, and gopickle cannot handle them.
		return false, s.errf(at, "unsupported pickle opcode 0x%02x", op)
	}
	return false, err
}

// argsWeight is how many bytes %#v could print for a slice of these values.
func argsWeight(items []slot) uint64 {
	var w uint64
	for _, v := range items {
		w = min(w+v.printWeight(), maxWeight)
	}
	return w
}

// fixed skips a fixed-width argument and pushes a scalar.
func (s *scanner) fixed(at, n int) error {
	if err := s.skip(at, n); err != nil {
		return err
	}
	s.push(mkSlot(kScalar, 0))
	return nil
}

func (s *scanner) skip(at, n int) error {
	_, err := s.take(at, uint64(n))
	return err
}

// textScalar skips a newline-terminated number of at most limit bytes.
func (s *scanner) textScalar(at, limit int, what string) error {
	if _, err := s.line(at, limit, what); err != nil {
		return err
	}
	s.push(mkSlot(kScalar, 0))
	return nil
}

// counted skips a length-prefixed str or bytes payload and pushes its value.
func (s *scanner) counted(at int, op byte, width int, signed bool, k kind) error {
	n, err := s.lenArg(at, width, signed)
	if err != nil {
		return err
	}
	if err := s.payload(at, op, n, maxStringBytes, "one value"); err != nil {
		return err
	}
	s.objects++
	s.push(mkSlot(k, n))
	return nil
}

func (s *scanner) long(at int, op byte) error {
	width := 1
	if op == '\x8b' {
		width = 4
	}
	n, err := s.lenArg(at, width, true)
	if err != nil {
		return err
	}
	if n == 0 {
		// Python encodes 0 this way, but no state dict does, and gopickle
		// indexes the empty payload.
		return s.errf(at, "empty LONG payload is not supported")
	}
	if err := s.payload(at, op, n, maxIntBytes, "an int"); err != nil {
		return err
	}
	s.push(mkSlot(kScalar, 0))
	return nil
}

// payload skips the n-byte payload of op, at most limit bytes (the limit
// for what).
func (s *scanner) payload(at int, op byte, n, limit uint64, what string) error {
	if n > uint64(s.total-s.pos) {
		return s.errf(at, "argument of %d bytes runs past the end of the pickle", n)
	}
	if n > limit {
		return s.errf(at, "%s of %d bytes is longer than %d bytes, the limit for %s", opNames[op], n, limit, what)
	}
	return s.skip(at, int(n))
}

// call checks REDUCE (callable, args), NEWOBJ (class, args) and NEWOBJ_EX
// (class, args, kwargs). gopickle prints the callable with %#v when it
// cannot call it, and its own classes print refused arguments the same
// way, so the callable must be a global and the arguments small.
func (s *scanner) call(at int, op byte) error {
	name := opNames[op]
	n := 2
	if op == '\x92' {
		n = 3
	}
	if err := s.need(at, n, name); err != nil {
		return err
	}
	fn, args := s.top(n-1), s.top(n-2)
	if fn.kind() != kGlobal {
		return s.errf(at, "%s calls %s, not a class or function", name, kindNames[fn.kind()])
	}
	if args.kind() != kTuple {
		return s.errf(at, "%s arguments are %s, not a tuple", name, kindNames[args.kind()])
	}
	w := args.weight()
	if n == 3 {
		w += s.top(0).printWeight()
	}
	if w > maxCallArgsPrint {
		return s.errf(at, "%s arguments of more than %d bytes, the limit", name, maxCallArgsPrint)
	}
	s.pop(n)
	s.objects++
	s.push(mkSlot(kObject, 0))
	return nil
}

// instantiate checks OBJ (MARK class args...) and INST (MARK args...,
// module and name as text), which gopickle turns into calls.
func (s *scanner) instantiate(at int, op byte) error {
	name := opNames[op]
	if op == 'i' {
		if _, err := s.line(at, maxGlobalName, "INST module"); err != nil {
			return err
		}
		if _, err := s.line(at, maxGlobalName, "INST name"); err != nil {
			return err
		}
	}
	items, err := s.popMark(at, name)
	if err != nil {
		return err
	}
	if op == 'o' {
		if len(items) == 0 {
			return s.errf(at, "OBJ without a class")
		}
		if k := items[0].kind(); k != kGlobal {
			return s.errf(at, "OBJ calls %s, not a class or function", kindNames[k])
		}
		items = items[1:]
	}
	if argsWeight(items) > maxCallArgsPrint {
		return s.errf(at, "%s arguments of more than %d bytes, the limit", name, maxCallArgsPrint)
	}
	s.objects++
	s.push(mkSlot(kObject, 0))
	return nil
}

// build checks BUILD (instance, state). gopickle prints the instance with
// %#v when it cannot take the state, and prints slot-state dicts' keys the
// same way; a state dict only ever BUILDs an OrderedDict made by REDUCE
// with a dict (its _metadata).
func (s *scanner) build(at int) error {
	if err := s.need(at, 2, "BUILD"); err != nil {
		return err
	}
	if k := s.top(1).kind(); k != kObject {
		return s.errf(at, "BUILD sets the state of %s; only objects made by a call take state", kindNames[k])
	}
	if s.top(0).kind() == kTuple {
		return s.errf(at, "BUILD with a (state, slots) tuple is not supported")
	}
	s.pop(1)
	return nil
}

func (s *scanner) extend(at int, op byte) error {
	name := opNames[op]
	items, err := s.popMark(at, name)
	if err != nil {
		return err
	}
	switch op {
	case 'u':
		err = s.checkPairs(at, items, name)
	case '\x90':
		err = s.checkHashable(at, items, name)
	}
	if err != nil {
		return err
	}
	s.items += len(items)
	return s.need(at, 1, name)
}

// checkPairs requires key/value pairs whose keys are str or scalars.
func (s *scanner) checkPairs(at int, items []slot, op string) error {
	if len(items)%2 != 0 {
		return s.errf(at, "%s with an odd number of items (%d)", op, len(items))
	}
	for i := 0; i < len(items); i += 2 {
		if err := s.checkKey(at, items[i]); err != nil {
			return err
		}
	}
	return nil
}

// checkKey allows the dict keys a state dict has (str; ints and the like
// are refused later with the key named). bytes would crash gopickle's
// hashing; containers and objects could not be printed in an error.
func (s *scanner) checkKey(at int, key slot) error {
	switch k := key.kind(); k {
	case kStr, kScalar:
		return nil
	case kBytes:
		return s.errf(at, "bytes object used as a dict key")
	default:
		return s.errf(at, "%s used as a dict key; a state dict's keys are str", kindNames[k])
	}
}

func (s *scanner) checkHashable(at int, items []slot, op string) error {
	for _, v := range items {
		if v.kind() == kBytes {
			return s.errf(at, "bytes object used as a %s item", op)
		}
	}
	return nil
}

// memoIndex reads the index argument of GET/PUT in its three encodings the
// way gopickle decodes them.
func (s *scanner) memoIndex(at int, op byte) (int, error) {
	switch op {
	case 'g', 'p':
		b, err := s.line(at, 32, "memo index")
		if err != nil {
			return 0, err
		}
		n, ok := parseDecimal(b)
		if !ok {
			return 0, s.errf(at, "memo index %q is not a small decimal number", b)
		}
		return n, nil
	case 'h', 'q':
		b, err := s.take(at, 1)
		if err != nil {
			return 0, err
		}
		return int(b[0]), nil
	default:
		b, err := s.take(at, 4)
		if err != nil {
			return 0, err
		}
		return int(binary.LittleEndian.Uint32(b)), nil
	}
}

func (s *scanner) get(at int, op byte) error {
	i, err := s.memoIndex(at, op)
	if err != nil {
		return err
	}
	if i < len(s.memo) && s.memo[i].kind() != kAbsent {
		s.push(s.memo[i])
	} else {
		s.push(mkSlot(kScalar, 0)) // gopickle pushes nil for a missing entry
	}
	return nil
}

func (s *scanner) put(at int, op byte) error {
	i, err := s.memoIndex(at, op)
	if err != nil {
		return err
	}
	if err := s.need(at, 1, "PUT"); err != nil {
		return err
	}
	return s.store(at, i)
}

// store sets memo entry i to the top of the stack. Pickle writers number
// entries 0, 1, 2, ..., so the memo is a dense array (4 bytes an entry): an
// index at or past maxMemoEntries is refused, and so is one more than
// maxMemoSkip past the entries so far, which would make a few bytes of
// pickle cost megabytes of array.
func (s *scanner) store(at, i int) error {
	if i >= maxMemoEntries {
		return s.errf(at, "memo index %d is not below %d, the limit on memo entries", i, maxMemoEntries)
	}
	if i > len(s.memo)+maxMemoSkip {
		return s.errf(at, "memo index %d skips more than %d past the %d entries so far", i, maxMemoSkip, len(s.memo))
	}
	if i >= len(s.memo) {
		s.memo = grow(s.memo, i+1-len(s.memo), maxMemoEntries)[:i+1] // new entries are zero: kAbsent
	}
	if s.memo[i].kind() == kAbsent {
		s.memoCount++
	}
	s.memo[i] = s.top(0)
	return nil
}

// parseDecimal accepts 1 to 9 ASCII digits, which is all a memo index
// written by Python ever is and keeps strconv's sign and overflow rules out
// of the comparison with gopickle.
func parseDecimal(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 9 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// scanStream scans a pickle of total bytes read from src and returns all
// of it up to STOP. It reads no further than the scan needs, so a refused
// stream costs only the bytes up to where it is refused. What follows STOP
// is read and dropped (at most maxTrailingBytes), so that a zip entry's
// reader reaches its end and checks the CRC.
func scanStream(src io.Reader, total int) ([]byte, error) {
	s := newScanner(nil, total, src)
	if err := s.run(); err != nil {
		return nil, err
	}
	if rest := total - s.pos; rest > maxTrailingBytes {
		return nil, fmt.Errorf("%d bytes follow the pickle's STOP opcode, more than %d, the limit", rest, maxTrailingBytes)
	}
	if err := s.ensure(total); err != nil {
		return nil, err
	}
	var one [1]byte
	switch _, err := io.ReadFull(src, one[:]); {
	case err == nil:
		return nil, fmt.Errorf("longer than the %d bytes its zip entry declares", total)
	case !errors.Is(err, io.EOF):
		return nil, err // a CRC mismatch, for one
	}
	return s.p[:s.pos], nil
}
