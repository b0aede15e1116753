package convert

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
)

// snapshot lists every file under dir with its bytes (links as "-> target").
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "-> " + target
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameSnapshot(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d files, was %d", what, len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s changed or lost", what, k)
		}
	}
}

// Every destination rule of --force and of links: what is refused leaves
// both directories exactly as they were.
func TestDestinationRules(t *testing.T) {
	dir, src := ds3Src(t)
	srcLink := filepath.Join(dir, "srclink")
	if err := os.Symlink(src, srcLink); err != nil {
		t.Fatal(err)
	}
	earlier := filepath.Join(dir, "earlier") // a genuine moeprep output
	if _, err := Convert(context.Background(), Options{Src: src, Dst: earlier}); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name  string
		setup func(t *testing.T) (srcArg, dstArg string)
		force bool
		want  string // "" means success
	}{
		{"new DST", func(t *testing.T) (string, string) { return src, filepath.Join(dir, "new") }, false, ""},
		{"existing DST without --force", func(t *testing.T) (string, string) {
			d := filepath.Join(dir, "existing")
			mustMkdir(t, d)
			testkit.WriteFile(t, filepath.Join(d, "keep"), []byte("x"))
			return src, d
		}, false, "already exists"},
		{"--force over a directory of other work", func(t *testing.T) (string, string) {
			d := filepath.Join(dir, "models")
			mustMkdir(t, filepath.Join(d, "other-checkpoint"))
			testkit.WriteFile(t, filepath.Join(d, "other-checkpoint", "config.json"), []byte("{}"))
			testkit.WriteFile(t, filepath.Join(d, "notes.txt"), []byte("mine"))
			return src, d
		}, true, "not an earlier moeprep output"},
		{"--force over a file", func(t *testing.T) (string, string) {
			f := filepath.Join(dir, "afile")
			testkit.WriteFile(t, f, []byte("x"))
			return src, f
		}, true, "a regular file, not an earlier moeprep output"},
		{"--force over an empty directory", func(t *testing.T) (string, string) {
			d := filepath.Join(dir, "empty")
			mustMkdir(t, d)
			return src, d
		}, true, ""},
		{"--force over an earlier output", func(t *testing.T) (string, string) { return src, earlier }, true, ""},
		{"--force over an earlier output with a file added", func(t *testing.T) (string, string) {
			d := filepath.Join(dir, "earlier2")
			if _, err := Convert(context.Background(), Options{Src: src, Dst: d}); err != nil {
				t.Fatal(err)
			}
			testkit.WriteFile(t, filepath.Join(d, "my-eval-results.txt"), []byte("keep me"))
			return src, d
		}, true, "my-eval-results.txt is not one of its files"},
		{"--force DST == SRC through a link", func(t *testing.T) (string, string) { return srcLink, src }, true, "is the source"},
		{"DST inside SRC through a link", func(t *testing.T) (string, string) { return src, filepath.Join(srcLink, "out") }, false, "is inside the source"},
		{"SRC inside DST", func(t *testing.T) (string, string) { return src, dir }, true, "contains the source"},
		{"DST is a link", func(t *testing.T) (string, string) {
			l := filepath.Join(dir, "dstlink")
			if err := os.Symlink(earlier, l); err != nil {
				t.Fatal(err)
			}
			return src, l
		}, true, "is a symbolic link"},
		{"DST under a regular file", func(t *testing.T) (string, string) {
			f := filepath.Join(dir, "blocker")
			testkit.WriteFile(t, f, []byte("x"))
			return src, filepath.Join(f, "dst")
		}, false, "cannot create"},
		{"moeprep output as SRC", func(t *testing.T) (string, string) { return earlier, filepath.Join(dir, "again") }, false, "already moeprep output"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, d := tc.setup(t)
			before := snapshot(t, dir)
			_, err := Convert(context.Background(), Options{Src: s, Dst: d, Force: tc.force})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("%v", err)
				}
				cktest.Open(t, d)
				if _, err := os.Lstat(d + ".moeprep-old"); err == nil {
					t.Errorf("the replaced output was left beside the new one")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
			sameSnapshot(t, tc.name, snapshot(t, dir), before)
		})
	}
}

// A second run on the same DST fails at once while the first holds the
// lock, and the first finishes whole.
func TestSecondRunOnOneDSTIsRefused(t *testing.T) {
	dir, src := ds3Src(t)
	dst := filepath.Join(dir, "dst")
	pd, created, err := lockPartial(dst + PartialSuffix)
	if err != nil || !created {
		t.Fatalf("lock: %v %v", created, err)
	}
	for _, o := range []Options{{Src: src, Dst: dst}, {Src: src, Dst: dst, Force: true}, {Src: src, Dst: dst, Resume: true}} {
		start := time.Now()
		_, err := Convert(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), "another moeprep run is writing this output") {
			t.Errorf("force %v resume %v: %v", o.Force, o.Resume, err)
		}
		if time.Since(start) > 5*time.Second {
			t.Errorf("the refusal took %v", time.Since(start))
		}
	}
	if _, err := os.Lstat(dst); err == nil {
		t.Errorf("a refused run made DST")
	}
	pd.unlock()
	if _, err := Convert(context.Background(), Options{Src: src, Dst: dst, Force: true}); err != nil {
		t.Fatalf("after the lock is dropped: %v", err)
	}
}

// --force clears a DST.partial only when it is moeprep's.
func TestForceClearsOnlyOwnPartial(t *testing.T) {
	dir, src := ds3Src(t)
	dst := filepath.Join(dir, "dst")
	mustMkdir(t, dst+PartialSuffix)
	testkit.WriteFile(t, filepath.Join(dst+PartialSuffix, "thesis.tex"), []byte("years of work"))
	_, err := Convert(context.Background(), Options{Src: src, Dst: dst, Force: true})
	if err == nil || !strings.Contains(err.Error(), "not an interrupted moeprep run") {
		t.Fatalf("got %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dst+PartialSuffix, "thesis.tex")); err != nil || string(b) != "years of work" {
		t.Fatalf("the file in DST.partial was touched: %v", err)
	}
}

// interruptedRun leaves a DST.partial whose progress record names every
// shard as finished.
func interruptedRun(t *testing.T, o Options) {
	t.Helper()
	if _, err := Convert(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	// Then drive a second run by hand: prepare, write every shard, stop
	// before finishing, as an interruption after the last shard would.
	if err := os.RemoveAll(o.Dst); err != nil {
		t.Fatal(err)
	}
	ck, op := planFor(t, &o)
	src, dst, err := resolveDirs(o.Src, o.Dst)
	if err != nil {
		t.Fatal(err)
	}
	w := &run{o: &o, ck: ck, op: op, src: src, dst: dst, partial: dst + PartialSuffix}
	if err := w.preparePartial(); err != nil {
		t.Fatal(err)
	}
	defer w.lock.unlock()
	for _, s := range op.shards {
		fi, sd, err := w.writeShard(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.prog.done(s.name, fi, sd); err != nil {
			t.Fatal(err)
		}
	}
}

// --resume never reuses a shard whose source bytes changed, even when the
// source file keeps its size and modification time (cp -p, rsync -t), nor
// shards made under another config.json.
func TestResumeChecksSourceContent(t *testing.T) {
	cases := []struct {
		name   string
		o      Options
		change func(t *testing.T, src string)
		want   string // "" means the resume redoes what changed and succeeds
	}{
		{"tensor bytes changed, size and mtime kept", Options{}, func(t *testing.T, src string) {
			flipTensorByte(t, src, "model.layers.1.mlp.experts.3.down_proj.weight")
		}, ""},
		{"rsf changed in config.json", Options{FuseShared: true, FoldScaling: layout.FoldDown}, func(t *testing.T, src string) {
			p := filepath.Join(src, checkpoint.ConfigFileName)
			testkit.KeepTimes(t, p, func() {
				testkit.EditJSON(t, p, func(cfg map[string]any) { cfg["routed_scaling_factor"] = 3.0 })
			})
		}, "config.json has changed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, src := ds3Src(t)
			o := tc.o
			o.Src, o.Dst, o.MaxShardSize = src, filepath.Join(dir, "dst"), 20_000
			interruptedRun(t, o)
			tc.change(t, src)
			o.Resume = true
			sum, err := Convert(context.Background(), o)
			if testkit.WantErr(t, err, tc.want) {
				return
			}
			if sum.ReusedShards == 0 || sum.ReusedShards == sum.Shards {
				t.Errorf("reused %d of %d shards: want the unchanged ones reused and the changed one redone", sum.ReusedShards, sum.Shards)
			}
			fresh := filepath.Join(dir, "fresh")
			o.Dst, o.Resume = fresh, false
			if _, err := Convert(context.Background(), o); err != nil {
				t.Fatal(err)
			}
			sameSnapshot(t, "resumed output", snapshot(t, filepath.Join(dir, "dst")), snapshot(t, fresh))
		})
	}
}

// flipTensorByte changes one byte of tensor name in place, keeping the
// file's size and times.
func flipTensorByte(t *testing.T, dir, name string) {
	t.Helper()
	tn, ok := cktest.Open(t, dir).Tensor(name)
	if !ok {
		t.Fatalf("no tensor %s", name)
	}
	file := tn.File
	h, err := testkit.ReadSTHeader(file)
	if err != nil {
		t.Fatal(err)
	}
	testkit.KeepTimes(t, file, func() { testkit.FlipBits(t, file, h.DataStart+h.Tensors[name].DataOffsets[0], 0x40) })
}

// An HF hub cache snapshot links every file into blobs/: converting it (or
// a link to it) copies every file's content, none left behind.
func TestConvertHubCacheSnapshot(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	writeSynth(t, plain, ds3BF16, nil)
	extras := map[string]string{
		"tokenizer.json":         `{"model":{}}`,
		"tokenizer_config.json":  `{"chat_template":"{{ messages }}"}`,
		"chat_template.jinja":    "{% for m in messages %}{{ m }}{% endfor %}",
		"generation_config.json": `{"eos_token_id": 1}`,
		"modeling_deepseek.py":   "# remote code\n",
		"README.md":              "# model\n",
		"original/params.json":   `{"dim": 40}`,
	}
	for n, v := range extras {
		mustMkdir(t, filepath.Dir(filepath.Join(plain, n)))
		testkit.WriteFile(t, filepath.Join(plain, n), []byte(v))
	}
	// models--org--name/{blobs/<n>, snapshots/REV/<file> -> ../../blobs/<n>}
	repo := filepath.Join(dir, "models--org--name")
	snap := filepath.Join(repo, "snapshots", "0123abcd")
	mustMkdir(t, filepath.Join(repo, "blobs"))
	want := snapshot(t, plain)
	i := 0
	for rel, content := range want {
		blob := filepath.Join(repo, "blobs", "blob"+string(rune('a'+i)))
		i++
		testkit.WriteFile(t, blob, []byte(content))
		link := filepath.Join(snap, rel)
		mustMkdir(t, filepath.Dir(link))
		target, err := filepath.Rel(filepath.Dir(link), blob)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	snapLink := filepath.Join(dir, "latest")
	if err := os.Symlink(snap, snapLink); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{snap, snapLink} {
		dst := filepath.Join(dir, "out-"+filepath.Base(src))
		if _, err := Convert(context.Background(), Options{Src: src, Dst: dst}); err != nil {
			t.Fatal(err)
		}
		got := snapshot(t, dst)
		for n, v := range extras {
			if got[n] != v {
				t.Errorf("%s: %s is %q in DST, want %q", src, n, got[n], v)
			}
			if st, err := os.Lstat(filepath.Join(dst, n)); err != nil || !st.Mode().IsRegular() {
				t.Errorf("%s: %s is not a regular file in DST", src, n)
			}
		}
		man, err := layout.ReadManifest(dst)
		if err != nil {
			t.Fatal(err)
		}
		for n := range extras {
			if _, ok := man.Files[n]; !ok {
				t.Errorf("%s: the manifest does not list %s", src, n)
			}
		}
	}
}

// What cannot be copied as a file is an error naming it, not a file left out.
func TestOtherFilesThatCannotBeCopied(t *testing.T) {
	cases := []struct {
		name string
		make func(t *testing.T, src string)
		want string
	}{
		{"dangling link", func(t *testing.T, src string) {
			if err := os.Symlink("nowhere", filepath.Join(src, "vocab.txt")); err != nil {
				t.Fatal(err)
			}
		}, "vocab.txt: a symbolic link whose target cannot be read"},
		{"link to a directory", func(t *testing.T, src string) {
			if err := os.Symlink(t.TempDir(), filepath.Join(src, "assets")); err != nil {
				t.Fatal(err)
			}
		}, "assets: a directory; moeprep copies regular files"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, src := ds3Src(t)
			tc.make(t, src)
			dst := filepath.Join(dir, "dst")
			_, err := Convert(context.Background(), Options{Src: src, Dst: dst})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			assertNothingComplete(t, dst)
		})
	}
}

// --resume over a complete output is a success with nothing written, as
// retry loops need; an output that differs is named, never reused.
func TestResumeOnCompleteOutput(t *testing.T) {
	dir, src := ds3Src(t)
	dst := filepath.Join(dir, "dst")
	o := Options{Src: src, Dst: dst, FuseShared: true, TP: 2}
	if _, err := Convert(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, dst)
	o.Resume = true
	sum, err := Convert(context.Background(), o)
	if err != nil || !sum.AlreadyComplete || sum.Shards == 0 || sum.Bytes == 0 {
		t.Fatalf("resume of a complete output: %+v, %v", sum, err)
	}
	sameSnapshot(t, "after the idempotent rerun", snapshot(t, dst), before)

	cases := []struct {
		name   string
		change func(o *Options)
		tamper func()
		want   string
	}{
		{"other options", func(o *Options) { o.TP = 4 }, nil, "other options or from another source"},
		{"other layout", func(o *Options) { o.Layout = layout.GateUp }, nil, "other options or from another source"},
		{"a shard changed", nil, func() {
			testkit.FlipBits(t, filepath.Join(dst, "model-00001-of-00001.safetensors"), -1, 1)
		}, "does not match its manifest entry"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o2 := o
			if tc.change != nil {
				tc.change(&o2)
			}
			if tc.tamper != nil {
				tc.tamper()
			}
			_, err := Convert(context.Background(), o2)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
