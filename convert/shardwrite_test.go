package convert

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/zeebo/blake3"
	"github.com/zeebo/xxh3"
)

// TestShardWriterOrderAndBlocks writes the same conversions with the
// production sizes and with sizes shrunk so that tiny fixtures span hundreds
// of chunks and hash blocks (blocks then finish out of order, chunks cross
// tensor and row boundaries). Every output must be byte-identical, and each
// shard's block digest must be the one computed from its bytes with the
// algorithm --digest asked for.
func TestShardWriterOrderAndBlocks(t *testing.T) {
	type sizes struct {
		name        string
		chunk       int64
		block       int64
		noWriteback bool             // as where there is no sync_file_range
		digest      layout.BlockAlgo // 0: the default, XXH3-128
		buffered    bool             // --buffered-io: no O_DIRECT
		staged      int              // the direct writer's staging buffers (0: maxStaged)
	}
	variants := []sizes{
		{name: "production", chunk: chunkSize, block: shardBlockSize},
		{name: "small", chunk: 96, block: 4096},
		{name: "small, buffered", chunk: 96, block: 4096, buffered: true},
		{name: "small, 2 staging buffers (blocks spill)", chunk: 96, block: 4096, staged: 2},
		{name: "small, 1 staging buffer", chunk: 1000, block: 8192, staged: 1},
		{name: "small, odd chunk", chunk: 1000, block: 4096},
		{name: "odd block (not a page: buffered)", chunk: 4096, block: 777},
		{name: "small, buffered, no early write-back", chunk: 96, block: 4096, noWriteback: true, buffered: true},
		{name: "small, --digest blake3", chunk: 96, block: 4096, digest: layout.BLAKE3Blocks},
		{name: "odd block, --digest sha256", chunk: 4096, block: 777, digest: layout.SHA256Blocks},
	}
	defer func(c, s int64, wb func(*os.File, int64, int64), ms int) {
		chunkSize, shardBlockSize, startWriteback, maxStaged, onDirectStats = c, s, wb, ms, nil
	}(chunkSize, shardBlockSize, startWriteback, maxStaged)
	writeback, staged := startWriteback, maxStaged
	direct := directSupported(t)
	for _, tc := range []struct {
		name string
		src  synth
		o    Options
	}{
		{"bf16 stacked", ds3BF16, Options{}},
		{"bf16 fuse tp4 fold gate-up", ds3BF16, Options{FuseShared: true, TP: 4, FoldScaling: "down", Layout: layout.GateUp}},
		{"fp8 S2 fuse tp2 split", ds2FP8, Options{FuseShared: true, TP: 2, Layout: layout.UpGate}},
		{"fp8 S2 fuse tp2 dequantised to bf16", ds2FP8, Options{FuseShared: true, TP: 2, DType: safetensors.BF16}},
		{"fp8 ragged blocks dequantised to f32 gate-up", ds3FP8, Options{Layout: layout.GateUp, DType: safetensors.F32}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "src")
			writeSynth(t, src, tc.src, nil)
			var ref string
			for i, v := range variants {
				chunkSize, shardBlockSize = v.chunk, v.block
				startWriteback = writeback
				if v.noWriteback {
					startWriteback = nil
				}
				maxStaged = staged
				if v.staged > 0 {
					maxStaged = v.staged
				}
				var mu sync.Mutex
				var directBlocks, spilled, blocks int64
				onDirectStats = func(_ string, st *directStats) {
					mu.Lock()
					defer mu.Unlock()
					directBlocks += st.direct.Load()
					spilled += st.spilled.Load()
					blocks += st.direct.Load() + st.spilled.Load() + st.buffered.Load()
				}
				dst := filepath.Join(dir, "dst"+string(rune('a'+i)))
				o := tc.o
				o.Src, o.Dst, o.Digest, o.BufferedIO = src, dst, v.digest, v.buffered
				if _, err := Convert(context.Background(), o); err != nil {
					t.Fatalf("%s: %v", v.name, err)
				}
				// Which writer wrote the shards: the direct one wherever the
				// block is whole pages and O_DIRECT works here.
				wantDirect := direct && !v.buffered && v.block%directAlign == 0
				switch {
				case wantDirect && (directBlocks == 0 || spilled+directBlocks != blocks):
					t.Errorf("%s: direct writer wrote %d blocks directly, spilled %d, of %d: want every block one of the two", v.name, directBlocks, spilled, blocks)
				case !wantDirect && blocks != 0:
					t.Errorf("%s: the direct writer wrote %d blocks, want the buffered writer", v.name, blocks)
				case wantDirect && v.staged > 0 && spilled == 0:
					t.Errorf("%s: with %d staging buffers no block spilled: the test does not exercise spilling", v.name, v.staged)
				case wantDirect && v.staged == 0 && v.block == layout.ShardBlockSize && spilled != 0:
					t.Errorf("%s: %d blocks spilled with %d staging buffers", v.name, spilled, maxStaged)
				}
				m, err := layout.ReadManifest(dst)
				if err != nil {
					t.Fatal(err)
				}
				shards := 0
				for name, fi := range m.Files {
					if filepath.Ext(name) != ".safetensors" {
						if fi.SHA256 == "" {
							t.Errorf("%s: %s has no whole-file sha256", v.name, name)
						}
						continue
					}
					shards++
					b := testkit.ReadFile(t, filepath.Join(dst, name))
					want := layout.FileInfo{Size: int64(len(b))}
					d := layout.BlockDigest{BlockSize: v.block, Root: blockRoot(b, v.block, v.digest)}
					switch v.digest {
					case layout.BLAKE3Blocks:
						want.B3Blocks = d
					case layout.SHA256Blocks:
						want.Blocks = d
					default:
						want.X3Blocks = d
					}
					if fi != want {
						t.Errorf("%s: %s: manifest %+v, want %+v", v.name, name, fi, want)
					}
					if int64(len(b)) <= v.block && v.block < 1<<20 {
						t.Errorf("%s: %s is one block (%d bytes): the test does not exercise out-of-order blocks", v.name, name, len(b))
					}
				}
				if shards == 0 {
					t.Fatalf("%s: no shards in the manifest", v.name)
				}
				if err := m.Verify(dst); err != nil {
					t.Errorf("%s: %v", v.name, err)
				}
				if i == 0 {
					ref = dst
					continue
				}
				for name := range m.Files {
					if filepath.Ext(name) != ".safetensors" {
						continue
					}
					a, _ := os.ReadFile(filepath.Join(ref, name))
					b, _ := os.ReadFile(filepath.Join(dst, name))
					if !bytes.Equal(a, b) {
						t.Errorf("%s: %s differs from the production-size run", v.name, name)
					}
				}
			}
		})
	}
}

// blockRoot is layout.BlockDigest's definition, computed independently of
// layout: the hash of the concatenated hashes of the blocks, XXH3-128
// (canonical big-endian bytes) unless algo is BLAKE3 or SHA-256.
func blockRoot(b []byte, bs int64, algo layout.BlockAlgo) string {
	sum := func(p []byte) []byte {
		switch algo {
		case layout.BLAKE3Blocks:
			d := blake3.Sum256(p)
			return d[:]
		case layout.SHA256Blocks:
			d := sha256.Sum256(p)
			return d[:]
		}
		d := xxh3.Hash128(p).Bytes()
		return d[:]
	}
	var cat []byte
	for off := int64(0); off < int64(len(b)); off += bs {
		cat = append(cat, sum(b[off:min(off+bs, int64(len(b)))])...)
	}
	return hex.EncodeToString(sum(cat))
}

// planFor normalises o and plans its output: the source, open until the
// test ends, and the plan.
func planFor(t *testing.T, o *Options) (*checkpoint.Checkpoint, *outPlan) {
	t.Helper()
	if err := o.norm(); err != nil {
		t.Fatal(err)
	}
	ck, fp := cktest.OpenPlanned(t, o.Src)
	op, err := buildPlan(ck, fp, o)
	if err != nil {
		t.Fatal(err)
	}
	return ck, op
}

func TestPlanChunksReadsSourcesInOrder(t *testing.T) {
	dir, src := ds3Src(t)
	defer func(c int64) { chunkSize = c }(chunkSize)
	chunkSize = 1000
	for _, lay := range []layout.Layout{layout.Stacked, layout.GateUp, layout.UpGate} {
		o := Options{Src: src, Dst: filepath.Join(dir, "dst"), Layout: lay}
		_, op := planFor(t, &o)
		for _, s := range op.shards {
			chunks, err := s.planChunks()
			if err != nil {
				t.Fatal(err)
			}
			// convert reads each source byte once: every chunk of a file
			// starts at or after the end of the one before it.
			covered := int64(len(s.header))
			prevEnd := map[string]int64{}
			for i, c := range chunks {
				covered += c.n
				if !c.p.contiguous() {
					t.Fatalf("%s: convert planned a strided chunk", lay)
				}
				if c.src.off < prevEnd[c.src.file] {
					t.Fatalf("%s %s: chunk %d reads %s from %d, before the end %d of the chunk read before it", lay, s.name, i, c.src.file, c.src.off, prevEnd[c.src.file])
				}
				prevEnd[c.src.file] = c.src.off + c.n
			}
			if covered != s.size {
				t.Errorf("%s %s: chunks cover %d of %d bytes", lay, s.name, covered, s.size)
			}
			if len(chunks) < 10 {
				t.Errorf("%s %s: only %d chunks", lay, s.name, len(chunks))
			}
		}
	}
}

func TestSyncFilesNamesWhatFailed(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.json")
	testkit.WriteFile(t, file, []byte("{}"))
	missing := filepath.Join(dir, "missing.json")
	for _, tc := range []struct {
		name  string
		paths []string
		want  string // "" for success
	}{
		{"a file", []string{file}, ""},
		{"nothing", nil, ""},
		{"a missing file", []string{file, missing}, "missing.json"},
	} {
		err := syncFiles(tc.paths)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one naming %s", tc.name, err, tc.want)
		}
	}
}

// TestOwnSource: a shard reads its parts through its own open file of each
// source, byte for byte what the shared one gives, and falls back to the
// shared file when the path no longer names the same file.
func TestOwnSource(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "src")
	data := patternedFile(t, path, 10000, func(i int) byte { return byte(i*31 + i/7) })
	shared := testkit.Open(t, path)
	// A section at 100 of the file, and a part at 50 of the section: bytes 150...
	sec := io.NewSectionReader(shared, 100, 9000)
	p := &part{region: region{src: sec, file: path, tensor: "t", off: 50, rows: 3, rowLen: 200, stride: 1000}}
	want := make([]byte, p.size())
	if err := p.readAt(want, 0); err != nil {
		t.Fatal(err)
	}
	sw := &shardWriter{}
	r, own := sw.ownSource(p)
	if own == nil || own == shared || r.off != 150 {
		t.Fatalf("own %v (shared %v), offset %d, want a new file and 150", own, shared, r.off)
	}
	got := make([]byte, p.size())
	if err := r.readAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("through its own file: %v, bytes equal %v", err, bytes.Equal(got, want))
	}
	if r2, own2 := sw.ownSource(p); own2 != own || r2 != r {
		t.Errorf("second call opened another file")
	}
	sw.closeSources()
	if _, err := own.Stat(); err == nil {
		t.Errorf("closeSources left its file open")
	}
	// With two chunks planned from this source, the own file stays open
	// after the first and is closed after the second.
	sw = &shardWriter{}
	chunks := []*chunk{{p: p, n: 100}, {p: p, pos: 100, n: 100}}
	sw.countSources(chunks)
	_, own = sw.ownSource(p)
	sw.chunkDone(chunks[0])
	if _, err := own.Stat(); err != nil {
		t.Errorf("closed after the first of two chunks: %v", err)
	}
	sw.chunkDone(chunks[1])
	if _, err := own.Stat(); err == nil {
		t.Errorf("still open after the last chunk")
	}
	sw.closeSources()
	// The path now names another file: the shared one is used.
	os.Remove(path)
	os.WriteFile(path, []byte("other"), 0o644)
	sw = &shardWriter{}
	if r, f := sw.ownSource(p); f != shared || r.src != shared {
		t.Errorf("replaced path: got %v, want the shared file", f)
	}
	// A source that is not a file is read as it is.
	mem := &part{region: region{src: bytes.NewReader(data), file: "mem", off: 7, rows: 1, rowLen: 10}}
	if r, f := sw.ownSource(mem); f != nil || r != mem.region {
		t.Errorf("in-memory source: file %v, region %+v", f, r)
	}
}

// TestPutShortSource: a source file that ends before a chunk's bytes (it
// shrank after the plan was made) fails the chunk with an error naming the
// file and tensor, and nothing is written for it.
func TestPutShortSource(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "src.safetensors")
	data := patternedFile(t, path, 1000, func(i int) byte { return byte(i*7 + 3) })
	src := testkit.Open(t, path)
	out := testkit.Create(t, filepath.Join(dir, "out"))
	for _, tc := range []struct {
		name  string
		r     region
		short bool
	}{
		{"whole", region{src: src, file: path, tensor: "model.layers.3.mlp.experts.5.up_proj.weight", off: 800, rows: 1, rowLen: 200}, false},
		{"contiguous past the end", region{src: src, file: path, tensor: "model.layers.3.mlp.experts.5.up_proj.weight", off: 900, rows: 1, rowLen: 200}, true},
		{"strided past the end", region{src: src, file: path, tensor: "model.layers.3.mlp.experts.6.up_proj.weight", off: 500, rows: 3, rowLen: 100, stride: 250}, true},
	} {
		// Both writers: the buffered one pwrites the chunk, the direct one
		// reads it into 64-byte staged blocks and hands each finished block on.
		for _, direct := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, direct %v", tc.name, direct), func(t *testing.T) {
				p := &part{region: tc.r}
				sw := &shardWriter{path: out.Name(), out: out, size: p.size(), bs: 64}
				defer sw.closeSources()
				c := &chunk{p: p, n: p.size()}
				var buf []byte
				got := make([]byte, p.size())
				var err, rerr error
				if direct {
					d := newDirectShard(sw, nil)
					defer d.release()
					err = d.put(context.Background(), c, &buf)
					close(d.done)
					for db := range d.done {
						copy(got[db.b*sw.bs:], db.buf[:min(sw.bs, sw.size-db.b*sw.bs)])
					}
				} else {
					err = sw.put(c, &buf)
					_, rerr = out.ReadAt(got, 0)
				}
				if !tc.short {
					if err != nil || rerr != nil || !bytes.Equal(got, data[800:]) {
						t.Fatalf("put: %v, read back: %v, bytes equal %v", err, rerr, bytes.Equal(got, data[800:]))
					}
					return
				}
				if err == nil || !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.r.tensor) {
					t.Fatalf("got %v, want an unexpected-EOF error naming %s and %s", err, path, tc.r.tensor)
				}
			})
		}
	}
}

// directSupported reports whether the test's temporary directory takes
// O_DIRECT writes; where it does not, the writer falls back and the tests
// say so.
func directSupported(t *testing.T) bool {
	t.Helper()
	if !directIO {
		return false
	}
	p := filepath.Join(t.TempDir(), "probe")
	testkit.WriteFile(t, p, "")
	f, err := openDirect(p)
	if err != nil {
		t.Logf("no O_DIRECT in %s (%v): only the buffered writer is tested", filepath.Dir(p), err)
		return false
	}
	f.Close()
	return true
}

// TestDirectWriteRefusedOrFailing makes the direct writes fail: a refusal
// (EINVAL, as a file system without O_DIRECT for some writes gives) sends
// that block and every later one through the page cache, and the output
// must be byte-identical to a buffered run; any other error (EIO) fails
// the run with an error naming the shard, and leaves no DST.
func TestDirectWriteRefusedOrFailing(t *testing.T) {
	if !directSupported(t) {
		t.Skip("no O_DIRECT here")
	}
	defer func(c, s int64, w func(*os.File, []byte, int64) (int, error)) {
		chunkSize, shardBlockSize, writeDirectAt, onDirectStats = c, s, w, nil
	}(chunkSize, shardBlockSize, writeDirectAt)
	chunkSize, shardBlockSize = 96, 4096
	dir, src := ds3Src(t)
	ref := filepath.Join(dir, "ref")
	if _, err := Convert(context.Background(), Options{Src: src, Dst: ref, BufferedIO: true}); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name    string
		err     error
		after   int64 // direct writes that succeed first
		wantErr bool
	}{
		{"EINVAL after 3 blocks", syscall.EINVAL, 3, false},
		{"EINVAL at once", syscall.EINVAL, 0, false},
		{"EIO after 3 blocks", syscall.EIO, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			writeDirectAt = func(f *os.File, b []byte, off int64) (int, error) {
				if calls.Add(1) > tc.after {
					return 0, &os.PathError{Op: "write", Path: f.Name(), Err: tc.err}
				}
				return f.WriteAt(b, off)
			}
			var direct, buffered atomic.Int64
			onDirectStats = func(_ string, st *directStats) {
				direct.Add(st.direct.Load())
				buffered.Add(st.buffered.Load())
			}
			dst := filepath.Join(dir, fmt.Sprintf("dst%d", i))
			_, err := Convert(context.Background(), Options{Src: src, Dst: dst, Jobs: 1})
			if tc.wantErr {
				if err == nil || !errors.Is(err, tc.err) || !strings.Contains(err.Error(), ".safetensors") || !strings.Contains(err.Error(), "writing bytes") {
					t.Fatalf("err %v: want %v naming the shard and the bytes", err, tc.err)
				}
				if _, serr := os.Stat(dst); !os.IsNotExist(serr) {
					t.Errorf("a failed run left %s (%v)", dst, serr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if direct.Load() != tc.after || buffered.Load() == 0 {
				t.Errorf("%d blocks written directly and %d buffered: want %d and the rest", direct.Load(), buffered.Load(), tc.after)
			}
			if calls.Load() != tc.after+1 {
				t.Errorf("%d direct writes tried: after the first refusal the writer should stop trying (want %d)", calls.Load(), tc.after+1)
			}
			files := 0
			err = filepath.WalkDir(ref, func(path string, e os.DirEntry, err error) error {
				if err != nil || e.IsDir() {
					return err
				}
				rel, _ := filepath.Rel(ref, path)
				a, _ := os.ReadFile(path)
				b, err := os.ReadFile(filepath.Join(dst, rel))
				if err != nil || !bytes.Equal(a, b) {
					t.Errorf("%s differs from the buffered run (%v)", rel, err)
				}
				files++
				return nil
			})
			if err != nil || files < 3 {
				t.Errorf("compared %d files (%v)", files, err)
			}
		})
	}
}

// patternedFile writes n bytes, byte i being f(i), to path and returns them.
func patternedFile(t *testing.T, path string, n int, f func(int) byte) []byte {
	t.Helper()
	data := make([]byte, n)
	for i := range data {
		data[i] = f(i)
	}
	testkit.WriteFile(t, path, data)
	return data
}
