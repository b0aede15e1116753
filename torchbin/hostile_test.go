package torchbin

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/moeprep/moeprep/internal/costtest"
	"github.com/moeprep/moeprep/internal/testkit"
	pk "github.com/moeprep/moeprep/internal/testkit/pickle"
)

// Hostile checkpoints of issue 26, built at test time: each is refused with
// one line naming the file and the limit, in bounded time and memory.

// checkpoint is a torch archive under "hostile/" whose data.pkl is what
// pickle writes, with storages "0", "1", ...
func checkpoint(t testing.TB, pickle func(io.Writer) error, storages ...[]byte) []byte {
	t.Helper()
	keyed := map[string][]byte{}
	for i, s := range storages {
		keyed[fmt.Sprint(i)] = s
	}
	var buf bytes.Buffer
	if err := pk.Zip(&buf, "hostile", pickle, keyed); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// le32 is a 4-byte little-endian length or int.
func le32(n int) string { return string(binary.LittleEndian.AppendUint32(nil, uint32(n))) }

// view is _rebuild_tensor_v2 over FloatStorage key of numel elements.
func view(key string, numel int64, offset int64, shape, stride []int64) string {
	return pk.View("FloatStorage", key, numel, offset, shape, stride)
}

// megaString is a 1 MiB str memoized at index 0: later BINGETs push it again
// for free, and gopickle's %#v would print it whole each time.
var megaString = []any{"X" + le32(1<<20), pk.Repeat("a", 1<<20), "q\x00"}

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

// pklFile is a checkpoint whose data.pkl is streamed from parts (see
// pk.Stream) when the case runs, so that no hostile pickle is held while
// other tests run.
func pklFile(parts []any, storages ...[]byte) func(testing.TB) []byte {
	return func(t testing.TB) []byte { return checkpoint(t, pk.Stream(parts...), storages...) }
}

// pickleParts is pklFile's first argument.
func pickleParts(parts ...any) []any { return parts }

const mib = 1 << 20

var hostileCases = []hostileCase{
	{
		name: "16M nested MARKs",
		file: pklFile(pickleParts(pk.Proto2, pk.Repeat("(", 16<<20), ".")),
		want: "data.pkl: pickle offset 66: more than 64 nested MARKs, the limit for one checkpoint file",
		// Read in 256 KiB chunks: a few chunks at most.
		maxAlloc: 4 * mib,
		note:     "gopickle allocates a 256-byte stack per MARK: 4 GiB; the old scan kept 1.4 GB",
	},
	{
		name:     "8M MARK, POP_MARK pairs",
		file:     pklFile(pickleParts(pk.Proto2, pk.Repeat("(1", 8<<20), "N.")),
		want:     fmt.Sprintf("more than %d MARK opcodes, the limit for one checkpoint file", maxMarks),
		maxAlloc: 16 * mib, // 4 MiB of pickle read, in a buffer grown by doubling
		note:     "2 GiB of 256-byte stacks allocated and collected again by gopickle",
	},
	{
		name:     "16M EMPTY_DICT",
		file:     pklFile(pickleParts(pk.Proto2, pk.Repeat("}", 16<<20), ".")),
		want:     fmt.Sprintf("data.pkl: pickle offset %d: more than %d values on the pickle stack, the limit for one checkpoint file", maxStackDepth+2, maxStackDepth),
		maxAlloc: 40 * mib, // 8 MiB of stack slots and 2 MiB of pickle, both grown by doubling: 32 MiB
		note:     "16M dicts of 160 bytes held on the stack: 2.7 GB",
	},
	{
		name:     "EMPTY_DICT, POP past the object limit",
		file:     pklFile(pickleParts(pk.Proto2, pk.Repeat("}0", maxObjects+16), "N.")),
		want:     fmt.Sprintf("more than %d objects (containers, strings, calls, MARKs), the limit for one checkpoint file", maxObjects),
		maxAlloc: 16 * mib, // 3 MiB of pickle read, in a buffer grown by doubling
		note:     "2.6 GB of dicts allocated and collected again by gopickle",
	},
	{
		name:     "LONG4 of 4 MiB",
		file:     pklFile(pickleParts(pk.Proto2+"\x8b"+le32(4<<20), pk.Repeat("\x7f", 4<<20), ".")),
		want:     "data.pkl: pickle offset 2: LONG4 of 4194304 bytes is longer than 16 bytes, the limit for an int",
		maxAlloc: 4 * mib,
		note:     "gopickle decodes a long int with one big.Int shift per byte: quadratic, hours for 4 MiB",
	},
	{
		name:     "LONG1 of 255 bytes",
		file:     pklFile(pickleParts(pk.Proto2+"\x8a\xff", pk.Repeat("\x01", 255), ".")),
		want:     "data.pkl: pickle offset 2: LONG1 of 255 bytes is longer than 16 bytes, the limit for an int",
		maxAlloc: 4 * mib,
		note:     "a 2040-bit int where torch needs int64",
	},
	{
		name:     "text LONG of 16M digits",
		file:     pklFile(pickleParts(pk.Proto2+"L", pk.Repeat("9", 16<<20), "L\n.")),
		want:     "data.pkl: pickle offset 2: LONG text longer than 32 bytes, the limit",
		maxAlloc: 4 * mib,
		note:     "big.Int.SetString of 16M digits runs for minutes",
	},
	{
		name:     "text INT of 16M digits",
		file:     pklFile(pickleParts(pk.Proto2+"I", pk.Repeat("9", 16<<20), "\n.")),
		want:     "data.pkl: pickle offset 2: INT text longer than 32 bytes, the limit",
		maxAlloc: 4 * mib,
		note:     "16 MiB read and copied twice before strconv refuses it",
	},
	{
		name:     "str of 4 MiB",
		file:     pklFile(pickleParts(pk.Proto2+"X"+le32(4<<20), pk.Repeat("a", 4<<20), ".")),
		want:     "data.pkl: pickle offset 2: BINUNICODE of 4194304 bytes is longer than 1048576 bytes, the limit for one value",
		maxAlloc: 4 * mib,
		note:     "a value no state dict holds; gopickle copies it twice",
	},
	{
		name:     "FRAME of 3 MiB",
		file:     pklFile(pickleParts("\x80\x04\x95"+string(binary.LittleEndian.AppendUint64(nil, 3<<20)), pk.Repeat("N0", 3<<19), "N.")),
		want:     "data.pkl: pickle offset 2: frame of 3145728 bytes is larger than 2097152 bytes, the limit",
		maxAlloc: 4 * mib,
		note:     "gopickle allocates the announced frame before reading it",
	},
	{
		name:     "memo index 2**31",
		file:     pklFile(pickleParts(pk.Proto2 + "Nr" + le32(1<<31) + ".")),
		want:     fmt.Sprintf("data.pkl: pickle offset 3: memo index 2147483648 is not below %d, the limit on memo entries", maxMemoEntries),
		maxAlloc: 4 * mib,
		note:     "the scan's dense memo would take 8 GiB",
	},
	{
		name:     "memo index skipping to the last entry",
		file:     pklFile(pickleParts(pk.Proto2 + "Nr" + le32(maxMemoEntries-1) + ".")),
		want:     fmt.Sprintf("data.pkl: pickle offset 3: memo index %d skips more than 256 past the 0 entries so far", maxMemoEntries-1),
		maxAlloc: 4 * mib,
		note:     "the scan's dense memo would take 8 MiB for 6 bytes of pickle",
	},
	{
		name:     "opcodes past the limit",
		file:     pklFile(pickleParts(pk.Proto2, pk.Repeat("\x98", maxPickleOps+16), "N.")),
		want:     fmt.Sprintf("more than %d pickle opcodes, the limit for one checkpoint file", maxPickleOps),
		maxAlloc: 16 * mib, // 4 MiB of pickle read, in a buffer grown by doubling
		note:     "unbounded work: the opcode count is the only bound on a stream of no-ops",
	},
	{
		name:     "call of a list printing 2 GB",
		file:     pklFile(pickleParts(pk.Proto2, megaString, "](", pk.Repeat("h\x00", 2000), "e)R.")),
		want:     "REDUCE calls a container, not a class or function",
		maxAlloc: 8 * mib,
		note:     "gopickle formats the list into its error with %#v: 2000 copies of the 1 MiB str",
	},
	{
		name:     "OrderedDict arguments printing 2 GB",
		file:     pklFile(pickleParts(pk.Proto2, megaString, pk.Global("collections", "OrderedDict")+"(", pk.Repeat("h\x00", 2000), "tR.")),
		want:     "REDUCE arguments of more than 65536 bytes, the limit",
		maxAlloc: 8 * mib,
		note:     "gopickle's OrderedDict formats refused arguments with %#v",
	},
	{
		name:     "BUILD on a list printing 2 GB",
		file:     pklFile(pickleParts(pk.Proto2, megaString, "](", pk.Repeat("h\x00", 2000), "e}b.")),
		want:     "BUILD sets the state of a container; only objects made by a call take state",
		maxAlloc: 8 * mib,
		note:     "gopickle formats an instance that takes no state with %#v",
	},
	{
		name:     "tuple dict key printing 2 GB",
		file:     pklFile(pickleParts(pk.Proto2, megaString, pk.Hooks()+"}(", pk.Repeat("h\x00", 2000), "tNsb.")),
		want:     "a tuple used as a dict key; a state dict's keys are str",
		maxAlloc: 8 * mib,
		note:     "OrderedDict's BUILD formats a non-str attribute name with %#v",
	},
	{
		name:     "STACK_GLOBAL of a list",
		file:     pklFile(pickleParts(pk.Proto2, megaString, pk.Str("torch")+"(", pk.Repeat("h\x00", 2000), "l\x93.")),
		want:     "STACK_GLOBAL needs two str values, got a container",
		maxAlloc: 8 * mib,
		note:     "gopickle formats a non-str name with %#v",
	},
	{
		name:     "1 MiB after STOP",
		file:     pklFile(pickleParts(pk.Proto2+"}.", make([]byte, 1<<20))),
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
			fw.Write([]byte(pk.Proto2 + "}."))
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
		file:     pklFile(pickleParts(pk.Of(pk.Dict(pk.Str("w"), view("0", 4, 0, []int64{3342336, 1024, 4}, []int64{0, 0, 1})))), make([]byte, 16)),
		want:     `tensor "w": view (offset 0, shape [3342336 1024 4], stride [0 0 1]) reads some elements of storage "0" more than once`,
		maxAlloc: 1 * mib,
		note:     "a conversion would write 51 GiB from a file of 1 KiB",
	},
	{
		name:     "overlapping windows",
		file:     pklFile(pickleParts(pk.Of(pk.Dict(pk.Str("w"), view("0", 1024, 0, []int64{1000, 25}, []int64{1, 1})))), make([]byte, 4096)),
		want:     `tensor "w": view (offset 0, shape [1000 25], stride [1 1]) reads some elements of storage "0" more than once`,
		maxAlloc: 1 * mib,
		note:     "25 times the storage's bytes, and any stride 1 window count more",
	},
	{
		name: "5 full views of one storage",
		file: pklFile(pickleParts(pk.Of(pk.Dict(
			pk.Str("a"), view("0", 1024, 0, []int64{1024}, []int64{1}), pk.Str("b"), view("0", 1024, 0, []int64{1024}, []int64{1}),
			pk.Str("c"), view("0", 1024, 0, []int64{32, 32}, []int64{32, 1}), pk.Str("d"), view("0", 1024, 0, []int64{32, 32}, []int64{1, 32}),
			pk.Str("e"), view("0", 1024, 0, []int64{1024}, []int64{1})))), make([]byte, 4096)),
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
			kv = append(kv, pk.Str(fmt.Sprint("w", i)), view(fmt.Sprint(i), 1024, 0, []int64{1024}, []int64{1}))
			storages[i] = bytes.Repeat([]byte{byte(i + 1)}, 4096)
		}
		b := checkpoint(t, pk.Stream(pk.Of(pk.Dict(kv...))), storages...)
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
			testkit.CheckOneLine(t, err, "hostile.bin", c.want)
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
		kv = append(kv, pk.Str(name), view("0", 1024, 0, []int64{64, 16}, []int64{16, 1}))
	}
	b := checkpoint(t, pk.Stream(pk.Of(pk.Dict(kv...))), make([]byte, 4096))
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
	good := pk.Of(pk.Dict(pk.Str("w"), view("0", 4, 0, []int64{4}, []int64{1})))
	b := checkpoint(t, pk.Stream(good), make([]byte, 16))
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
