package redteam

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moeprep/moeprep/internal/testkit"
)

// TestStaleResume: a resume after the source changed must not reuse shards
// made from the old bytes (issue 26, cases 4 and 5). The first run is
// interrupted with SIGINT once a shard that the change affects is finished;
// the source is changed so that nothing a cheap check looks at moves (same
// sizes, mtimes restored); the resume then either refuses (exit 2, DST not
// created) or redoes the work: its output must be byte for byte what a
// fresh run on the changed source writes.
func TestStaleResume(t *testing.T) {
	big := bigSrc(t)
	cases := []struct {
		name string
		cmd  []string // the command and its flags, before SRC DST
		// makeSrc builds the case's own source in dir from big.
		makeSrc func(t *testing.T, dir string)
		// affected: interrupt once a finished shard holds a tensor whose name
		// contains this ("" for any tensor).
		affected string
		change   func(t *testing.T, src string)
	}{
		{
			name: "convert after tensor bytes changed, same size and mtime",
			cmd:  append([]string{"convert"}, slowConvert...),
			makeSrc: func(t *testing.T, dir string) {
				testkit.CopyDir(t, big, dir)
			},
			change: flipEveryTensor,
		},
		{
			name: "fuse-shared --fold-scaling down after routed_scaling_factor changed",
			cmd:  append([]string{"fuse-shared", "--tp", "2", "--fold-scaling", "down"}, slowConvert...),
			makeSrc: func(t *testing.T, dir string) {
				linkTree(t, big, dir, "config.json")
			},
			affected: "all_down", // the routed down stacks rsf is folded into
			change: func(t *testing.T, src string) {
				cfg := filepath.Join(src, "config.json")
				keepTimes(t, cfg, func() {
					b := testkit.ReadFile(t, cfg)
					// Same length: 2.5 -> 3.5.
					nb := strings.Replace(string(b), `"routed_scaling_factor": 2.5`, `"routed_scaling_factor": 3.5`, 1)
					if nb == string(b) {
						t.Fatalf("%s: no routed_scaling_factor 2.5 to change", cfg)
					}
					testkit.WriteFile(t, cfg, []byte(nb))
				})
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			src, dst, fresh := filepath.Join(dir, "src"), filepath.Join(dir, "out"), filepath.Join(dir, "fresh")
			c.makeSrc(t, src)
			interrupt(t, append(slices.Clone(c.cmd), src, dst), dst+".partial", c.affected)
			c.change(t, src)

			r := runMoeprep(t, caseTimeout, append(slices.Clone(c.cmd), "--resume", src, dst)...)
			check(t, r, expect{codes: []int{0, 2}})
			if r.code != 0 {
				assertAbsent(t, dst)
				return
			}
			mustRun(t, append(slices.Clone(c.cmd), src, fresh)...)
			assertSameTree(t, fresh, dst)
		})
	}
}

// interrupt starts args, a convert writing into partial, and sends SIGINT
// once a finished shard holds a tensor whose name contains affected. The run
// must stop with exit 130 and leave partial for --resume.
func interrupt(t *testing.T, args []string, partial, affected string) {
	t.Helper()
	p := startMoeprep(t, caseTimeout, args...)
	for !p.exited() {
		if finishedShardHolds(partial, affected) {
			p.signal(syscall.SIGINT)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	r := p.wait()
	if r.code == 0 {
		t.Fatalf("setup: the run finished before a shard holding %q was: %v", affected, r)
	}
	check(t, r, code(130, nil, ""))
	if _, err := os.Stat(filepath.Join(partial, "moeprep-progress.json")); err != nil {
		t.Fatalf("setup: the interrupted run left no progress record: %v", err)
	}
}

// finishedShardHolds reports whether the progress record in partial lists a
// finished shard with a tensor whose name contains affected.
func finishedShardHolds(partial, affected string) bool {
	b, err := os.ReadFile(filepath.Join(partial, "moeprep-progress.json"))
	if err != nil {
		return false
	}
	var rec struct {
		Shards map[string]json.RawMessage `json:"shards"`
	}
	if json.Unmarshal(b, &rec) != nil {
		return false // caught mid-write
	}
	for name := range rec.Shards {
		hdr, err := testkit.ReadSTHeader(filepath.Join(partial, name))
		if err != nil {
			continue
		}
		for tn := range hdr.Tensors {
			if strings.Contains(tn, affected) {
				return true
			}
		}
	}
	return false
}

// flipEveryTensor changes the first byte of every tensor of every
// safetensors file in src (the low mantissa byte of a bf16 value), keeping
// each file's size and restoring its access and modification times: what a
// size-and-mtime fingerprint cannot see (a file rewritten in place by a tool
// that preserves times, rsync -t of a changed upload, a restored backup).
func flipEveryTensor(t *testing.T, src string) {
	shards, _ := filepath.Glob(filepath.Join(src, "*.safetensors"))
	if len(shards) == 0 {
		t.Fatalf("%s: no shards", src)
	}
	for _, path := range shards {
		hdr, err := testkit.ReadSTHeader(path)
		if err != nil {
			t.Fatal(err)
		}
		keepTimes(t, path, func() {
			for _, e := range hdr.Tensors {
				if e.DataOffsets[1] > e.DataOffsets[0] {
					testkit.FlipBits(t, path, hdr.DataStart+e.DataOffsets[0], 1)
				}
			}
		})
	}
}

// keepTimes is testkit.KeepTimes for changes that keep path's size too:
// what a size-and-mtime fingerprint cannot see.
func keepTimes(t *testing.T, path string, change func()) {
	t.Helper()
	before := testkit.KeepTimes(t, path, change)
	if st, err := os.Stat(path); err != nil || st.Size() != before.Size() {
		t.Fatalf("%s: size not kept: %v", path, err)
	}
}

// linkTree makes dst a copy of src whose files are hard links, except the
// ones named in own, which are copied (the case changes them).
func linkTree(t *testing.T, src, dst string, own ...string) {
	t.Helper()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if slices.Contains(own, e.Name()) {
			testkit.CopyFile(t, from, to)
		} else if err := os.Link(from, to); err != nil {
			t.Fatal(err)
		}
	}
}

// assertSameTree fails unless got holds exactly want's files with the same
// bytes.
func assertSameTree(t *testing.T, want, got string) {
	t.Helper()
	w, g := testkit.ListDir(t, want), testkit.ListDir(t, got)
	if !slices.Equal(w, g) {
		t.Errorf("%s holds %v, a fresh run wrote %v", got, g, w)
	}
	for _, f := range w {
		if !slices.Contains(g, f) {
			continue
		}
		if err := sameFiles(filepath.Join(want, f), filepath.Join(got, f)); err != nil {
			t.Errorf("stale output: %v", err)
		}
	}
}

// TestConcurrentRuns: two runs on one DST (issue 26, case 6). The second,
// with --force, starts while the first is writing: it must fail at once
// naming the lock, and the first must finish a complete DST. Three rounds,
// the second run started 0.2, 0.3 and 0.4 s into the first.
func TestConcurrentRuns(t *testing.T) {
	src := bigSrc(t)
	for i, delay := range []time.Duration{200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond} {
		t.Run(fmt.Sprintf("second after %v", delay), func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), fmt.Sprintf("out-%d", i))
			first := startMoeprep(t, caseTimeout, append(append([]string{"convert"}, slowConvert...), src, dst)...)
			time.Sleep(time.Until(first.start.Add(delay)))
			if first.exited() {
				t.Fatalf("setup: the first run ended within %v: %v", delay, first.wait())
			}
			second := runMoeprep(t, caseTimeout, append(append([]string{"convert"}, slowConvert...), "--force", src, dst)...)
			firstDone := first.exited()
			check(t, second, code(2, names(dst), `lock|another|in use|in progress|running|busy`))
			// "At once": it must not wait for the first run.
			if second.wall > time.Second {
				t.Errorf("the second run took %.2fs to give up", second.wall.Seconds())
			}
			if firstDone {
				t.Errorf("the first run had ended before the second did; the race was not tested")
			}
			check(t, first.wait(), code(0, nil, ""))
			assertComplete(t, dst)
			assertAbsent(t, dst+".partial")
		})
	}
}

// assertComplete checks that dst is a whole moeprep output: every shard its
// index names and every file its manifest lists exists, at the listed size.
func assertComplete(t *testing.T, dst string) {
	t.Helper()
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	b, err := os.ReadFile(filepath.Join(dst, "model.safetensors.index.json"))
	if err == nil {
		err = json.Unmarshal(b, &idx)
	}
	if err != nil || len(idx.WeightMap) == 0 {
		t.Fatalf("%s: no usable index: %v", dst, err)
	}
	for _, shard := range slices.Compact(slices.Sorted(maps.Values(idx.WeightMap))) {
		if _, err := os.Stat(filepath.Join(dst, shard)); err != nil {
			t.Errorf("%s: shard %s named by the index is missing", dst, shard)
		}
	}
	var man struct {
		Files map[string]struct {
			Size int64 `json:"size"`
		} `json:"files"`
	}
	b, err = os.ReadFile(filepath.Join(dst, manifestName))
	if err == nil {
		err = json.Unmarshal(b, &man)
	}
	if err != nil || len(man.Files) == 0 {
		t.Fatalf("%s: no usable manifest: %v", dst, err)
	}
	for name, fi := range man.Files {
		st, err := os.Stat(filepath.Join(dst, filepath.FromSlash(name)))
		if err != nil || st.Size() != fi.Size {
			t.Errorf("%s: %s listed in the manifest (%d bytes) is missing or of another size: %v", dst, name, fi.Size, err)
		}
	}
}
