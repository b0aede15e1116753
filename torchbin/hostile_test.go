package torchbin

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"encoding/binary"
	"fmt"
	"github.com/moeprep/moeprep/internal/costtest"
	"hash/crc32"
	"strings"
	"testing"
	"time"
)

// Hostile checkpoints of issue 26, built at test time: each is refused with
// one line naming the file and the limit, in bounded time and memory.

// zipEntry is one entry of a test archive; data.pkl is deflated, as a
// hostile file would have it, storages are stored.
type zipEntry struct {
	name string
	data []byte
}

// buildZip writes entries under the folder "hostile/".
func buildZip(t testing.TB, entries ...zipEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range entries {
		h := &zip.FileHeader{Name: "hostile/" + e.name, Method: zip.Store}
		if e.name == "data.pkl" {
			h.Method = zip.Deflate
		}
		w, err := zw.CreateHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// checkpoint is a torch archive with this data.pkl and storages "0", "1", ...
func checkpoint(t testing.TB, pkl []byte, storages ...[]byte) []byte {
	entries := []zipEntry{{"data.pkl", pkl}}
	for i, s := range storages {
		entries = append(entries, zipEntry{fmt.Sprintf("data/%d", i), s})
	}
	return buildZip(t, append(entries, zipEntry{"version", []byte("3\n")})...)
}

// le32 is a 4-byte little-endian length or int.
func le32(n int) string { return string(binary.LittleEndian.AppendUint32(nil, uint32(n))) }

// bigInts is a tuple of ints of any size (BININT, or LONG1 of 8 bytes).
func bigInts(ns ...int64) string {
	var b strings.Builder
	b.WriteString("(")
	for _, n := range ns {
		if n < 1<<31 {
			b.WriteString("J" + le32(int(n)))
		} else {
			b.WriteString("\x8a\x08" + string(binary.LittleEndian.AppendUint64(nil, uint64(n))))
		}
	}
	return b.String() + "t"
}

// bigInt is one int of any size.
func bigInt(n int64) string {
	s := bigInts(n)
	return s[1 : len(s)-1]
}

// view is _rebuild_tensor_v2 over FloatStorage key of numel elements.
func view(key string, numel int64, offset int64, shape, stride []int64) string {
	storage := tuple(str("storage"), glob("torch", "FloatStorage"), str(key), str("cpu"), bigInt(numel)) + "Q"
	return glob("torch._utils", "_rebuild_tensor_v2") +
		tuple(storage, bigInt(offset), bigInts(shape...), bigInts(stride...), "\x89", hooks()) + "R"
}

// megaString is a 1 MiB str memoized at index 0: later BINGETs push it again
// for free, and gopickle's %#v would print it whole each time.
var megaString = []any{"X" + le32(1<<20), rep{"a", 1 << 20}, "q\x00"}

// hostileCase is one hostile file. Each note says what the input costs
// without the limit that refuses it, to show that the bounds asserted on
// it can fail.
type hostileCase struct {
	name     string
	file     func(t testing.TB) []byte
	want     string // the error after "hostile.bin: "
	maxAlloc uint64 // bytes Open may allocate
	note     string
}

// pklFile is a checkpoint whose data.pkl is joined from parts when the
// case runs, so that no hostile pickle is held while other tests run.
func pklFile(parts func() [][]byte, storages ...[]byte) func(testing.TB) []byte {
	return func(t testing.TB) []byte { return checkpoint(t, bytes.Join(parts(), nil), storages...) }
}

// pickleParts is pklFile's usual argument: strings, byte slices, rep values
// and nested lists of them, in order; the rep values are built only then.
func pickleParts(parts ...any) func() [][]byte {
	return func() [][]byte {
		var out [][]byte
		for _, p := range parts {
			switch p := p.(type) {
			case string:
				out = append(out, []byte(p))
			case []byte:
				out = append(out, p)
			case rep:
				out = append(out, bytes.Repeat([]byte(p.s), p.n))
			case []any:
				out = append(out, pickleParts(p...)()...)
			default:
				panic(fmt.Sprintf("pickle part of type %T", p))
			}
		}
		return out
	}
}

// rep is s repeated n times, built when the case runs.
type rep struct {
	s string
	n int
}

const mib = 1 << 20

var hostileCases = []hostileCase{
	{
		name: "16M nested MARKs",
		file: pklFile(pickleParts(proto2, rep{"(", 16 << 20}, ".")),
		want: "data.pkl: pickle offset 66: more than 64 nested MARKs, the limit for one checkpoint file",
		// Read in 256 KiB chunks: a few chunks at most.
		maxAlloc: 4 * mib,
		note:     "gopickle allocates a 256-byte stack per MARK: 4 GiB; the old scan kept 1.4 GB",
	},
	{
		name:     "8M MARK, POP_MARK pairs",
		file:     pklFile(pickleParts(proto2, rep{"(1", 8 << 20}, "N.")),
		want:     fmt.Sprintf("more than %d MARK opcodes, the limit for one checkpoint file", maxMarks),
		maxAlloc: 16 * mib, // 4 MiB of pickle read, in a buffer grown by doubling
		note:     "2 GiB of 256-byte stacks allocated and collected again by gopickle",
	},
	{
		name:     "16M EMPTY_DICT",
		file:     pklFile(pickleParts(proto2, rep{"}", 16 << 20}, ".")),
		want:     fmt.Sprintf("data.pkl: pickle offset %d: more than %d values on the pickle stack, the limit for one checkpoint file", maxStackDepth+2, maxStackDepth),
		maxAlloc: 40 * mib, // 8 MiB of stack slots and 2 MiB of pickle, both grown by doubling: 32 MiB
		note:     "16M dicts of 160 bytes held on the stack: 2.7 GB",
	},
	{
		name:     "EMPTY_DICT, POP past the object limit",
		file:     pklFile(pickleParts(proto2, rep{"}0", maxObjects + 16}, "N.")),
		want:     fmt.Sprintf("more than %d objects (containers, strings, calls, MARKs), the limit for one checkpoint file", maxObjects),
		maxAlloc: 16 * mib, // 3 MiB of pickle read, in a buffer grown by doubling
		note:     "2.6 GB of dicts allocated and collected again by gopickle",
	},
	{
		name:     "LONG4 of 4 MiB",
		file:     pklFile(pickleParts(proto2+"\x8b"+le32(4<<20), rep{"\x7f", 4 << 20}, ".")),
		want:     "data.pkl: pickle offset 2: LONG4 of 4194304 bytes is longer than 16 bytes, the limit for an int",
		maxAlloc: 4 * mib,
		note:     "gopickle decodes a long int with one big.Int shift per byte: quadratic, hours for 4 MiB",
	},
	{
		name:     "LONG1 of 255 bytes",
		file:     pklFile(pickleParts(proto2+"\x8a\xff", rep{"\x01", 255}, ".")),
		want:     "data.pkl: pickle offset 2: LONG1 of 255 bytes is longer than 16 bytes, the limit for an int",
		maxAlloc: 4 * mib,
		note:     "a 2040-bit int where torch needs int64",
	},
	{
		name:     "text LONG of 16M digits",
		file:     pklFile(pickleParts(proto2+"L", rep{"9", 16 << 20}, "L\n.")),
		want:     "data.pkl: pickle offset 2: LONG text longer than 32 bytes, the limit",
		maxAlloc: 4 * mib,
		note:     "big.Int.SetString of 16M digits runs for minutes",
	},
	{
		name:     "text INT of 16M digits",
		file:     pklFile(pickleParts(proto2+"I", rep{"9", 16 << 20}, "\n.")),
		want:     "data.pkl: pickle offset 2: INT text longer than 32 bytes, the limit",
		maxAlloc: 4 * mib,
		note:     "16 MiB read and copied twice before strconv refuses it",
	},
	{
		name:     "str of 4 MiB",
		file:     pklFile(pickleParts(proto2+"X"+le32(4<<20), rep{"a", 4 << 20}, ".")),
		want:     "data.pkl: pickle offset 2: BINUNICODE of 4194304 bytes is longer than 1048576 bytes, the limit for one value",
		maxAlloc: 4 * mib,
		note:     "a value no state dict holds; gopickle copies it twice",
	},
	{
		name:     "FRAME of 3 MiB",
		file:     pklFile(pickleParts("\x80\x04\x95"+string(binary.LittleEndian.AppendUint64(nil, 3<<20)), rep{"N0", 3 << 19}, "N.")),
		want:     "data.pkl: pickle offset 2: frame of 3145728 bytes is larger than 2097152 bytes, the limit",
		maxAlloc: 4 * mib,
		note:     "gopickle allocates the announced frame before reading it",
	},
	{
		name:     "memo index 2**31",
		file:     pklFile(pickleParts(proto2 + "Nr" + le32(1<<31) + ".")),
		want:     fmt.Sprintf("data.pkl: pickle offset 3: memo index 2147483648 is not below %d, the limit on memo entries", maxMemoEntries),
		maxAlloc: 4 * mib,
		note:     "the scan's dense memo would take 8 GiB",
	},
	{
		name:     "memo index skipping to the last entry",
		file:     pklFile(pickleParts(proto2 + "Nr" + le32(maxMemoEntries-1) + ".")),
		want:     fmt.Sprintf("data.pkl: pickle offset 3: memo index %d skips more than 256 past the 0 entries so far", maxMemoEntries-1),
		maxAlloc: 4 * mib,
		note:     "the scan's dense memo would take 8 MiB for 6 bytes of pickle",
	},
	{
		name:     "opcodes past the limit",
		file:     pklFile(pickleParts(proto2, rep{"\x98", maxPickleOps + 16}, "N.")),
		want:     fmt.Sprintf("more than %d pickle opcodes, the limit for one checkpoint file", maxPickleOps),
		maxAlloc: 16 * mib, // 4 MiB of pickle read, in a buffer grown by doubling
		note:     "unbounded work: the opcode count is the only bound on a stream of no-ops",
	},
	{
		name:     "call of a list printing 2 GB",
		file:     pklFile(pickleParts(proto2, megaString, "](", rep{"h\x00", 2000}, "e)R.")),
		want:     "REDUCE calls a container, not a class or function",
		maxAlloc: 8 * mib,
		note:     "gopickle formats the list into its error with %#v: 2000 copies of the 1 MiB str",
	},
	{
		name:     "OrderedDict arguments printing 2 GB",
		file:     pklFile(pickleParts(proto2, megaString, glob("collections", "OrderedDict")+"(", rep{"h\x00", 2000}, "tR.")),
		want:     "REDUCE arguments of more than 65536 bytes, the limit",
		maxAlloc: 8 * mib,
		note:     "gopickle's OrderedDict formats refused arguments with %#v",
	},
	{
		name:     "BUILD on a list printing 2 GB",
		file:     pklFile(pickleParts(proto2, megaString, "](", rep{"h\x00", 2000}, "e}b.")),
		want:     "BUILD sets the state of a container; only objects made by a call take state",
		maxAlloc: 8 * mib,
		note:     "gopickle formats an instance that takes no state with %#v",
	},
	{
		name:     "tuple dict key printing 2 GB",
		file:     pklFile(pickleParts(proto2, megaString, hooks()+"}(", rep{"h\x00", 2000}, "tNsb.")),
		want:     "a tuple used as a dict key; a state dict's keys are str",
		maxAlloc: 8 * mib,
		note:     "OrderedDict's BUILD formats a non-str attribute name with %#v",
	},
	{
		name:     "STACK_GLOBAL of a list",
		file:     pklFile(pickleParts(proto2, megaString, str("torch")+"(", rep{"h\x00", 2000}, "l\x93.")),
		want:     "STACK_GLOBAL needs two str values, got a container",
		maxAlloc: 8 * mib,
		note:     "gopickle formats a non-str name with %#v",
	},
	{
		name:     "1 MiB after STOP",
		file:     pklFile(pickleParts(proto2+"}.", make([]byte, 1<<20))),
		want:     "data.pkl: 1048576 bytes follow the pickle's STOP opcode, more than 65536, the limit",
		maxAlloc: 4 * mib,
		note:     "what follows STOP is only read for the CRC",
	},
	{
		name: "data.pkl claiming the limit + 1",
		file: func(t testing.TB) []byte {
			// CreateRaw writes whatever sizes it is given: a deflate stream
			// of 5 bytes that claims more than the limit.
			var buf bytes.Buffer
			zw := zip.NewWriter(&buf)
			var comp bytes.Buffer
			fw, _ := flate.NewWriter(&comp, flate.BestCompression)
			fw.Write([]byte(proto2 + "}."))
			fw.Close()
			w, err := zw.CreateRaw(&zip.FileHeader{Name: "hostile/data.pkl", Method: zip.Deflate,
				CRC32: crc32.ChecksumIEEE(nil), CompressedSize64: uint64(comp.Len()), UncompressedSize64: maxPickleBytes + 1})
			if err != nil {
				t.Fatal(err)
			}
			w.Write(comp.Bytes())
			zw.Close()
			return buf.Bytes()
		},
		want:     fmt.Sprintf("data.pkl: %d bytes uncompressed, more than %d, the limit", maxPickleBytes+1, maxPickleBytes),
		maxAlloc: 1 * mib,
		note:     "the old reader inflated all of it into memory before looking",
	},
	{
		name: "stride-0 view claiming 51 GiB",
		// shape (3342336, 1024, 4), stride (0, 0, 1) over 4 floats: every
		// index reads the same 16 bytes, 3.4 billion times.
		file:     pklFile(pickleParts(pkl(dict(str("w"), view("0", 4, 0, []int64{3342336, 1024, 4}, []int64{0, 0, 1})))), make([]byte, 16)),
		want:     `tensor "w": view (offset 0, shape [3342336 1024 4], stride [0 0 1]) reads some elements of storage "0" more than once`,
		maxAlloc: 1 * mib,
		note:     "a conversion would write 51 GiB from a file of 1 KiB",
	},
	{
		name:     "overlapping windows",
		file:     pklFile(pickleParts(pkl(dict(str("w"), view("0", 1024, 0, []int64{1000, 25}, []int64{1, 1})))), make([]byte, 4096)),
		want:     `tensor "w": view (offset 0, shape [1000 25], stride [1 1]) reads some elements of storage "0" more than once`,
		maxAlloc: 1 * mib,
		note:     "25 times the storage's bytes, and any stride 1 window count more",
	},
	{
		name: "5 full views of one storage",
		file: pklFile(pickleParts(pkl(dict(
			str("a"), view("0", 1024, 0, []int64{1024}, []int64{1}), str("b"), view("0", 1024, 0, []int64{1024}, []int64{1}),
			str("c"), view("0", 1024, 0, []int64{32, 32}, []int64{32, 1}), str("d"), view("0", 1024, 0, []int64{32, 32}, []int64{1, 32}),
			str("e"), view("0", 1024, 0, []int64{1024}, []int64{1})))), make([]byte, 4096)),
		want:     `tensors stream 20480 bytes from 4096 bytes of storage in the file, more than 4 times as many, the limit on shared storage (storage "0" alone is read by 5 tensors for 20480 bytes)`,
		maxAlloc: 1 * mib,
		note:     "a million views of one storage would stream a million times its bytes",
	},
	{
		name:     "8 zip entries over the same bytes",
		file:     aliasedEntries(8),
		want:     `tensors stream 32768 bytes from 4096 bytes of storage in the file, more than 4 times as many, the limit on shared storage (the storages' zip entries overlap, claiming 32768 bytes)`,
		maxAlloc: 1 * mib,
		note:     "counting each entry's size would see 32 KiB of storage where the file holds 4 KiB",
	},
}

// aliasedEntries is a checkpoint of n tensors over storages "0".."n-1" whose
// directory records all point at the bytes of storage "0".
func aliasedEntries(n int) func(testing.TB) []byte {
	return func(t testing.TB) []byte {
		var kv []string
		storages := make([][]byte, n)
		for i := range n {
			kv = append(kv, str(fmt.Sprint("w", i)), view(fmt.Sprint(i), 1024, 0, []int64{1024}, []int64{1}))
			storages[i] = bytes.Repeat([]byte{byte(i + 1)}, 4096)
		}
		b := checkpoint(t, pkl(dict(kv...)), storages...)
		// Point every central directory record of data/N at data/0's
		// local header.
		var first uint32
		for off := 0; ; off++ {
			i := bytes.Index(b[off:], []byte("PK\x01\x02"))
			if i < 0 {
				break
			}
			off += i
			nameLen := int(binary.LittleEndian.Uint16(b[off+28:]))
			name := string(b[off+46 : off+46+nameLen])
			switch {
			case name == "hostile/data/0":
				first = binary.LittleEndian.Uint32(b[off+42:])
			case strings.HasPrefix(name, "hostile/data/"):
				binary.LittleEndian.PutUint32(b[off+42:], first)
			}
		}
		return b
	}
}

func TestHostileFiles(t *testing.T) {
	for _, c := range hostileCases {
		t.Run(c.name, func(t *testing.T) {
			b := c.file(t)
			var err error
			alloc, elapsed := costtest.Measure(func() {
				var f *File
				f, err = openReader("hostile.bin", bytes.NewReader(b), int64(len(b)))
				if err == nil {
					f.Close()
				}
			})
			t.Logf("%d bytes on disk: %.1f MiB allocated, %v", len(b), float64(alloc)/mib, elapsed.Round(time.Millisecond))
			if err == nil {
				t.Fatal("opened without an error")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "hostile.bin: ") || !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
				t.Errorf("error %q\nwant one line starting %q containing %q", msg, "hostile.bin: ", c.want)
			}
			if alloc > c.maxAlloc {
				t.Errorf("allocated %d bytes, more than %d (without the limit: %s)", alloc, c.maxAlloc, c.note)
			}
			if elapsed > time.Second {
				t.Errorf("took %v, more than 1s (without the limit: %s)", elapsed, c.note)
			}
		})
	}
}

// Legitimate sharing within the factor still loads: an embedding tied four
// times over (T5's shared, encoder and decoder embed_tokens, lm_head).
func TestTiedFourTimesLoads(t *testing.T) {
	var kv []string
	for _, name := range []string{"shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"} {
		kv = append(kv, str(name), view("0", 1024, 0, []int64{64, 16}, []int64{16, 1}))
	}
	b := checkpoint(t, pkl(dict(kv...)), make([]byte, 4096))
	f, err := openReader("tied.bin", bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Tensors) != 4 {
		t.Fatalf("%d tensors, want 4", len(f.Tensors))
	}
}

// data.pkl is read to its end even though the scan stops at STOP, so that
// archive/zip checks its CRC: a corrupted pickle is not taken at its word.
func TestPickleChecksum(t *testing.T) {
	good := pkl(dict(str("w"), view("0", 4, 0, []int64{4}, []int64{1})))
	b := checkpoint(t, good, make([]byte, 16))
	// Corrupt the CRC of data.pkl in its central directory record.
	i := bytes.Index(b, []byte("PK\x01\x02"))
	if i < 0 || string(b[i+46:i+46+len("hostile/data.pkl")]) != "hostile/data.pkl" {
		t.Fatal("data.pkl is not the first directory record")
	}
	b[i+16] ^= 0xff
	_, err := openReader("crc.bin", bytes.NewReader(b), int64(len(b)))
	if err == nil || err.Error() != "crc.bin: data.pkl: zip: checksum error" {
		t.Fatalf("error %v, want the checksum error", err)
	}
}
