package torchbin

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	pk "github.com/moeprep/moeprep/internal/testkit/pickle"
)

// Builders for the hand-written pickles here, beside pk's: storages of any
// module, and tensors rebuilt with BININT1 arguments.

// pid is a persistent storage id; BINPERSID turns it into a storage.
func pid(module, class, key string, numel int) string {
	return pk.Tuple(pk.Str("storage"), pk.Global(module, class), pk.Str(key), pk.Str("cpu"), pk.Small(numel)) + "Q"
}

// v2call is _rebuild_tensor_v2(storage, offset, size, stride, False, hooks).
func v2call(storage string, off int, shape, stride []int) string {
	return pk.Global("torch._utils", "_rebuild_tensor_v2") +
		pk.Tuple(storage, pk.Small(off), pk.SmallInts(shape...), pk.SmallInts(stride...), "\x89", pk.Hooks()) + "R"
}

func v3call(storage string, off int, shape, stride []int, dtype string) string {
	return pk.Global("torch._utils", "_rebuild_tensor_v3") +
		pk.Tuple(storage, pk.Small(off), pk.SmallInts(shape...), pk.SmallInts(stride...), "\x89", pk.Hooks(), pk.Global("torch", dtype)) + "R"
}

// fakeStorages answers every key with a 64-byte entry, except "missing".
func fakeStorages(key string) (storageEntry, error) {
	if key == "missing" {
		return storageEntry{}, errors.New("entry missing")
	}
	return storageEntry{nbytes: 64, offset: 1000}, nil
}

func TestRefusedClasses(t *testing.T) {
	refused := []struct{ module, name string }{
		{"os", "system"}, {"posix", "system"}, {"builtins", "eval"}, {"builtins", "exec"},
		{"__builtin__", "eval"}, {"subprocess", "Popen"}, {"torch.nn", "Module"},
		{"torch", "load"}, {"torch._utils", "_rebuild_device_tensor_from_numpy"},
		{"torch", "QInt8Storage"}, {"collections", "defaultdict"},
	}
	for _, c := range refused {
		want := fmt.Sprintf("refusing to load class %s.%s (not in the allowlist for state dicts)", c.module, c.name)
		call := pk.Tuple(pk.Str("echo pwned")) + "R"
		encodings := map[string]string{
			"GLOBAL":       pk.Global(c.module, c.name) + call,
			"STACK_GLOBAL": "\x8c" + string(byte(len(c.module))) + c.module + "\x8c" + string(byte(len(c.name))) + c.name + "\x93" + call,
			"INST":         "(" + pk.Str("echo pwned") + "i" + c.module + "\n" + c.name + "\n",
		}
		for enc, body := range encodings {
			_, err := parseStateDict(pk.Of(body), fakeStorages)
			if err == nil || err.Error() != want || !errors.Is(err, errRefusedClass) {
				t.Errorf("%s.%s via %s: error %v, want %q", c.module, c.name, enc, err, want)
			}
		}
	}
}

func TestParseStateDict(t *testing.T) {
	f32 := func(key string, n int) string { return pid("torch", "FloatStorage", key, n) }
	cases := []struct {
		name, body string
		want       string // error substring, or "" for success
		tensors    string // "name:dtype:shape;..." on success
	}{
		{"float8 typed storage", pk.Dict(pk.Str("w"), v2call(pid("torch", "Float8_e4m3fnStorage", "0", 64), 4, []int{2, 3}, []int{3, 1})), "", "w:F8_E4M3:[2 3]"},
		{"float8 v3", pk.Dict(pk.Str("w"), v3call(pid("torch.storage", "UntypedStorage", "0", 64), 0, []int{8}, []int{1}, "float8_e5m2")), "", "w:F8_E5M2:[8]"},
		{"uint16 v3", pk.Dict(pk.Str("w"), v3call(pid("torch.storage", "UntypedStorage", "0", 64), 0, []int{32}, []int{1}, "uint16")), "", "w:U16:[32]"},
		{"parameter", pk.Dict(pk.Str("p"), pk.Global("torch._utils", "_rebuild_parameter")+pk.Tuple(v2call(f32("0", 16), 0, []int{4}, []int{1}), "\x88", pk.Hooks())+"R"), "", "p:F32:[4]"},
		{"duplicate key keeps first position, last value", pk.Dict(pk.Str("a"), v2call(f32("0", 16), 0, []int{1}, []int{1}), pk.Str("b"), v2call(f32("0", 16), 0, []int{2}, []int{1}), pk.Str("a"), v2call(f32("0", 16), 0, []int{3}, []int{1})), "", "a:F32:[3];b:F32:[2]"},
		{"scalars skipped", pk.Dict(pk.Str("w"), v2call(f32("0", 16), 0, []int{4}, []int{1}), pk.Str("n"), pk.Small(3), pk.Str("s"), pk.Str("x"), pk.Str("z"), "N"), "", "w:F32:[4]"},
		{"model wrapper", pk.Dict(pk.Str("model"), pk.Dict(pk.Str("w"), v2call(f32("0", 16), 0, []int{4}, []int{1})), pk.Str("step"), pk.Small(9)), "", "w:F32:[4]"},
		{"empty state dict", "}", "", ""},

		{"top-level tensor", v2call(f32("0", 16), 0, []int{4}, []int{1}), "top-level object is tensor, not a dict", ""},
		{"non-str key", pk.Dict(pk.Small(1), v2call(f32("0", 16), 0, []int{4}, []int{1})), "dict key 1 is not a str", ""},
		{"empty name", pk.Dict(pk.Str(""), v2call(f32("0", 16), 0, []int{4}, []int{1})), "a tensor has an empty name", ""},
		{"nested dict value", pk.Dict(pk.Str("w"), v2call(f32("0", 16), 0, []int{4}, []int{1}), pk.Str("sub"), "}"), `key "sub" holds a dict, not a tensor`, ""},
		{"two wrappers", pk.Dict(pk.Str("model"), "}", pk.Str("state_dict"), "}"), `holds both "model" and "state_dict"`, ""},
		{"numel mismatch", pk.Dict(pk.Str("w"), v2call(f32("0", 15), 0, []int{4}, []int{1})), "holds 64 bytes, but the pickle says 15 elements of 4 bytes", ""},
		{"missing storage", pk.Dict(pk.Str("w"), v2call(f32("missing", 16), 0, []int{4}, []int{1})), "entry missing", ""},
		{"storage reused as another type", pk.Dict(pk.Str("a"), v2call(f32("0", 16), 0, []int{4}, []int{1}), pk.Str("b"), v2call(pid("torch", "IntStorage", "0", 16), 0, []int{4}, []int{1})), `storage "0" is used as both FloatStorage and IntStorage`, ""},
		{"untyped storage in v2", pk.Dict(pk.Str("w"), v2call(pid("torch.storage", "UntypedStorage", "0", 64), 0, []int{4}, []int{1})), "untyped storage \"0\" without a dtype", ""},
		{"v3 dtype contradicts storage", pk.Dict(pk.Str("w"), v3call(f32("0", 16), 0, []int{4}, []int{1}, "bfloat16")), "storage FloatStorage holds F32, dtype argument says BF16", ""},
		{"v3 without dtype", pk.Dict(pk.Str("w"), pk.Global("torch._utils", "_rebuild_tensor_v3")+pk.Tuple(f32("0", 16), pk.Small(0), pk.SmallInts(4), pk.SmallInts(1), "\x89", pk.Hooks(), "N")+"R"), "dtype argument is None", ""},
		{"too few args", pk.Dict(pk.Str("w"), pk.Global("torch._utils", "_rebuild_tensor_v2")+pk.Tuple(f32("0", 16), pk.Small(0), pk.SmallInts(4))+"R"), "got 3 arguments, want 6 or 7", ""},
		{"storage not a storage", pk.Dict(pk.Str("w"), v2call(pk.Str("0"), 0, []int{4}, []int{1})), "first argument is str, not a storage", ""},
		{"shape/stride rank mismatch", pk.Dict(pk.Str("w"), v2call(f32("0", 16), 0, []int{2, 2}, []int{1})), "size has 2 dims, stride has 1", ""},
		{"negative stride", pk.Dict(pk.Str("w"), pk.Global("torch._utils", "_rebuild_tensor_v2")+pk.Tuple(f32("0", 16), pk.Small(0), pk.SmallInts(4), pk.Tuple("J\xff\xff\xff\xff"), "\x89", pk.Hooks())+"R"), "stride[0] is -1, not a non-negative int", ""},
		{"bad pid tag", pk.Dict(pk.Str("w"), v2call(pk.Tuple(pk.Str("module"), pk.Global("torch", "FloatStorage"), pk.Str("0"), pk.Str("cpu"), pk.Small(16))+"Q", 0, []int{4}, []int{1})), "persistent id tag is \"module\"", ""},
		{"short pid", pk.Dict(pk.Str("w"), v2call(pk.Tuple(pk.Str("storage"))+"Q", 0, []int{4}, []int{1})), "not a 5-tuple", ""},
		{"path in key", pk.Dict(pk.Str("w"), v2call(f32("a/b", 16), 0, []int{4}, []int{1})), `storage key "a/b" is not a plain entry name`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sd, err := parseStateDict(pk.Of(c.body), fakeStorages)
			if testkit.WantErr(t, err, c.want) {
				return
			}
			var got []string
			for _, nv := range sd.tensors {
				got = append(got, fmt.Sprintf("%s:%s:%v", nv.name, nv.view.dtype, nv.view.shape))
			}
			if strings.Join(got, ";") != c.tensors {
				t.Fatalf("tensors %q, want %q", strings.Join(got, ";"), c.tensors)
			}
		})
	}
}

// TestScanRejects: inputs that crash gopickle (index out of range, unhashable
// map key, giant allocation) are refused by scanPickle first. Removing the
// scan makes this test panic or run out of memory.
func TestScanRejects(t *testing.T) {
	le64 := func(n uint64) string {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], n)
		return string(b[:])
	}
	cases := []struct{ name, in, want string }{
		{"opcode 0xff", pk.Proto2 + "\xff.", "unsupported pickle opcode 0xff"},
		{"odd DICT", pk.Proto2 + "(" + pk.Str("a") + "d.", "DICT with an odd number of items"},
		{"odd SETITEMS", pk.Proto2 + "}(" + pk.Str("a") + "u.", "SETITEMS with an odd number of items"},
		{"bytes key in OrderedDict", pk.Proto2 + pk.Hooks() + "C\x01k" + pk.Small(1) + "s.", "bytes object used as a dict key"},
		{"bytes key via memo", pk.Proto2 + pk.Hooks() + "C\x01kq\x050h\x05" + pk.Small(1) + "s.", "bytes object used as a dict key"},
		{"bytes in frozenset", pk.Proto2 + "(C\x01k\x91.", "bytes object used as a FROZENSET item"},
		{"bytes in ADDITEMS", pk.Proto2 + "\x8f(C\x01k\x90.", "bytes object used as a ADDITEMS item"},
		{"empty LONG1", pk.Proto2 + "\x8a\x00.", "empty LONG payload"},
		{"huge BINBYTES8", pk.Proto2 + "\x8e" + le64(1<<62) + ".", "runs past the end of the pickle"},
		{"huge BINUNICODE", pk.Proto2 + "X\xff\xff\xff\x7f.", "runs past the end of the pickle"},
		{"huge FRAME", pk.Proto2 + "\x95" + le64(1<<40) + ".", "frame of 1099511627776 bytes"},
		{"negative LONG4", pk.Proto2 + "\x8b\xff\xff\xff\xff.", "negative length"},
		{"no STOP", pk.Proto2 + "N", "without a STOP"},
		{"STOP on empty stack", pk.Proto2 + ".", "STOP needs 1 stack items"},
		{"SETITEM short stack", pk.Proto2 + "N" + "s.", "SETITEM needs 3"},
		{"unterminated GLOBAL", pk.Proto2 + "cos\nsys", "no terminating newline"},
		{"TUPLE without MARK", pk.Proto2 + "t.", "TUPLE without a MARK"},
		{"EXT1", pk.Proto2 + "\x82\x01.", "unsupported pickle opcode 0x82"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseStateDict([]byte(c.in), fakeStorages)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

// gopickle prints whole values into its errors; ours stay short. (A call
// of a list, which gopickle would print whole, is refused by the scan.)
func TestLongUnpicklerErrorIsShortened(t *testing.T) {
	body := pk.Global("collections", "OrderedDict") + pk.Tuple(strings.Repeat(pk.Str("aaaaaaaaaa"), 200)) + "R"
	_, err := parseStateDict(pk.Of(body), fakeStorages)
	if err == nil || !strings.HasPrefix(err.Error(), "OrderedDictClass.Call args not supported") || len(err.Error()) > maxErrorLen+3 {
		t.Fatalf("error %v", err)
	}
}

// parseGuarded turns a crash below the unpickler into an error; a lookup
// that panics stands in for a gopickle bug here.
func TestParseGuardedRecovers(t *testing.T) {
	body := pk.Dict(pk.Str("w"), v2call(pid("torch", "FloatStorage", "0", 16), 0, []int{4}, []int{1}))
	_, err := parseGuarded(pk.Of(body), func(string) (storageEntry, error) { panic("boom\nsecond line") })
	if err == nil || err.Error() != "malformed pickle (unpickler failed: boom second line)" {
		t.Fatalf("error %v", err)
	}
}
