package stream

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/safetensors"
)

// fixture writes n random bytes to a file and returns its path and bytes.
func fixture(t *testing.T, n int) (string, []byte) {
	t.Helper()
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	path := filepath.Join(t.TempDir(), "f.bin")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, b
}

// tensorAt is a U8 tensor of the file's bytes [off, off+n), read through
// a section of the open file as safetensors tensors are.
func tensorAt(t *testing.T, path string, off, n int64) *checkpoint.Tensor {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &checkpoint.Tensor{Name: "t", DType: safetensors.U8, Shape: []int64{n}, File: path, Data: io.NewSectionReader(f, off, n)}
}

// Every step's extents come back as the file holds them, whether the
// extent is a file range, a tensor of a file (O_DIRECT where the file
// system takes it, buffered otherwise) or a tensor of another reader; a
// budget smaller than a step still reads it; a step released before it
// was read is never read.
func TestPassSteps(t *testing.T) {
	for _, buffered := range []bool{false, true} {
		path, data := fixture(t, 3<<20+123)
		a := tensorAt(t, path, 1000, 1<<20)
		mem := &checkpoint.Tensor{Name: "m", DType: safetensors.U8, Shape: []int64{4096}, Data: bytes.NewReader(data[5000:9096])}
		steps := []Step{
			{Extents: []Extent{{File: path, Off: 0, N: 10}, {T: a, Off: 7, N: 100}, {T: mem, Off: 1, N: 4000}}},
			{Extents: []Extent{{T: a, Off: 1 << 19, N: 1 << 19}, {File: path, Off: 3 << 20, N: 123}}},
			{Extents: []Extent{{File: path, Off: 2 << 20, N: 1 << 20}}, Users: 2},
			{Extents: []Extent{{File: path, Off: 17, N: 3}}},
		}
		want := [][][]byte{
			{data[0:10], data[1007:1107], data[5001:9001]},
			{data[1000+1<<19 : 1000+1<<20], data[3<<20:]},
			{data[2<<20 : 3<<20]},
			{data[17:20]},
		}
		var readFor [4]atomic.Int64
		p, err := New(steps, Options{Budget: 1 << 10, Buffered: buffered, OnRead: func(i int, n int64) { readFor[i].Add(n) }})
		if err != nil {
			t.Fatal(err)
		}
		p.Release(3) // no one needs it
		ctx := context.Background()
		p.Start(ctx)
		for i := range 3 {
			if err := p.Wait(ctx, i); err != nil {
				t.Fatal(err)
			}
			for e, w := range want[i] {
				if !bytes.Equal(p.Bytes(i, e), w) {
					t.Fatalf("buffered %v: step %d extent %d differs", buffered, i, e)
				}
			}
			p.Release(i)
		}
		p.Release(2) // its second user
		if err := p.Wait(ctx, 3); err != nil {
			t.Fatal(err)
		}
		if readFor[3].Load() != 0 || readFor[2].Load() != 1<<20 || readFor[0].Load() != p.StepBytes(0) {
			t.Errorf("bytes read per step: %d %d %d %d", readFor[0].Load(), readFor[1].Load(), readFor[2].Load(), readFor[3].Load())
		}
		p.Close()
	}
}

// Install serves a tensor's reads from the steps that hold them, from
// many goroutines at once, while steps are released; a read no held step
// covers goes to the file and counts as a miss. Run with -race.
func TestWindowReads(t *testing.T) {
	path, data := fixture(t, 8<<20)
	const n = 16
	c := &checkpoint.Checkpoint{}
	var steps []Step
	for i := range n {
		tn := tensorAt(t, path, int64(i)<<19, 1<<19)
		c.Tensors = append(c.Tensors, tn)
		steps = append(steps, Step{Extents: []Extent{{T: tn, Off: 0, N: 1 << 19}}})
	}
	p, err := New(steps, Options{Budget: 3 << 19})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Install(c)
	p.Start(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			defer p.Release(i)
			buf := make([]byte, 1000)
			for off := int64(0); off+1000 <= 1<<19; off += 77777 {
				if _, err := c.Tensors[i].Data.ReadAt(buf, off); err != nil {
					t.Error(err)
					return
				}
				at := int64(i)<<19 + off
				if !bytes.Equal(buf, data[at:at+1000]) {
					t.Errorf("tensor %d at %d differs", i, off)
					return
				}
			}
		})
	}
	wg.Wait()
	if p.Misses() != 0 {
		t.Errorf("%d misses while every step was held", p.Misses())
	}
	buf := make([]byte, 10)
	if _, err := c.Tensors[3].Data.ReadAt(buf, 5); err != nil || !bytes.Equal(buf, data[3<<19+5:3<<19+15]) || p.Misses() != 1 {
		t.Errorf("a read after its step was let go: %v, %d misses", err, p.Misses())
	}
}

// A pass closed half way returns, and its Wait says why.
func TestPassClose(t *testing.T) {
	path, _ := fixture(t, 1<<20)
	var steps []Step
	for i := range 8 {
		steps = append(steps, Step{Extents: []Extent{{File: path, Off: int64(i) << 17, N: 1 << 17}}})
	}
	p, err := New(steps, Options{Budget: 1 << 17})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.Start(ctx)
	if err := p.Wait(ctx, 0); err != nil {
		t.Fatal(err)
	}
	cancel()
	p.Close()
	if err := p.Wait(context.Background(), 7); err == nil {
		t.Errorf("step 7 of a closed pass: no error")
	}
}

// A step past the budget comes in only once someone wants it: with step 0
// held, step 1 waits until Want(1), and Want of a step outside the pass is
// nothing.
func TestPassWant(t *testing.T) {
	path, _ := fixture(t, 1<<20)
	steps := []Step{
		{Extents: []Extent{{File: path, Off: 0, N: 1 << 17}}},
		{Extents: []Extent{{File: path, Off: 1 << 17, N: 1 << 17}}},
	}
	p, err := New(steps, Options{Budget: 1 << 17})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	p.Start(ctx)
	if err := p.Wait(ctx, 0); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := p.Wait(short, 1); err == nil {
		t.Fatal("step 1 came in past the budget with step 0 held and no one wanting it")
	}
	p.Want(-1)
	p.Want(2)
	p.Want(1)
	long, cancel2 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel2()
	if err := p.Wait(long, 1); err != nil {
		t.Fatalf("step 1 after Want(1): %v", err)
	}
}

// Large buffers come from one arena, first fit from its start: a freed
// range is handed out again (two freed neighbours joined serve a buffer of
// both their sizes, where buffers kept by size would have mapped new
// memory), and what the arena cannot hold is mapped on its own and
// unmapped when freed.
func TestBuffersArena(t *testing.T) {
	const mb = 1 << 20
	// Each op gets (n > 0) a buffer of n MiB or puts back (n < 0) the
	// buffer of op -n-1; want is where each get's buffer starts in the
	// arena in MiB (-1: mapped apart).
	type op struct{ n, want int }
	cases := []struct {
		name  string
		keep  int64 // the arena: keep and a quarter, in huge pages
		ops   []op
		holes []hole // the arena's free ranges at the end
		apart int    // buffers mapped apart and held at the end
	}{
		{"first fit from the start", 8 * mb, []op{{2, 0}, {3, 2}, {-1, 0}, {1, 0}}, []hole{{16, 16}, {80, 80}}, 0},
		{"neighbours joined serve a larger buffer", 8 * mb, []op{{2, 0}, {2, 2}, {2, 4}, {-1, 0}, {-2, 0}, {4, 0}}, []hole{{96, 64}}, 0},
		{"a neighbour after joined", 8 * mb, []op{{2, 0}, {2, 2}, {-2, 0}, {-1, 0}, {9, 0}}, []hole{{144, 16}}, 0},
		{"past the arena mapped apart, unmapped when put", 4 * mb, []op{{4, 0}, {4, -1}, {2, 4}, {-2, 0}, {3, -1}}, nil, 1},
		{"a size that is not whole units", 8 * mb, []op{{1, 0}, {-1, 0}, {1, 0}}, []hole{{17, 143}}, 0},
	}
	// A buffer put back after close (a reader that pinned its step past
	// the pass's end) is let go, not handed out again.
	t.Run("put after close", func(t *testing.T) {
		b := buffers{keep: 8 * mb}
		buf, apart := b.get(2*mb), b.get(12*mb)
		b.close()
		b.put(buf)
		b.put(apart)
		if b.arena != nil || len(b.holes) != 0 || len(b.apart) != 0 {
			t.Errorf("after close and put: arena %d bytes, holes %v, %d apart", len(b.arena), b.holes, len(b.apart))
		}
	})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := buffers{keep: c.keep}
			defer b.close()
			var got [][]byte
			for k, o := range c.ops {
				if o.n < 0 {
					b.put(got[-o.n-1])
					got = append(got, nil)
					continue
				}
				n := int64(o.n) * mb
				if c.name == "a size that is not whole units" {
					n += directAlign // one unit more
				}
				buf := b.get(n)
				got = append(got, buf)
				if int64(len(buf)) != n || alignedAt(buf) != 0 {
					t.Fatalf("op %d: get(%d) gave %d bytes %d from a block", k, n, len(buf), alignedAt(buf))
				}
				at := -1
				if off := uintptr(unsafe.Pointer(unsafe.SliceData(buf))) - uintptr(unsafe.Pointer(unsafe.SliceData(b.arena))); off < uintptr(len(b.arena)) {
					at = int(off / mb)
				}
				if at != o.want {
					t.Fatalf("op %d: get(%d MiB) at %d MiB of the arena, want %d", k, o.n, at, o.want)
				}
			}
			if !slices.Equal(b.holes, c.holes) || len(b.apart) != c.apart {
				t.Errorf("holes %v, %d apart; want %v, %d", b.holes, len(b.apart), c.holes, c.apart)
			}
		})
	}
}

// Every buffer get hands out starts on a block (O_DIRECT reads into it) and
// holds exactly the bytes asked for, whether or not the heap placed it.
func TestBuffersAligned(t *testing.T) {
	var b buffers
	defer b.close()
	for _, n := range []int64{1, 100, 4095, directAlign, directAlign + 1, 2 * directAlign, 3 * directAlign, 7 * directAlign, 100 * directAlign, bufUnit/2 - directAlign, bufUnit / 2, bufUnit} {
		for range 3 {
			buf := b.get(n)
			if int64(len(buf)) != n || alignedAt(buf) != 0 {
				t.Fatalf("get(%d): len %d, %d bytes from a block boundary", n, len(buf), alignedAt(buf))
			}
			if n < bufUnit/2 && int64(cap(buf)) != n {
				t.Errorf("get(%d): cap %d", n, cap(buf))
			}
			b.put(buf)
		}
	}
}

// A step of Consume extents is handed to OnConsumed once, when the last of
// their bytes is reported consumed, and not before; a read that spans two
// steps' extents is assembled from both, without going to the file.
func TestConsumedAndAssembled(t *testing.T) {
	path, data := fixture(t, 64<<10)
	tn := tensorAt(t, path, 0, 64<<10)
	c := &checkpoint.Checkpoint{Tensors: []*checkpoint.Tensor{tn}}
	steps := []Step{
		{Extents: []Extent{{T: tn, Off: 0, N: 16 << 10, Consume: true}}},
		{Extents: []Extent{{T: tn, Off: 16 << 10, N: 16 << 10, Consume: true}, {T: tn, Off: 40 << 10, N: 8 << 10}}},
	}
	var mu sync.Mutex
	told := map[int]int{}
	p, err := New(steps, Options{OnConsumed: func(i int) { mu.Lock(); told[i]++; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Install(c)
	p.Start(context.Background())
	// Bytes [10 KiB, 22 KiB) lie across the two steps.
	got := make([]byte, 12<<10)
	if _, err := tn.Data.ReadAt(got, 10<<10); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data[10<<10:22<<10]) || p.Misses() != 0 {
		t.Fatalf("assembled read: equal %v, %d misses", bytes.Equal(got, data[10<<10:22<<10]), p.Misses())
	}
	report := func(off, n int64) {
		tn.Data.(interface{ Consumed(off, n int64) }).Consumed(off, n)
	}
	report(0, 10<<10)
	report(16<<10, 16<<10) // all of step 1's Consume bytes; its other extent does not count
	if told[0] != 0 || told[1] != 1 {
		t.Fatalf("told %v after step 0 in part, step 1 whole", told)
	}
	report(10<<10, 6<<10) // the rest of step 0: done
	report(0, 16<<10)     // again: told once
	if told[0] != 1 || told[1] != 1 {
		t.Errorf("told %v, want each step once", told)
	}
}

// The default budget is four of the largest step that is not Trailing, or
// two of the largest Trailing one where that is more, within [MinBudget,
// MaxBudget]: a large trailing step (the byte proof's rest of DST) does
// not let the reads run four of it ahead of a layer of small experts.
func TestDefaultBudget(t *testing.T) {
	const mb = 1 << 20
	path := filepath.Join(t.TempDir(), "sparse.bin")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil { // sparse: no disk taken
		t.Fatal(err)
	}
	f.Close()
	// k steps of n MiB as the pass holds them: each read's buffer takes
	// the block around it, in whole units of the arena.
	held := func(k, n int64) int64 { return k * bufSize(n*mb+directAlign) }
	cases := []struct {
		name  string
		steps []int64 // MiB; negative: a Trailing step of that size
		want  int64
	}{
		{"small experts, a large trailing step", []int64{6, 6, 12, -66, -66}, held(2, 66)},
		{"large experts, small trailing steps", []int64{84, 84, -9}, held(4, 84)},
		{"no trailing step", []int64{25, 25}, held(4, 25)},
		{"only trailing steps", []int64{-40, -20}, held(2, 40)},
		{"at least MinBudget", []int64{2, -3}, MinBudget},
		{"at most MaxBudget", []int64{300, -400}, MaxBudget},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var steps []Step
			off := int64(0)
			for _, n := range c.steps {
				size := max(n, -n) * mb
				steps = append(steps, Step{Extents: []Extent{{File: path, Off: off, N: size}}, Trailing: n < 0})
				off += size
			}
			p, err := New(steps, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if got := p.Budget(); got != c.want {
				t.Errorf("budget %d bytes, want %d", got, c.want)
			}
		})
	}
}

// Small spans of nearby steps that continue each other in a file are read
// together: two runs interleaved as a layer's stacked weights are (each
// step a slice of each), the slices joined into reads of at most maxJoint
// bytes; every step still gets its own bytes, a step released before it
// was read is not waited for, and its joint read's buffer goes back once
// its last span is freed. A read that fails fails every step of its joint.
func TestJointReads(t *testing.T) {
	const steps, slice = 40, 3000 // two runs of 40 slices: 120 kB each, far under maxJoint
	path, data := fixture(t, 1<<20)
	var plan []Step
	for i := range steps {
		plan = append(plan, Step{Extents: []Extent{
			{File: path, Off: int64(i) * slice, N: slice},
			{File: path, Off: 512<<10 + int64(i)*slice, N: slice},
		}})
	}
	for _, budget := range []int64{2 * slice, 64 << 20} {
		p, err := New(plan, Options{Budget: budget})
		if err != nil {
			t.Fatal(err)
		}
		p.Release(5) // no one needs it
		ctx := context.Background()
		p.Start(ctx)
		for i := range steps {
			if i == 5 {
				continue
			}
			if err := p.Wait(ctx, i); err != nil {
				t.Fatal(err)
			}
			for e, at := range []int64{int64(i) * slice, 512<<10 + int64(i)*slice} {
				if !bytes.Equal(p.Bytes(i, e), data[at:at+slice]) {
					t.Fatalf("budget %d: step %d extent %d differs", budget, i, e)
				}
			}
			p.Release(i)
		}
		p.Close()
		if got := p.reads.Load(); got != 2 {
			t.Errorf("budget %d: %d reads, want 2 (one a run)", budget, got)
		}
		for i := range steps {
			for k := range p.steps[i].spans {
				if sp := &p.steps[i].spans[k]; sp.mem != nil || sp.j == nil || sp.j.mem != nil {
					t.Fatalf("budget %d: step %d span %d: still holds its buffer, or was read alone", budget, i, k)
				}
			}
		}
	}

	// A file shorter than the plan: the joint read fails, and so does every
	// step it carries.
	short := filepath.Join(t.TempDir(), "short.bin")
	if err := os.WriteFile(short, data[:10*slice], 0o644); err != nil {
		t.Fatal(err)
	}
	var shortPlan []Step
	for i := range 12 {
		shortPlan = append(shortPlan, Step{Extents: []Extent{{File: short, Off: int64(i) * slice, N: slice}}})
	}
	p, err := New(shortPlan, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Start(context.Background())
	for i := range 12 {
		if err := p.Wait(context.Background(), i); err == nil {
			t.Errorf("step %d of a joint read past the file's end: no error", i)
		}
	}
}

// Small spans that never continue one another (each a gap of more than
// maxGap past the last) are read one by one, more of them than a file
// keeps runs open, and come back whole; so is a span that continues a run
// opened more than maxJoinSteps steps (and maxOpenRuns runs) before.
func TestJointReadsScattered(t *testing.T) {
	const n, slice = 100, 5000
	path, data := fixture(t, 2*n*slice+slice)
	var plan []Step
	for i := range n {
		plan = append(plan, Step{Extents: []Extent{{File: path, Off: int64(2*i) * slice, N: slice}}})
	}
	// One more step whose span continues step 0's, 100 steps and 99 runs
	// later.
	plan = append(plan, Step{Extents: []Extent{{File: path, Off: slice, N: 100}}})
	p, err := New(plan, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p.Start(ctx)
	for i := range plan {
		if err := p.Wait(ctx, i); err != nil {
			t.Fatal(err)
		}
		x := plan[i].Extents[0]
		if !bytes.Equal(p.Bytes(i, 0), data[x.Off:x.Off+x.N]) {
			t.Fatalf("step %d differs", i)
		}
		p.Release(i)
	}
	p.Close()
	if got := p.reads.Load(); got != n+1 {
		t.Errorf("%d reads, want %d (none continues another in time)", got, n+1)
	}
}
