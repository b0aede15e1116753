package redteam

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moeprep/moeprep/internal/progress"
)

// The "Done when" bounds on any one run, however hostile its input.
const (
	maxWall     = 5 * time.Second
	maxRSSBytes = 300_000_000
)

// caseTimeout is when a run is killed and its case failed: well past maxWall,
// so that a slow run is reported with its time rather than as a hang.
const caseTimeout = 10 * time.Second

// bin is the moeprep binary TestMain builds; scratch holds it and the shared
// fixtures, and is removed when the tests end.
var bin, scratch string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	var err error
	scratch, err = os.MkdirTemp("", "moeprep-redteam-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "redteam:", err)
		return 1
	}
	defer os.RemoveAll(scratch)
	if b := os.Getenv("REDTEAM_MOEPREP"); b != "" {
		// A binary built elsewhere, e.g. from another revision to compare.
		bin = b
		return m.Run()
	}
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "redteam:", err)
		return 1
	}
	bin = filepath.Join(scratch, "moeprep")
	build := exec.Command("go", "build", "-o", bin, "./cmd/moeprep")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "redteam: go build ./cmd/moeprep: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// moduleRoot is the directory of go.mod, wherever `go test` was started.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("go env GOMOD: not inside the module")
	}
	return filepath.Dir(gomod), nil
}

// result is one finished moeprep run.
type result struct {
	args           []string
	code           int            // exit status, -1 when a signal ended it
	signal         syscall.Signal // the signal that ended it, if any
	stdout, stderr string
	wall           time.Duration
	maxRSSKB       int64 // peak resident set, KiB (Linux getrusage)
	testHWMKB      int64 // the test process's own peak RSS when it started the run, KiB
	timedOut       bool  // killed at its timeout
	diskRunaway    bool  // killed by a disk guard (guardDisk)
}

func (r result) String() string {
	how := fmt.Sprintf("exit %d", r.code)
	if r.signal != 0 {
		how = "ended by signal " + r.signal.String()
	}
	switch {
	case r.timedOut:
		how += " (timed out)"
	case r.diskRunaway:
		how += " (disk guard)"
	}
	rss := fmt.Sprintf("%d MB", r.maxRSSKB*1024/1_000_000)
	if r.maxRSSKB <= r.testHWMKB {
		rss = "at most " + rss + " (the test's own)"
	}
	return fmt.Sprintf("moeprep %s: %s in %.2fs, peak RSS %s; stderr %q; stdout %q",
		strings.Join(r.args, " "), how, r.wall.Seconds(), rss, clip(r.stderr), clip(r.stdout))
}

func clip(s string) string {
	if len(s) > 600 {
		return s[:300] + " ... " + s[len(s)-300:]
	}
	return s
}

// proc is a moeprep run in progress.
type proc struct {
	args           []string
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	start          time.Time
	done           chan struct{}
	res            result
	timedOut       atomic.Bool
	runaway        atomic.Bool
}

// startMoeprep starts moeprep with args; it is killed after timeout, and at
// the end of the test if nobody waited for it.
func startMoeprep(t testing.TB, timeout time.Duration, args ...string) *proc {
	t.Helper()
	p := &proc{args: args, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	hwm := selfHWMKB(t)
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting moeprep: %v", err)
	}
	go func() {
		p.cmd.Wait() // what matters is in ProcessState
		p.res = result{args: args, code: -1, stdout: p.stdout.String(), stderr: p.stderr.String(),
			wall: time.Since(p.start), timedOut: p.timedOut.Load(), diskRunaway: p.runaway.Load(), testHWMKB: hwm}
		if ps := p.cmd.ProcessState; ps != nil {
			p.res.code = ps.ExitCode()
			if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
				p.res.maxRSSKB = ru.Maxrss
			}
			if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				p.res.signal = ws.Signal()
			}
		}
		close(p.done)
	}()
	go func() {
		select {
		case <-p.done:
		case <-time.After(timeout):
			p.timedOut.Store(true)
			p.cmd.Process.Kill()
		}
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// selfHWMKB is the test process's peak RSS (VmHWM), KiB.
//
// Linux counts it in every child's ru_maxrss: a child starts as a copy of
// (or, with vfork, shares) the test's address space, and exec keeps the
// larger of that and the new program's peak. So a child's peak is measured
// only above the test's own; the test must stay well under maxRSSBytes
// (hostile files are streamed to disk, never built in memory), and
// assertSane refuses to judge a run when it does not.
func selfHWMKB(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatalf("reading the test's own peak RSS: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err == nil {
				return kb
			}
		}
	}
	t.Fatalf("/proc/self/status has no VmHWM")
	return 0
}

// wait waits for the run to end.
func (p *proc) wait() result {
	<-p.done
	return p.res
}

// exited reports whether the run has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig unless the run has ended; it reports whether it sent it.
func (p *proc) signal(sig os.Signal) bool {
	if p.exited() {
		return false
	}
	return p.cmd.Process.Signal(sig) == nil
}

// guardDisk kills the run once the files under dir take more than limit
// bytes of disk: a run that writes (or preallocates) what a hostile input
// claims, tens of GB, must fail its case, not fill the CI machine's disk
// first.
func (p *proc) guardDisk(dir string, limit int64) {
	go progress.Every(50*time.Millisecond, p.done, func() bool {
		if diskUsage(dir) <= limit {
			return true
		}
		p.runaway.Store(true)
		p.cmd.Process.Kill()
		return false
	})
}

// diskUsage is what the files under dir occupy (allocated blocks, so sparse
// files count for what they hold).
func diskUsage(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// runMoeprep runs moeprep with args to the end, or kills it after timeout.
func runMoeprep(t testing.TB, timeout time.Duration, args ...string) result {
	t.Helper()
	return startMoeprep(t, timeout, args...).wait()
}

// mustRun runs a setup command that has to succeed.
func mustRun(t testing.TB, args ...string) result {
	t.Helper()
	r := runMoeprep(t, 2*time.Minute, args...)
	if r.code != 0 {
		t.Fatalf("setup failed: %v", r)
	}
	return r
}

// expect is what a case demands of one run.
type expect struct {
	codes []int    // allowed exit codes (most cases: exactly one)
	names []string // when failing: the error line names one of these files (base names)
	msg   string   // when failing: a case-insensitive regexp the error line matches; "" for any
}

// check asserts everything every run must satisfy, then e.
func check(t testing.TB, r result, e expect) {
	t.Helper()
	t.Logf("%v", r)
	assertSane(t, r)
	if !slices.Contains(e.codes, r.code) {
		t.Errorf("exit code %d, want one of %v", r.code, e.codes)
	}
	if r.code != 0 && r.signal == 0 {
		assertOneLineError(t, r, e.names, e.msg)
	}
}

// assertSane checks what any run must satisfy, whatever its exit code: it
// ended on its own, within the time and memory bounds, printed no panic or
// stack trace and no raw ESC byte.
func assertSane(t testing.TB, r result) {
	t.Helper()
	switch {
	case r.timedOut:
		t.Errorf("killed after running %.1fs (timeout)", r.wall.Seconds())
	case r.diskRunaway:
		t.Errorf("killed after %.1fs for writing too much to disk", r.wall.Seconds())
	case r.signal != 0 && r.signal != syscall.SIGINT:
		t.Errorf("ended by %v", r.signal)
	}
	if r.wall >= maxWall {
		t.Errorf("ran %.2fs, the bound is %v", r.wall.Seconds(), maxWall)
	}
	if r.testHWMKB*1024 >= maxRSSBytes/2 {
		t.Errorf("harness: the test process's own peak RSS, %d MB, is too close to the bound to measure the child's", r.testHWMKB*1024/1_000_000)
	}
	if rss := r.maxRSSKB * 1024; rss >= maxRSSBytes {
		t.Errorf("peak RSS %d MB, the bound is %d MB", rss/1_000_000, maxRSSBytes/1_000_000)
	}
	for _, out := range []struct{ name, s string }{{"stdout", r.stdout}, {"stderr", r.stderr}} {
		if m := panicText.FindString(out.s); m != "" {
			t.Errorf("%s carries panic or stack trace text %q", out.name, m)
		}
		if i := strings.IndexByte(out.s, 0x1b); i >= 0 {
			t.Errorf("%s carries a raw ESC byte at %d: %q", out.name, i, clip(out.s[max(0, i-40):]))
		}
	}
}

// panicText is what a panic, a recovered panic or a stack trace prints.
var panicText = regexp.MustCompile(`panic:|goroutine \d+|internal error|runtime error|\.go:\d+|\[recovered\]`)

// noticeLine is what moeprep may print on stderr besides the error, even
// with --no-progress: validate's one-line notices (the CPU fallback).
var noticeLine = regexp.MustCompile(`^(validate|note): `)

// assertOneLineError checks that stderr ends in exactly one line starting
// "moeprep: ", naming one of names (if any) and matching msg (if any), with
// nothing but notices before it.
func assertOneLineError(t testing.TB, r result, names []string, msg string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "moeprep: ") {
		t.Errorf("stderr does not end in one line starting \"moeprep: \": %q", clip(r.stderr))
		return
	}
	for _, l := range lines[:len(lines)-1] {
		if strings.HasPrefix(l, "moeprep: ") || !noticeLine.MatchString(l) {
			t.Errorf("stderr has more than the one error line: %q", clip(r.stderr))
			break
		}
	}
	if len(names) > 0 && !slices.ContainsFunc(names, func(n string) bool { return strings.Contains(last, filepath.Base(n)) }) {
		t.Errorf("the error does not name %s: %q", strings.Join(names, " or "), last)
	}
	if msg != "" && !regexp.MustCompile("(?i)"+msg).MatchString(last) {
		t.Errorf("the error does not say %q: %q", msg, last)
	}
}

// code builds an expect for one exit code.
func code(c int, names []string, msg string) expect {
	return expect{codes: []int{c}, names: names, msg: msg}
}

// names is a readable []string.
func names(n ...string) []string { return n }

// fixtures caches the checkpoints several tests read: `moeprep fixture
// synth` with the same flags always writes the same bytes, so one copy per
// test binary serves every reader. Callers must not modify them.
var fixtures = struct {
	sync.Mutex
	dirs map[string]string
}{dirs: map[string]string{}}

// sharedDir returns scratch/name, made by build the first time it is asked
// for.
func sharedDir(t testing.TB, name string, build func(dir string)) string {
	t.Helper()
	fixtures.Lock()
	defer fixtures.Unlock()
	if d, ok := fixtures.dirs[name]; ok {
		return d
	}
	dir := filepath.Join(scratch, name)
	os.RemoveAll(dir)
	build(dir)
	if t.Failed() {
		t.FailNow()
	}
	fixtures.dirs[name] = dir
	return dir
}

// Synth flags of the checkpoints the cases use.
var (
	// tinyArgs: DeepSeek-V3 with 16 experts, about 1 MB, with
	// tokenizer_config.json and generation_config.json; every command on it
	// takes well under a second.
	tinyArgs = []string{"--preset", "tiny-deepseek-v3"}
	// bigArgs: 64 experts of 512x512, about 0.5 GB in 100 MB shards;
	// converted with slowConvert it takes about a second on 2 cores, long
	// enough to interrupt it, or to start a second run beside it.
	bigArgs = []string{"--preset", "tiny-deepseek-v3", "--hidden", "512", "--intermediate", "512",
		"--experts", "64", "--layers", "5", "--shard-size", "100MB"}
	// slowConvert makes a convert of big write many shards one at a time
	// (progress is recorded per shard) and hash them with SHA-256.
	slowConvert = []string{"--no-progress", "--jobs", "1", "--digest", "sha256", "--max-shard-size", "50MB"}
)

// synth writes a checkpoint into dir.
func synth(t testing.TB, dir string, args ...string) {
	t.Helper()
	mustRun(t, append(append([]string{"fixture", "synth", "--no-progress"}, args...), dir)...)
}

func tinySrc(t testing.TB) string {
	return sharedDir(t, "tiny", func(dir string) { synth(t, dir, tinyArgs...) })
}

func bigSrc(t testing.TB) string {
	return sharedDir(t, "big", func(dir string) { synth(t, dir, bigArgs...) })
}

// tinyFused is fuse-shared --tp 2 of tinySrc: a DST with two shared replicas
// and a shared_slot_weight of 1/rsf (bf16 is not folded by default).
func tinyFused(t testing.TB) string {
	src := tinySrc(t)
	return sharedDir(t, "tiny-fused", func(dir string) {
		mustRun(t, "fuse-shared", "--no-progress", "--tp", "2", src, dir)
	})
}

// bigConverted is convert of bigSrc with the default shard size: one shard
// of about 0.5 GB.
func bigConverted(t testing.TB) string {
	src := bigSrc(t)
	return sharedDir(t, "big-converted", func(dir string) {
		mustRun(t, "convert", "--no-progress", src, dir)
	})
}
