package torchbin

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// scanPickle walks the opcode stream of a pickle up to its STOP opcode and
// simulates the unpickler's stack, without building any object. It exists
// because gopickle trusts its input: it allocates whatever length an opcode
// announces before reading, indexes its dispatch table with opcode 0xff,
// pairs DICT/SETITEMS items without checking their count, hashes bytes
// objects used as dict keys and decodes empty LONG1 payloads, all of which
// crash the process. Refusing such streams here keeps every one of those
// paths unreachable.
//
// The stack simulation records one fact per slot: whether the value is a
// Python bytes object (a Go []byte inside gopickle, which cannot be a map
// key). Memo slots carry the same fact so that GET pushes the right kind.
func scanPickle(p []byte) error {
	s := scanner{p: p, memo: make(map[int]bool)}
	return s.run()
}

type scanner struct {
	p     []byte
	pos   int
	stack []bool   // true: the slot holds a bytes object
	marks [][]bool // stacks saved by MARK
	memo  map[int]bool
}

func (s *scanner) errf(at int, format string, args ...any) error {
	return fmt.Errorf("pickle offset %d: %s", at, fmt.Sprintf(format, args...))
}

// take returns the next n bytes, checking they exist.
func (s *scanner) take(at int, n uint64) ([]byte, error) {
	if n > uint64(len(s.p)-s.pos) {
		return nil, s.errf(at, "argument of %d bytes runs past the end of the pickle", n)
	}
	b := s.p[s.pos : s.pos+int(n)]
	s.pos += int(n)
	return b, nil
}

// line returns the next newline-terminated argument, without the newline.
func (s *scanner) line(at int) ([]byte, error) {
	i := bytes.IndexByte(s.p[s.pos:], '\n')
	if i < 0 {
		return nil, s.errf(at, "text argument has no terminating newline")
	}
	b := s.p[s.pos : s.pos+i]
	s.pos += i + 1
	return b, nil
}

func (s *scanner) need(at, n int, op string) error {
	if len(s.stack) < n {
		return s.errf(at, "%s needs %d stack items, has %d", op, n, len(s.stack))
	}
	return nil
}

func (s *scanner) push(isBytes bool) { s.stack = append(s.stack, isBytes) }

func (s *scanner) pop(n int) { s.stack = s.stack[:len(s.stack)-n] }

func (s *scanner) popMark(at int, op string) ([]bool, error) {
	if len(s.marks) == 0 {
		return nil, s.errf(at, "%s without a MARK", op)
	}
	items := s.stack
	s.stack = s.marks[len(s.marks)-1]
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
			return s.errf(s.pos, "pickle ends without a STOP opcode")
		}
		at := s.pos
		op := s.p[s.pos]
		s.pos++
		done, err := s.step(at, op)
		if err != nil || done {
			return err
		}
	}
}

// step applies one opcode. The stack effects mirror gopickle's handlers.
func (s *scanner) step(at int, op byte) (done bool, err error) {
	switch op {
	case '(': // MARK
		s.marks = append(s.marks, s.stack)
		s.stack = make([]bool, 0, 8)
	case '.': // STOP
		return true, s.need(at, 1, "STOP")
	case '0': // POP
		if len(s.stack) == 0 {
			_, err = s.popMark(at, "POP")
			return false, err
		}
		s.pop(1)
	case '1': // POP_MARK
		_, err = s.popMark(at, "POP_MARK")
	case '2': // DUP
		if err = s.need(at, 1, "DUP"); err == nil {
			s.push(s.stack[len(s.stack)-1])
		}
	case 'F', 'I', 'L', 'S', 'V': // FLOAT, INT, LONG, STRING, UNICODE
		if _, err = s.line(at); err == nil {
			s.push(false)
		}
	case 'J': // BININT
		err = s.fixed(at, 4)
	case 'K': // BININT1
		err = s.fixed(at, 1)
	case 'M': // BININT2
		err = s.fixed(at, 2)
	case 'G': // BINFLOAT
		err = s.fixed(at, 8)
	case 'N', '}', ']', ')', '\x88', '\x89', '\x8f': // NONE, EMPTY_*, NEWTRUE, NEWFALSE
		s.push(false)
	case 'P': // PERSID
		if _, err = s.line(at); err == nil {
			s.push(false)
		}
	case 'Q': // BINPERSID
		err = s.replace(at, 1, "BINPERSID")
	case 'R': // REDUCE
		err = s.replace(at, 2, "REDUCE")
	case '\x81': // NEWOBJ
		err = s.replace(at, 2, "NEWOBJ")
	case '\x92': // NEWOBJ_EX
		err = s.replace(at, 3, "NEWOBJ_EX")
	case '\x93': // STACK_GLOBAL
		err = s.replace(at, 2, "STACK_GLOBAL")
	case '\x85': // TUPLE1
		err = s.replace(at, 1, "TUPLE1")
	case '\x86': // TUPLE2
		err = s.replace(at, 2, "TUPLE2")
	case '\x87': // TUPLE3
		err = s.replace(at, 3, "TUPLE3")
	case 'a': // APPEND
		err = s.replace(at, 2, "APPEND")
	case 'b': // BUILD: pops the state, keeps the instance
		if err = s.need(at, 2, "BUILD"); err == nil {
			s.pop(1)
		}
	case 'T': // BINSTRING
		err = s.counted(at, 4, true, false)
	case 'U': // SHORT_BINSTRING
		err = s.counted(at, 1, false, false)
	case 'X': // BINUNICODE
		err = s.counted(at, 4, false, false)
	case '\x8c': // SHORT_BINUNICODE
		err = s.counted(at, 1, false, false)
	case '\x8d': // BINUNICODE8
		err = s.counted(at, 8, false, false)
	case '\x96': // BYTEARRAY8 (a *ByteArray in gopickle: hashable)
		err = s.counted(at, 8, false, false)
	case 'B': // BINBYTES
		err = s.counted(at, 4, false, true)
	case 'C': // SHORT_BINBYTES
		err = s.counted(at, 1, false, true)
	case '\x8e': // BINBYTES8
		err = s.counted(at, 8, false, true)
	case '\x8a', '\x8b': // LONG1, LONG4
		err = s.long(at, op)
	case 'c': // GLOBAL
		if _, err = s.line(at); err == nil {
			if _, err = s.line(at); err == nil {
				s.push(false)
			}
		}
	case 'i': // INST
		if _, err = s.line(at); err == nil {
			if _, err = s.line(at); err == nil {
				if _, err = s.popMark(at, "INST"); err == nil {
					s.push(false)
				}
			}
		}
	case 'o': // OBJ
		var items []bool
		if items, err = s.popMark(at, "OBJ"); err == nil {
			if len(items) == 0 {
				return false, s.errf(at, "OBJ without a class")
			}
			s.push(false)
		}
	case 't', 'l', 'd': // TUPLE, LIST, DICT
		var items []bool
		if items, err = s.popMark(at, map[byte]string{'t': "TUPLE", 'l': "LIST", 'd': "DICT"}[op]); err == nil {
			if op == 'd' {
				err = s.checkPairs(at, items, "DICT")
			}
			s.push(false)
		}
	case '\x91': // FROZENSET
		var items []bool
		if items, err = s.popMark(at, "FROZENSET"); err == nil {
			err = s.checkHashable(at, items, "FROZENSET")
			s.push(false)
		}
	case 'e', 'u', '\x90': // APPENDS, SETITEMS, ADDITEMS
		err = s.extend(at, op)
	case 's': // SETITEM
		if err = s.need(at, 3, "SETITEM"); err == nil {
			if s.stack[len(s.stack)-2] {
				return false, s.errf(at, "bytes object used as a dict key")
			}
			s.pop(2)
		}
	case 'g', 'h', 'j': // GET, BINGET, LONG_BINGET
		err = s.get(at, op)
	case 'p', 'q', 'r': // PUT, BINPUT, LONG_BINPUT
		err = s.put(at, op)
	case '\x94': // MEMOIZE
		if err = s.need(at, 1, "MEMOIZE"); err == nil {
			s.memo[len(s.memo)] = s.stack[len(s.stack)-1]
		}
	case '\x80': // PROTO
		err = s.skip(at, 1)
	case '\x95': // FRAME: frames only chunk the stream; check the length
		var n uint64
		if n, err = s.lenArg(at, 8, false); err == nil && n > uint64(len(s.p)-s.pos) {
			err = s.errf(at, "frame of %d bytes runs past the end of the pickle", n)
		}
	case '\x98': // READONLY_BUFFER: a no-op in gopickle
	default:
		// EXT1/2/4, NEXT_BUFFER and unknown opcodes: a state dict never
		// holds them, and gopickle cannot handle them.
		return false, s.errf(at, "unsupported pickle opcode 0x%02x", op)
	}
	return false, err
}

// fixed skips a fixed-width argument and pushes a plain value.
func (s *scanner) fixed(at, n int) error {
	if err := s.skip(at, n); err != nil {
		return err
	}
	s.push(false)
	return nil
}

func (s *scanner) skip(at, n int) error {
	_, err := s.take(at, uint64(n))
	return err
}

// replace pops n items and pushes one plain result.
func (s *scanner) replace(at, n int, op string) error {
	if err := s.need(at, n, op); err != nil {
		return err
	}
	s.pop(n)
	s.push(false)
	return nil
}

// counted skips a length-prefixed payload and pushes its value.
func (s *scanner) counted(at, width int, signed, isBytes bool) error {
	n, err := s.lenArg(at, width, signed)
	if err != nil {
		return err
	}
	if _, err := s.take(at, n); err != nil {
		return err
	}
	s.push(isBytes)
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
	if _, err := s.take(at, n); err != nil {
		return err
	}
	s.push(false)
	return nil
}

func (s *scanner) extend(at int, op byte) error {
	names := map[byte]string{'e': "APPENDS", 'u': "SETITEMS", '\x90': "ADDITEMS"}
	items, err := s.popMark(at, names[op])
	if err != nil {
		return err
	}
	if err := s.need(at, 1, names[op]); err != nil {
		return err
	}
	switch op {
	case 'u':
		err = s.checkPairs(at, items, "SETITEMS")
	case '\x90':
		err = s.checkHashable(at, items, "ADDITEMS")
	}
	return err
}

// checkPairs requires key/value pairs whose keys can be hashed.
func (s *scanner) checkPairs(at int, items []bool, op string) error {
	if len(items)%2 != 0 {
		return s.errf(at, "%s with an odd number of items (%d)", op, len(items))
	}
	for i := 0; i < len(items); i += 2 {
		if items[i] {
			return s.errf(at, "bytes object used as a dict key")
		}
	}
	return nil
}

func (s *scanner) checkHashable(at int, items []bool, op string) error {
	for _, b := range items {
		if b {
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
		b, err := s.line(at)
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
	s.push(s.memo[i]) // gopickle pushes nil for a missing slot
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
	s.memo[i] = s.stack[len(s.stack)-1]
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
