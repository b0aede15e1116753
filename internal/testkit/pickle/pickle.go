// Package pickle writes pickle protocol 2 streams opcode by opcode, and
// torch.save's zip archives around them, for the tests of moeprep's
// PyTorch reader: the state dicts torch writes, and the hostile files
// nobody should. Each builder returns the opcodes as a string, so that
// they join with +. Only tests import it.
package pickle

import (
	"archive/zip"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// Proto2 is the PROTO 2 opcode that starts a stream.
const Proto2 = "\x80\x02"

// Of is a whole pickle: PROTO 2, body, STOP.
func Of(body string) []byte { return []byte(Proto2 + body + ".") }

// Global is GLOBAL module.name.
func Global(module, name string) string { return "c" + module + "\n" + name + "\n" }

// Str is BINUNICODE s.
func Str(s string) string {
	return "X" + string(binary.LittleEndian.AppendUint32(nil, uint32(len(s)))) + s
}

// Small is BININT1 n, 0 <= n < 256.
func Small(n int) string { return "K" + string(byte(n)) }

// Int is n of any size: BININT where it fits in 32 bits signed (negative
// numbers too), LONG1 of 8 bytes beyond.
func Int(n int64) string {
	if n < 1<<31 {
		return "J" + string(binary.LittleEndian.AppendUint32(nil, uint32(n)))
	}
	return "\x8a\x08" + string(binary.LittleEndian.AppendUint64(nil, uint64(n)))
}

// Tuple is MARK, items, TUPLE.
func Tuple(items ...string) string { return "(" + strings.Join(items, "") + "t" }

// SmallInts is a tuple of Small ints.
func SmallInts(ns ...int) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = Small(n)
	}
	return Tuple(parts...)
}

// Ints is a tuple of Int ints.
func Ints(ns ...int64) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = Int(n)
	}
	return Tuple(parts...)
}

// Dict is {k: v, ...} from alternating key and value pickles (EMPTY_DICT,
// MARK, SETITEMS).
func Dict(kv ...string) string { return "}(" + strings.Join(kv, "") + "u" }

// Hooks is the empty OrderedDict torch passes as a tensor's backward hooks.
func Hooks() string { return Global("collections", "OrderedDict") + ")R" }

// Storage is the persistent id of storage key, a torch.<class> of numel
// elements on the CPU, loaded (BINPERSID).
func Storage(class, key string, numel int64) string {
	return Tuple(Str("storage"), Global("torch", class), Str(key), Str("cpu"), Int(numel)) + "Q"
}

// View is torch._utils._rebuild_tensor_v2(storage, offset, shape, stride,
// False, hooks) over Storage(class, key, numel).
func View(class, key string, numel, offset int64, shape, stride []int64) string {
	return Global("torch._utils", "_rebuild_tensor_v2") +
		Tuple(Storage(class, key, numel), Int(offset), Ints(shape...), Ints(stride...), "\x89", Hooks()) + "R"
}

// Zip writes a torch.save archive to w, every entry under folder/:
// data.pkl (deflated, so that a pickle of millions of opcodes is a small
// file; streamed from writePickle, so that no one holds it whole),
// byteorder, data/<key> for each storage (stored, in key order), version.
func Zip(w io.Writer, folder string, writePickle func(io.Writer) error, storages map[string][]byte) error {
	zw := zip.NewWriter(w)
	add := func(name string, method uint16, write func(io.Writer) error) error {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: folder + "/" + name, Method: method})
		if err != nil {
			return err
		}
		return write(w)
	}
	bytesOf := func(b []byte) func(io.Writer) error {
		return func(w io.Writer) error { _, err := w.Write(b); return err }
	}
	if err := add("data.pkl", zip.Deflate, writePickle); err != nil {
		return err
	}
	if err := add("byteorder", zip.Store, bytesOf([]byte("little"))); err != nil {
		return err
	}
	for _, k := range slices.SortedFunc(maps.Keys(storages), byNumber) {
		if err := add("data/"+k, zip.Store, bytesOf(storages[k])); err != nil {
			return err
		}
	}
	if err := add("version", zip.Store, bytesOf([]byte("3\n"))); err != nil {
		return err
	}
	return zw.Close()
}

// byNumber orders storage keys as torch numbers them: "2" before "10".
func byNumber(a, b string) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	return strings.Compare(a, b)
}

// Rep is S repeated N times: a part of Stream that is never held whole.
type Rep struct {
	S string
	N int
}

// Repeat is Rep{s, n}.
func Repeat(s string, n int) Rep { return Rep{S: s, N: n} }

// Stream writes parts in order: strings, byte slices, Rep values (in
// chunks of at most 64 KiB) and lists ([]any) of them. Nothing is built
// before it runs, so a hostile pickle costs no memory until a case asks
// for it.
func Stream(parts ...any) func(io.Writer) error {
	return func(w io.Writer) error {
		for _, p := range parts {
			var err error
			switch p := p.(type) {
			case string:
				_, err = io.WriteString(w, p)
			case []byte:
				_, err = w.Write(p)
			case Rep:
				chunk := strings.Repeat(p.S, max(1, min(p.N, (64<<10)/max(1, len(p.S)))))
				for left := p.N; left > 0 && err == nil; {
					k := min(left, len(chunk)/len(p.S))
					_, err = io.WriteString(w, chunk[:k*len(p.S)])
					left -= k
				}
			case []any:
				err = Stream(p...)(w)
			default:
				panic(fmt.Sprintf("pickle part of type %T", p))
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
}
