package convert

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

func dropTensor(name string) func([]synthTensor) []synthTensor {
	return func(ts []synthTensor) []synthTensor {
		var out []synthTensor
		for _, x := range ts {
			if x.name != name {
				out = append(out, x)
			}
		}
		return out
	}
}

func editTensor(name string, f func(*synthTensor)) func([]synthTensor) []synthTensor {
	return func(ts []synthTensor) []synthTensor {
		for i := range ts {
			if ts[i].name == name {
				f(&ts[i])
			}
		}
		return ts
	}
}

// assertNothingComplete: DST does not exist, and no config.json with a contract anywhere near it.
func assertNothingComplete(t *testing.T, dst string) {
	t.Helper()
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s exists after a failed run", dst)
	}
	if b, err := os.ReadFile(filepath.Join(dst+PartialSuffix, "config.json")); err == nil && strings.Contains(string(b), layout.ContractKey) {
		t.Errorf("%s holds a config.json with the contract after a failed run", dst+PartialSuffix)
	}
}

func TestBadInputFailsCleanly(t *testing.T) {
	e3 := "model.layers.1.mlp.experts.3."
	small := ds2FP8
	small.I = 64 // S=2 with I not a multiple of 128: scale blocks straddle slices
	cases := []struct {
		name string
		src  synth
		edit func([]synthTensor) []synthTensor
		o    Options
		want string
	}{
		{"missing expert", ds3BF16, dropTensor(e3 + "up_proj.weight"), Options{}, "expert 3"},
		{"expert shape", ds3BF16, editTensor(e3+"down_proj.weight", func(x *synthTensor) { x.shape = []int64{int64(ds3BF16.I), int64(ds3BF16.H)} }), Options{}, "down_proj"},
		{"expert dtype", ds3BF16, editTensor(e3+"gate_proj.weight", func(x *synthTensor) { x.dtype = safetensors.F16 }), Options{}, "gate_proj"},
		{"mixtral fuse", mixBF16, nil, Options{FuseShared: true}, "no shared expert"},
		{"qwen3 fuse", q3BF16, nil, Options{FuseShared: true}, "no shared expert"},
		{"qwen2 gated fuse", q2BF16, nil, Options{FuseShared: true}, "gate"},
		{"ue8m0 fold down", withScaleFmt(ds3FP8, "ue8m0"), nil, Options{FuseShared: true, FoldScaling: "down"}, "UE8M0"},
		{"S2 straddling fp8 blocks", small, nil, Options{FuseShared: true}, "straddle"},
		{"bad fold mode", ds3BF16, nil, Options{FoldScaling: "sometimes"}, "fold-scaling"},
		{"bad layout", ds3BF16, nil, Options{Layout: "diagonal"}, "layout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
			writeSynth(t, src, tc.src, tc.edit)
			o := tc.o
			o.Src, o.Dst = src, dst
			_, err := Convert(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
			assertNothingComplete(t, dst)
		})
	}
}

func mustMkdir(t *testing.T, d string) {
	t.Helper()
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
}

// cancelAfter cancels a context once n bytes have been reported.
type cancelAfter struct {
	n      int64
	done   atomic.Int64
	cancel context.CancelFunc
	once   sync.Once
	total  atomic.Int64
}

func (c *cancelAfter) Total(n int64) { c.total.Store(n) }
func (c *cancelAfter) Add(n int64) {
	if c.done.Add(n) >= c.n {
		c.once.Do(c.cancel)
	}
}

func TestResumeFinishesInterruptedRunIdentically(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  synth
		o    Options
	}{
		{"fp8 fuse fold", ds3FP8, Options{FuseShared: true, TP: 2, MaxShardSize: 150000, Jobs: 1}},
		{"bf16 fuse fold down gate-up", ds3BF16, Options{FuseShared: true, TP: 4, FoldScaling: "down", Layout: layout.GateUp, MaxShardSize: 8000, Jobs: 2}},
		// reused shards' sources are read again through the band caches
		{"fp8 fuse in-out", ds3FP8, Options{FuseShared: true, TP: 2, Orientation: layout.InOut, MaxShardSize: 150000, Jobs: 2}},
		// per rank: shards in the rank directories, reused the same way
		{"fp8 fuse ep2 slots6", ds3FP8, Options{FuseShared: true, EP: 2, Slots: 6, MaxShardSize: 150000, Jobs: 1}},
		{"bf16 ep2 moe-tp2 gate-up", ds3BF16, Options{EP: 2, MoETP: 2, Layout: layout.GateUp, MaxShardSize: 8000, Jobs: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "src")
			writeSynth(t, src, tc.src, nil)
			ref, cut := filepath.Join(dir, "ref"), filepath.Join(dir, "cut")

			o := tc.o
			o.Src, o.Dst = src, ref
			want, err := Convert(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if want.Shards < 3 {
				t.Fatalf("only %d shards: the test needs several", want.Shards)
			}

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rep := &cancelAfter{n: want.Bytes / 2, cancel: cancel}
			o.Dst, o.Progress = cut, rep
			if _, err := Convert(ctx, o); !errors.Is(err, context.Canceled) {
				t.Fatalf("interrupted run: %v, want context.Canceled", err)
			}
			assertNothingComplete(t, cut)
			if rep.total.Load() <= 0 {
				t.Errorf("Total never reported")
			}

			o.Progress = nil
			if _, err := Convert(context.Background(), o); err == nil || !strings.Contains(err.Error(), "--resume") {
				t.Errorf("rerun without --resume over DST.partial: %v", err)
			}
			o.Resume = true
			got, err := Convert(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if got.ReusedShards == 0 || got.ReusedShards >= got.Shards {
				t.Errorf("resume reused %d of %d shards; want some but not all", got.ReusedShards, got.Shards)
			}
			mRef, err := layout.ReadManifest(ref)
			if err != nil {
				t.Fatal(err)
			}
			mCut, err := layout.ReadManifest(cut)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range sortedKeys(mRef.Files) {
				if mCut.Files[f] != mRef.Files[f] {
					t.Errorf("%s differs after resume: %+v vs %+v", f, mCut.Files[f], mRef.Files[f])
				}
			}
			if len(mCut.Files) != len(mRef.Files) {
				t.Errorf("resumed output has %d files, reference %d", len(mCut.Files), len(mRef.Files))
			}
			if err := mCut.Verify(cut); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestResumeRefusesDifferentOptions(t *testing.T) {
	dir, src := ds3Src(t)
	dst := filepath.Join(dir, "dst")
	ctx, cancel := context.WithCancel(context.Background())
	rep := &cancelAfter{n: 1, cancel: cancel}
	o := Options{Src: src, Dst: dst, MaxShardSize: 8000, Jobs: 1, Progress: rep}
	if _, err := Convert(ctx, o); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted run: %v", err)
	}
	// Another --digest would record shards hashed two ways: refused too. The
	// error names the flag, its recorded value and the new one.
	o.Progress, o.Resume, o.Digest = nil, true, layout.BLAKE3Blocks
	if _, err := Convert(context.Background(), o); err == nil || !strings.Contains(err.Error(), "started with --digest xxh3, now blake3") {
		t.Errorf("resume with another digest: %v", err)
	}
	o.Digest = 0
	o.Progress, o.Resume, o.Layout = nil, true, layout.GateUp
	if _, err := Convert(context.Background(), o); err == nil || !strings.Contains(err.Error(), "started with --layout stacked, now gate-up") {
		t.Errorf("resume with another layout: %v", err)
	}
	o.Layout, o.Orientation = "", layout.InOut
	if _, err := Convert(context.Background(), o); err == nil || !strings.Contains(err.Error(), "started with --orientation out-in, now in-out") {
		t.Errorf("resume with another orientation: %v", err)
	}
	o.Orientation, o.Layout = "", layout.GateUp
	// A record from before options were recorded, whose shards carry BLAKE3
	// digests: the error points at --digest blake3.
	prog := filepath.Join(dst+".partial", progressFileName)
	legacy := `{"version": 1, "fingerprint": "0000", "shards": {"model-00001-of-00002.safetensors": {"size": 1, "blake3_blocks": {"block_size": 16, "root": "00"}}}}`
	testkit.WriteFile(t, prog, []byte(legacy))
	o.Layout = ""
	if _, err := Convert(context.Background(), o); err == nil || !strings.Contains(err.Error(), "--digest blake3") {
		t.Errorf("resume of a BLAKE3-era partial output: %v", err)
	}
	o.Resume, o.Force = false, true
	if _, err := Convert(context.Background(), o); err != nil {
		t.Errorf("--force over a stale DST.partial: %v", err)
	}
}
