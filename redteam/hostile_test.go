package redteam

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moeprep/moeprep/internal/testkit"
	pk "github.com/moeprep/moeprep/internal/testkit/pickle"
)

// A hostile case builds a checkpoint directory (or a DST, or a golden
// directory) and names the file at fault; every command run on it must
// exit 2 with one line naming that file, within the time and RSS bounds,
// and leave no output behind (issue 26, cases 12-15).
type hostileCase struct {
	name string
	// build writes the hostile input under dir.
	build func(t *testing.T, dir string)
	// runs are the command lines. Placeholders: {dir} the case's directory,
	// {in} dir/in, {out} a fresh DST path under dir (which must not exist
	// afterwards), {fused} the shared tiny fuse-shared output, {big} the
	// shared big checkpoint.
	runs [][]string
	file string // the file the error must name
	msg  string // a regexp the error must match, "" for any
	// absent: more paths, relative to dir, that must not exist afterwards.
	absent []string
	// exit is the exit code every run must give: 2 (unusable input) unless
	// set; 1 where validate reports the hostile file as a finding about DST
	// (the issue: "exit 2, or 1 for validate findings").
	exit int
}

var (
	inspectRun  = []string{"inspect", "--no-progress", "{in}"}
	convertRun  = []string{"convert", "--no-progress", "{in}", "{out}"}
	bytesSrcRun = []string{"validate", "--no-progress", "--bytes", "{in}", "{fused}"}
)

// inputDir is where a hostile case puts the checkpoint it builds.
const inputDir = "in"

func runHostile(t *testing.T, cases []hostileCase) {
	t.Helper()
	fused := tinyFused(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			c.build(t, dir)
			for i, run := range c.runs {
				out := filepath.Join(dir, fmt.Sprintf("out%d", i))
				args := make([]string, len(run))
				for j, a := range run {
					a = strings.ReplaceAll(a, "{in}", filepath.Join(dir, inputDir))
					a = strings.ReplaceAll(a, "{out}", out)
					a = strings.ReplaceAll(a, "{fused}", fused)
					if strings.Contains(a, "{big}") {
						a = strings.ReplaceAll(a, "{big}", bigSrc(t))
					}
					args[j] = strings.ReplaceAll(a, "{dir}", dir)
				}
				// A run that writes what the input claims must fail, not
				// fill the disk first: 512 MB more than the inputs is plenty
				// for any output of these.
				limit := diskUsage(dir) + 512<<20
				p := startMoeprep(t, caseTimeout, args...)
				p.guardDisk(dir, limit)
				check(t, p.wait(), code(cmp.Or(c.exit, 2), names(c.file), c.msg))
				assertAbsent(t, out, out+".partial")
			}
			for _, a := range c.absent {
				assertAbsent(t, filepath.Join(dir, a))
			}
		})
	}
}

// tinyInput makes dir/in a copy of the tiny checkpoint whose files are hard
// links, except the ones named in own (copied, for the case to change).
func tinyInput(t *testing.T, dir string, own ...string) string {
	t.Helper()
	in := filepath.Join(dir, inputDir)
	linkTree(t, tinySrc(t), in, own...)
	return in
}

// configOnly makes dir/in with the tiny checkpoint's config.json alone.
func configOnly(t *testing.T, dir string) string {
	t.Helper()
	in := filepath.Join(dir, inputDir)
	testkit.WriteFile(t, filepath.Join(in, "config.json"), testkit.ReadFile(t, filepath.Join(tinySrc(t), "config.json")))
	return in
}

// Sizes of the hostile pickles: each is a few KB deflated.
const (
	pickleOps   = 16 << 20 // MARK and EMPTY_DICT opcodes; text LONG digits
	long4Length = 4 << 20  // LONG4 payload bytes
)

// hostilePickles are data.pkl bodies that cost the unpickler time or memory
// out of all proportion to the file's size, as parts to stream.
var hostilePickles = []struct {
	name  string
	parts []any // see pk.Stream
}{
	{"16M MARK opcodes", []any{pk.Proto2, pk.Repeat("(", pickleOps), "."}},
	{"16M EMPTY_DICT opcodes", []any{pk.Proto2, pk.Repeat("}", pickleOps), "."}},
	{"LONG4 with a 4 MiB payload", []any{pk.Proto2 + "}(" + pk.Str("model.embed_tokens.weight") + "\x8b" +
		string(binary.LittleEndian.AppendUint32(nil, long4Length)), pk.Repeat("\x5a", long4Length), "u."}},
	{"text LONG of 16M digits", []any{pk.Proto2 + "}(" + pk.Str("model.embed_tokens.weight") + "L",
		pk.Repeat("7", pickleOps), "L\nu."}},
}

// TestHostileTorch: PyTorch .bin files built to exhaust the unpickler, and
// views that claim far more bytes than the file holds (issue 26, case 12).
func TestHostileTorch(t *testing.T) {
	var cases []hostileCase
	for _, hp := range hostilePickles {
		cases = append(cases, hostileCase{
			name: hp.name,
			build: func(t *testing.T, dir string) {
				in := configOnly(t, dir)
				torchZip(t, filepath.Join(in, "pytorch_model.bin"), hp.parts, nil)
			},
			runs: [][]string{inspectRun, convertRun, bytesSrcRun},
			file: "pytorch_model.bin",
		})
	}
	cases = append(cases, hostileCase{
		// 51 tensors of 1 GiB each, all stride-0 views of one 2-byte
		// storage, beside the real tensors: a 20 KB file that a convert
		// would expand to 51 GiB of safetensors.
		name:  "stride-0 views claiming 51 GiB",
		build: func(t *testing.T, dir string) { strideZeroBin(t, tinyInputTorch(t, dir), 51) },
		runs:  [][]string{convertRun},
		file:  "pytorch_model.bin",
	})
	runHostile(t, cases)
}

// tinyInputTorch makes dir/in the tiny checkpoint's config.json and returns
// where its pytorch_model.bin goes.
func tinyInputTorch(t *testing.T, dir string) string {
	return filepath.Join(configOnly(t, dir), "pytorch_model.bin")
}

// storageClasses are the typed storages of the dtypes the tiny checkpoint has.
var storageClasses = map[string]string{"BF16": "BFloat16Storage", "F32": "FloatStorage", "F16": "HalfStorage"}

// strideZeroBin writes the tiny checkpoint's tensors as a torch zip, plus
// extra tensors of 1 GiB each that are stride-0 views of one bf16 element.
func strideZeroBin(t *testing.T, path string, extra int) {
	t.Helper()
	st := readST(t, filepath.Join(tinySrc(t), "model.safetensors"))
	storages := map[string][]byte{}
	var kv []string
	for i, name := range slices.Sorted(maps.Keys(st.Tensors)) {
		e := st.Tensors[name]
		class, ok := storageClasses[e.DType]
		if !ok {
			t.Fatalf("tensor %s: no storage class for %s", name, e.DType)
		}
		key := fmt.Sprint(i)
		data := st.data[e.DataOffsets[0]:e.DataOffsets[1]]
		storages[key] = data
		numel, stride := int64(1), make([]int64, len(e.Shape))
		for d := len(e.Shape) - 1; d >= 0; d-- {
			stride[d] = numel
			numel *= e.Shape[d]
		}
		kv = append(kv, pk.Str(name), pk.View(class, key, numel, 0, e.Shape, stride))
	}
	storages["zero"] = []byte{0x80, 0x3f} // bf16 1.0
	for i := range extra {
		kv = append(kv, pk.Str(fmt.Sprintf("model.extra.%d.weight", i)),
			pk.View("BFloat16Storage", "zero", 1, 0, []int64{1 << 15, 1 << 14}, []int64{0, 0}))
	}
	torchZip(t, path, []any{pk.Of(pk.Dict(kv...))}, storages)
}

// The slow checkpoint of TestHostileTorchInterrupt: slowShards shards whose
// pickles each build and drop slowDicts empty dicts, well within the
// unpickler's limits on allocated values and opcodes (1.5M and 4M when this
// was written), so that no single file is refused or slow, but reading them
// all takes seconds on 2 cores.
const (
	slowShards = 32
	slowDicts  = 1 << 20
)

// slowTorch writes a sharded PyTorch checkpoint into in whose every shard
// is a slow pickle (EMPTY_DICT, POP, over and over) ending in a dict of one
// small tensor, and the index that maps those tensors: well-formed in every
// respect but the time it takes to read.
func slowTorch(t *testing.T, in string) {
	t.Helper()
	weights := map[string]any{}
	for i := range slowShards {
		shard := fmt.Sprintf("pytorch_model-%05d-of-%05d.bin", i+1, slowShards)
		name := fmt.Sprintf("model.slow.%d.weight", i)
		weights[name] = shard
		tail := pk.Dict(pk.Str(name), pk.View("BFloat16Storage", "0", 1, 0, []int64{1}, []int64{1})) + "."
		torchZip(t, filepath.Join(in, shard), []any{pk.Proto2, pk.Repeat("}0", slowDicts), tail},
			map[string][]byte{"0": {0x80, 0x3f}})
	}
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 2 * slowShards}, "weight_map": weights})
	if err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, filepath.Join(in, "pytorch_model.bin.index.json"), b)
}

// TestHostileTorchInterrupt: SIGINT while a checkpoint is being parsed is
// honoured at once (issue 26, case 12): exit 130 within interruptGrace of
// the signal, sent interruptAfter the start. The slow case is a checkpoint
// within every parser limit that still takes seconds to read; it must still
// be parsing when the signal comes. The hostile pickles are refused long
// before the signal once their limits are in place (exit 2 then passes;
// TestHostileTorch checks the rest); until then they are the slow cases.
func TestHostileTorchInterrupt(t *testing.T) {
	const interruptAfter, interruptGrace = 300 * time.Millisecond, 1500 * time.Millisecond
	type interruptCase struct {
		name     string
		build    func(t *testing.T, in string)
		mustStay bool // the run must still be going when the signal comes
		sig      syscall.Signal
	}
	slow := fmt.Sprintf("%d shards of %dM empty dicts each", slowShards, slowDicts>>20)
	cases := []interruptCase{
		{slow, slowTorch, true, syscall.SIGINT},
		// SIGTERM (a CI runner's timeout, a container stop) ends it the
		// same way, with the conventional 128+15.
		{slow + ", SIGTERM", slowTorch, true, syscall.SIGTERM},
	}
	for _, hp := range hostilePickles {
		cases = append(cases, interruptCase{hp.name, func(t *testing.T, in string) {
			torchZip(t, filepath.Join(in, "pytorch_model.bin"), hp.parts, nil)
		}, false, syscall.SIGINT})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := configOnly(t, t.TempDir())
			c.build(t, in)
			p := startMoeprep(t, caseTimeout, "inspect", "--no-progress", in)
			time.Sleep(time.Until(p.start.Add(interruptAfter)))
			if !p.signal(c.sig) {
				r := p.wait()
				if c.mustStay {
					t.Errorf("the slow checkpoint was read within %v, so SIGINT was not tested: make it slower", interruptAfter)
				}
				t.Logf("the parse ended before the signal")
				check(t, r, code(2, nil, ""))
				return
			}
			r := p.wait()
			if c.sig == syscall.SIGTERM {
				check(t, r, code(143, nil, "terminated"))
			} else {
				check(t, r, code(130, nil, "interrupted"))
			}
			if after := r.wall - interruptAfter; after > interruptGrace {
				t.Errorf("exited %.2fs after SIGINT, want within %v", after.Seconds(), interruptGrace)
			}
		})
	}
}

// TestHostileSafetensors: a header of a million zero-size tensors, and a
// 1 GiB sparse index (issue 26, case 13).
func TestHostileSafetensors(t *testing.T) {
	runHostile(t, []hostileCase{
		{
			name: "1,000,000 zero-size tensors in SRC",
			build: func(t *testing.T, dir string) {
				in := configOnly(t, dir)
				linkFile(t, zeroTensors(t), filepath.Join(in, "model.safetensors"))
			},
			runs: [][]string{inspectRun, convertRun, bytesSrcRun},
			file: "model.safetensors",
		},
		{
			// DST's shard replaced, the manifest rewritten to match: the
			// shard itself is what validate has to read.
			name: "1,000,000 zero-size tensors in DST",
			build: func(t *testing.T, dir string) {
				dst := filepath.Join(dir, "dst")
				linkTree(t, tinyFused(t), dst, manifestName, "model-00001-of-00001.safetensors")
				os.Remove(filepath.Join(dst, "model-00001-of-00001.safetensors"))
				linkFile(t, zeroTensors(t), filepath.Join(dst, "model-00001-of-00001.safetensors"))
				rehash(t, dst, "model-00001-of-00001.safetensors")
				linkTree(t, tinySrc(t), filepath.Join(dir, inputDir))
			},
			runs: [][]string{{"validate", "--no-progress", "--bytes", "{in}", "{dir}/dst"}},
			file: "model-00001-of-00001.safetensors",
		},
		{
			name: "1 GiB sparse model.safetensors.index.json",
			build: func(t *testing.T, dir string) {
				in := configOnly(t, dir)
				linkFile(t, filepath.Join(tinySrc(t), "model.safetensors"), filepath.Join(in, "model-00001-of-00001.safetensors"))
				testkit.Sparse(t, filepath.Join(in, "model.safetensors.index.json"), 1<<30,
					[]byte(`{"metadata": {"total_size": 915000}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors", "`))
			},
			runs: [][]string{inspectRun, convertRun, bytesSrcRun},
			file: "model.safetensors.index.json",
		},
	})
}

// zeroTensors is a safetensors file of a million zero-size tensors (a 62 MB
// header, no data), written once, streamed, and hard-linked where cases
// need it.
func zeroTensors(t *testing.T) string {
	const head = `{"__metadata__":{"format":"pt"}`
	entry := func(i int) string {
		return fmt.Sprintf(`,"model.layers.1.mlp.z%07d":{"dtype":"BF16","shape":[0],"data_offsets":[0,0]}`, i)
	}
	n := len(head) + 1_000_000*len(entry(0)) + len("}") // every entry is as long
	pad := strings.Repeat(" ", (8-n%8)%8)
	return filepath.Join(sharedDir(t, "zero-tensors", func(dir string) {
		testkit.WriteStream(t, filepath.Join(dir, "model.safetensors"), func(w io.Writer) error {
			w.Write(binary.LittleEndian.AppendUint64(nil, uint64(n+len(pad))))
			io.WriteString(w, head)
			for i := range 1_000_000 {
				io.WriteString(w, entry(i))
			}
			_, err := io.WriteString(w, "}"+pad)
			return err
		})
	}), "model.safetensors")
}

func linkFile(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(from, to); err != nil {
		t.Fatal(err)
	}
}

// TestHostileConfig: config.json with absurd layer counts, and as a FIFO
// that would block a plain open forever (issue 26, case 14).
func TestHostileConfig(t *testing.T) {
	layers := func(n int64) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			in := tinyInput(t, dir, "config.json")
			testkit.EditJSON(t, filepath.Join(in, "config.json"), func(m map[string]any) { m["num_hidden_layers"] = n })
		}
	}
	runHostile(t, []hostileCase{
		{name: "num_hidden_layers 100,000,000", build: layers(100_000_000),
			runs: [][]string{inspectRun, convertRun, bytesSrcRun}, file: "config.json", msg: "num_hidden_layers"},
		{name: "num_hidden_layers 2,147,483,647", build: layers(2_147_483_647),
			runs: [][]string{inspectRun, convertRun, bytesSrcRun}, file: "config.json", msg: "num_hidden_layers"},
		{name: "config.json is a FIFO", build: func(t *testing.T, dir string) {
			in := tinyInput(t, dir, "config.json")
			os.Remove(filepath.Join(in, "config.json"))
			if err := syscall.Mkfifo(filepath.Join(in, "config.json"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, runs: [][]string{inspectRun, convertRun, bytesSrcRun}, file: "config.json"},
	})
}

// TestHostileOutputFiles: moeprep's own files, read back from a DST or a
// DST.partial, made huge or asking for absurd work (issue 26, case 15).
func TestHostileOutputFiles(t *testing.T) {
	runHostile(t, []hostileCase{
		{
			name: "sparse 4 GiB moeprep-progress.json, then --resume",
			build: func(t *testing.T, dir string) {
				tinyInput(t, dir)
				testkit.Sparse(t, filepath.Join(dir, "resumed.partial", "moeprep-progress.json"), 4<<30, []byte(`{"version": 1, "fingerprint": "`))
			},
			// The resume must refuse without turning resumed.partial into a
			// DST (the .partial itself may stay: it was there before).
			runs:   [][]string{{"convert", "--no-progress", "--resume", "{in}", "{dir}/resumed"}},
			file:   "moeprep-progress.json",
			absent: []string{"resumed"},
		},
		{
			name: "sparse 4 GiB moeprep-manifest.json",
			build: func(t *testing.T, dir string) {
				dst := filepath.Join(dir, "dst")
				linkTree(t, tinyFused(t), dst, manifestName)
				if err := os.Truncate(filepath.Join(dst, manifestName), 4<<30); err != nil {
					t.Fatal(err)
				}
				tinyInput(t, dir)
			},
			runs: [][]string{{"validate", "--no-progress", "--bytes", "{in}", "{dir}/dst"},
				{"validate", "--no-progress", "--device", "cpu", "{in}", "{dir}/dst"}},
			file: manifestName,
			exit: 1,
		},
		{
			// 1-byte hash blocks over a 0.5 GB shard: half a billion digests.
			name: "manifest asking for 1-byte hash blocks",
			build: func(t *testing.T, dir string) {
				dst := filepath.Join(dir, "dst")
				linkTree(t, bigConverted(t), dst, manifestName)
				shard := filepath.Base(onlyFile(t, dst, "model-*.safetensors"))
				st, err := os.Stat(filepath.Join(dst, shard))
				if err != nil {
					t.Fatal(err)
				}
				editManifest(t, dst, func(files map[string]any) {
					files[shard] = map[string]any{"size": st.Size(),
						"xxh3_blocks": map[string]any{"block_size": 1, "root": strings.Repeat("0", 32)}}
				})
			},
			runs: [][]string{{"validate", "--no-progress", "--bytes", "{big}", "{dir}/dst"}},
			file: manifestName,
			msg:  "block",
			exit: 1,
		},
		{
			// A golden whose tensors claim 4 GiB, held by a sparse file.
			name: "sparse 4 GiB golden file",
			build: func(t *testing.T, dir string) {
				head := testkit.STHead(`{"x":{"dtype":"F32","shape":[8388608,64],"data_offsets":[0,2147483648]},` +
					`"y":{"dtype":"F32","shape":[8388608,64],"data_offsets":[2147483648,4294967296]}}`)
				testkit.Sparse(t, filepath.Join(dir, "golden", "moe-layer-1.safetensors"), int64(len(head))+4<<30, head)
			},
			runs: [][]string{{"validate", "--no-progress", "--device", "cpu", "{fused}", "--golden", "{dir}/golden"}},
			file: "moe-layer-1.safetensors",
		},
		{
			// A golden whose header length field claims 4 GiB.
			name: "golden file with a 4 GiB header",
			build: func(t *testing.T, dir string) {
				testkit.Sparse(t, filepath.Join(dir, "golden", "moe-layer-1.safetensors"), 8+4<<30, binary.LittleEndian.AppendUint64(nil, 4<<30))
			},
			runs: [][]string{{"validate", "--no-progress", "--device", "cpu", "{fused}", "--golden", "{dir}/golden"}},
			file: "moe-layer-1.safetensors",
		},
	})
}
