package torchbin

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
)

// torchPickler writes protocol 2 pickles the way CPython's pickler does for
// torch.save: every str, tuple and call result is memoized with BINPUT
// (LONG_BINPUT past 255) and reused through BINGET, globals and interned
// strings are written once, dict items go in SETITEMS batches of 1000.
type torchPickler struct {
	b     []byte
	memo  int
	known map[string]int // memo index of globals and interned strings
}

func (w *torchPickler) put() {
	if w.memo < 256 {
		w.b = append(w.b, 'q', byte(w.memo))
	} else {
		w.b = append(w.b, 'r')
		w.b = binary.LittleEndian.AppendUint32(w.b, uint32(w.memo))
	}
	w.memo++
}

func (w *torchPickler) get(i int) {
	if i < 256 {
		w.b = append(w.b, 'h', byte(i))
	} else {
		w.b = append(w.b, 'j')
		w.b = binary.LittleEndian.AppendUint32(w.b, uint32(i))
	}
}

// once writes what the first time and memoizes it, later BINGETs it.
func (w *torchPickler) once(key string, write func()) {
	if i, ok := w.known[key]; ok {
		w.get(i)
		return
	}
	write()
	w.known[key] = w.memo
	w.put()
}

func (w *torchPickler) str(s string) {
	w.b = append(w.b, 'X')
	w.b = binary.LittleEndian.AppendUint32(w.b, uint32(len(s)))
	w.b = append(w.b, s...)
	w.put()
}

// interned is a str CPython pickles once per file ('storage', 'cpu').
func (w *torchPickler) interned(s string) {
	w.once("s:"+s, func() {
		w.b = append(w.b, 'X')
		w.b = binary.LittleEndian.AppendUint32(w.b, uint32(len(s)))
		w.b = append(w.b, s...)
	})
}

func (w *torchPickler) global(module, name string) {
	w.once("g:"+module+"."+name, func() { w.b = append(w.b, "c"+module+"\n"+name+"\n"...) })
}

func (w *torchPickler) int(n int) {
	switch {
	case n < 1<<8:
		w.b = append(w.b, 'K', byte(n))
	case n < 1<<16:
		w.b = append(w.b, 'M', byte(n), byte(n>>8))
	case n < 1<<31:
		w.b = append(w.b, 'J')
		w.b = binary.LittleEndian.AppendUint32(w.b, uint32(n))
	default: // LONG1 of 8 bytes, as CPython writes numel past 2**31
		w.b = append(w.b, '\x8a', 8)
		w.b = binary.LittleEndian.AppendUint64(w.b, uint64(n))
	}
}

func (w *torchPickler) intTuple(ns []int) {
	switch len(ns) {
	case 0:
		w.b = append(w.b, ')')
		return
	case 1, 2, 3:
		for _, n := range ns {
			w.int(n)
		}
		w.b = append(w.b, "\x85\x86\x87"[len(ns)-1])
	default:
		w.b = append(w.b, '(')
		for _, n := range ns {
			w.int(n)
		}
		w.b = append(w.b, 't')
	}
	w.put()
}

// tensor writes _rebuild_tensor_v2(storage, 0, shape, stride, False,
// OrderedDict()) over a fresh storage key.
func (w *torchPickler) tensor(key int, class string, shape []int) {
	stride := make([]int, len(shape))
	numel := 1
	for i := len(shape) - 1; i >= 0; i-- {
		stride[i] = numel
		numel *= shape[i]
	}
	w.global("torch._utils", "_rebuild_tensor_v2")
	w.b = append(w.b, '(', '(')
	w.interned("storage")
	w.global("torch", class)
	w.str(fmt.Sprint(key))
	w.interned("cpu")
	w.int(numel)
	w.b = append(w.b, 't')
	w.put()
	w.b = append(w.b, 'Q')
	w.int(0)
	w.intTuple(shape)
	w.intTuple(stride)
	w.b = append(w.b, '\x89')
	w.global("collections", "OrderedDict")
	w.b = append(w.b, ')', 'R')
	w.put()
	w.b = append(w.b, 't')
	w.put()
	w.b = append(w.b, 'R')
	w.put()
}

// items writes the SETITEMS batches of a dict whose entries write
// themselves.
func (w *torchPickler) items(n int, entry func(i int)) {
	for i := 0; i < n; i++ {
		if i%1000 == 0 {
			if i > 0 {
				w.b = append(w.b, 'u')
			}
			w.b = append(w.b, '(')
		}
		entry(i)
	}
	if n > 0 {
		w.b = append(w.b, 'u')
	}
}

// moeShardTensor names and shapes tensor i of a DeepSeek-V3-style FP8 MoE
// shard: per expert, gate/up/down weights and their block scales.
func moeShardTensor(i int) (name, class string, shape []int) {
	proj := []string{"gate_proj", "up_proj", "down_proj"}[i/2%3]
	expert, layer := i/6%256, i/(6*256)
	name = fmt.Sprintf("model.layers.%d.mlp.experts.%d.%s.weight", layer, expert, proj)
	shape = []int{2048, 7168}
	if proj == "down_proj" {
		shape = []int{7168, 2048}
	}
	if i%2 == 0 {
		return name, "Float8_e4m3fnStorage", shape
	}
	return name + "_scale_inv", "FloatStorage", []int{shape[0] / 128, shape[1] / 128}
}

// torchStateDict is data.pkl of torch.save(model.state_dict()) for an MoE
// shard of n tensors, _metadata included (one {'version': 1} per module,
// here one per weight and scale pair, as for an FP8 Linear).
func torchStateDict(n int) []byte {
	w := &torchPickler{known: map[string]int{}}
	w.b = append(w.b, '\x80', 2)
	w.global("collections", "OrderedDict")
	w.b = append(w.b, ')', 'R')
	w.put()
	w.items(n, func(i int) {
		name, class, shape := moeShardTensor(i)
		w.str(name)
		w.tensor(i, class, shape)
	})
	// state.__dict__ = {'_metadata': OrderedDict(module -> {'version': 1})}
	w.b = append(w.b, '}')
	w.put()
	w.str("_metadata")
	w.global("collections", "OrderedDict")
	w.b = append(w.b, ')', 'R')
	w.put()
	w.items(n/2, func(i int) {
		name, _, _ := moeShardTensor(2 * i)
		w.str(strings.TrimSuffix(name, ".weight"))
		w.b = append(w.b, '}')
		w.put()
		w.interned("version")
		w.int(1)
		w.b = append(w.b, 's')
	})
	w.b = append(w.b, 's', 'b', '.')
	return w.b
}

// shardStorages answers every storage key with an entry of the size the
// generated tensor needs.
func shardStorages(key string) (storageEntry, error) {
	var i int
	fmt.Sscan(key, &i)
	_, class, shape := moeShardTensor(i)
	n := int64(4)
	if class == "Float8_e4m3fnStorage" {
		n = 1
	}
	for _, d := range shape {
		n *= int64(d)
	}
	return storageEntry{nbytes: n, offset: 1 << 20}, nil
}

// The generator writes what torch does: a small shard loads, with its
// names, dtypes and shapes, and its stats per tensor are those the limits
// were sized by.
func TestTorchStateDictLoads(t *testing.T) {
	const n = 3000
	sd, err := parseStateDict(torchStateDict(n), shardStorages)
	if err != nil {
		t.Fatal(err)
	}
	if len(sd.tensors) != n {
		t.Fatalf("%d tensors, want %d", len(sd.tensors), n)
	}
	for _, i := range []int{0, 1, 1535, n - 1} {
		name, _, shape := moeShardTensor(i)
		got := sd.tensors[i]
		if got.name != name || fmt.Sprint(got.view.shape) != fmt.Sprint(shape) {
			t.Errorf("tensor %d = %s %v, want %s %v", i, got.name, got.view.shape, name, shape)
		}
		if _, err := checkView(got.view); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestLimitsAdmitLargeShard: every count limit is at least 10 times what a
// torch-written shard of 10,000 tensors (the design point, limits.go) needs,
// and such a shard scans in well under a second.
func TestLimitsAdmitLargeShard(t *testing.T) {
	const n = 10_000
	p := torchStateDict(n)
	s := newScanner(p, len(p), nil)
	if err := s.run(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d tensors: %d bytes, %d opcodes, %d objects, %d MARKs, %d items, %d memo entries, stack %d, MARK depth %d",
		n, len(p), s.ops, s.objects, s.nmarks, s.items, s.memoCount, s.maxStack, s.maxMarkDepth)
	need := []struct {
		what        string
		used, limit int
	}{
		{"data.pkl bytes", len(p), maxPickleBytes},
		{"opcodes", s.ops, maxPickleOps},
		{"objects", s.objects, maxObjects},
		{"MARKs", s.nmarks, maxMarks},
		{"container items", s.items, maxContainerItems},
		{"memo entries", s.memoCount, maxMemoEntries},
		{"stack depth", s.maxStack, maxStackDepth},
		// A {"state_dict": ...} wrapper nests one level more.
		{"MARK depth", s.maxMarkDepth + 1, maxMarkDepth},
		{"tensors", n, maxTensors},
		{"zip entries", n + 4, maxZipEntries},
	}
	for _, c := range need {
		if c.used*10 > c.limit {
			t.Errorf("%s: a %d-tensor shard uses %d, limit %d is less than 10 times that", c.what, n, c.used, c.limit)
		}
	}
}
