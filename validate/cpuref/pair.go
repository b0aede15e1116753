package cpuref

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/tensorload"
	"github.com/moeprep/moeprep/weightfmt"
)

// PairOptions are PairLayer's settings beyond the layers and their tokens.
type PairOptions struct {
	// Tokens are the routed tokens' ids, needed by a hash-routed layer only.
	Tokens []int32
	// Coverage adds forced tokens after the routed ones (nil: none), as
	// RefOptions.Coverage and FusedOptions.Coverage do.
	Coverage *moelayer.Coverage
	// RequantShared is RefOptions.RequantShared: the format DST's fused
	// bank quantised SRC's plain shared expert into (nil: none).
	RequantShared weightfmt.Format
	// BlockSize is moe_align_block_size's block of the fused path.
	BlockSize int
	// Workers is how many experts run at once (0: moe.Workers()).
	Workers int
	// Release, when set, is told once for every bank expert (0 up to the
	// contract's bank size) when neither path will read its weights again:
	// as its job ends, or at once for an expert no token reaches (a stream
	// then lets its bytes go). It is called from the jobs' goroutines.
	Release func(bank int)
	// RouterInput is RefOptions.RouterInput, for both paths.
	RouterInput []float32
}

// SideError is PairLayer's error, with the side whose path failed: SRC's
// reference (DST false) or DST's fused path.
type SideError struct {
	DST bool
	Err error
}

func (e *SideError) Error() string { return e.Err.Error() }
func (e *SideError) Unwrap() error { return e.Err }

// PairLayer runs the reference on SRC's layer and the fused path on DST's
// over the same tokens, in one pass over the bank: expert b's job loads
// SRC's expert b and DST's slice b, runs both paths on every token that
// reaches it and lets its weights go, so each expert is decoded once while
// both paths need it (once for both where convert copied its bytes: the
// job's decoder compares them) and the jobs go in the order a stream reads
// the layer: the shared expert with DST's replicas of it first, then the
// routed experts. The results are ReferenceLayer's and FusedLayerRun's bit
// for bit (each expert is computed as they compute it, and the sums run in
// slot order after all of them), and so is the error: a failing reference
// is reported before anything of the fused path, as when the two ran one
// after the other.
func PairLayer(ctx context.Context, src tensorload.TensorSource, plan *family.Plan, layer *family.Layer, dst tensorload.TensorSource, fl *moelayer.FusedLayer, x []float32, t int, o PairOptions) (*moelayer.RefResult, *moelayer.FusedResult, error) {
	r, err := newRefLayer(src, plan, layer, x, t, RefOptions{Tokens: o.Tokens, Coverage: o.Coverage, Workers: o.Workers, RequantShared: o.RequantShared, RouterInput: o.RouterInput})
	if err != nil {
		return nil, nil, &SideError{Err: err}
	}
	p := &pair{r: r, dst: dst, release: o.Release, bankSize: fl.Contract.BankSize(), let1: map[int]bool{}}
	f, err := newFusedRun(dst, fl, x, t, FusedOptions{Tokens: o.Tokens, Coverage: o.Coverage, BlockSize: o.BlockSize, RouterInput: o.RouterInput})
	if err != nil {
		p.fail(true, stepPrepare, err)
	} else {
		p.f = f
		f.out = make([]float32, int(f.al.Numel)*f.h)
		p.jobs = map[int]moe.ExpertJob{}
		for _, j := range f.al.ExpertJobs() {
			p.jobs[j.Expert] = j
		}
	}
	p.run(ctx)
	if err := ctx.Err(); err != nil {
		return nil, nil, &SideError{Err: err}
	}
	if p.errs[0] != nil {
		return nil, nil, &SideError{Err: p.errs[0]}
	}
	ref, err := r.finish(ctx)
	if err != nil {
		return nil, nil, &SideError{Err: err}
	}
	if p.errs[1] != nil {
		return nil, nil, &SideError{DST: true, Err: p.errs[1]}
	}
	fused, err := f.finish()
	if err != nil {
		return nil, nil, &SideError{DST: true, Err: err}
	}
	return ref, fused, nil
}

// The steps of a path, in the order the paths ran them one after the
// other: of two errors of one side, the earlier step's is reported.
const (
	stepPrepare = iota // routing and alignment
	stepExperts        // the routed experts (the bank, on DST)
	stepShared         // the shared expert, run apart from the bank
)

// pair is PairLayer's run: the two prepared paths, DST's jobs by bank
// expert, and the first error of each side (SRC's at 0, DST's at 1).
type pair struct {
	r        *refLayer
	f        *fusedRun // nil when DST's path failed before its experts
	dst      tensorload.TensorSource
	jobs     map[int]moe.ExpertJob
	release  func(bank int) // PairOptions.Release
	bankSize int
	// The shared expert's job and the replica jobs: the decoder they load
	// through, closed once SRC's shared expert is loaded (sharedMLP), and
	// how many of them are still running.
	common    *tensorload.Decoder
	ready     chan struct{}
	once      sync.Once
	sharedMLP *refMLP
	holds     atomic.Int64

	mu      sync.Mutex
	let1    map[int]bool // bank experts let go
	errs    [2]error
	errStep [2]int
}

// fail records a side's error at step; the earliest step's is kept.
func (p *pair) fail(dst bool, step int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := 0
	if dst {
		i = 1
	}
	if p.errs[i] == nil || step < p.errStep[i] {
		p.errs[i], p.errStep[i] = err, step
	}
}

// live reports whether side's path still runs: a SRC error stops both
// (it is what will be reported), a DST error only DST's.
func (p *pair) live(dst bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.errs[0] == nil && (!dst || (p.f != nil && p.errs[1] == nil))
}

// run runs the jobs, Workers at a time, in the order a stream reads the
// layer: the shared expert's, its replicas', then the routed experts'.
func (p *pair) run(ctx context.Context) {
	r := p.r
	sem := make(chan struct{}, r.workers)
	var wg sync.WaitGroup
	// start runs job, which reads bank experts ids, when a worker is free;
	// skip instead once there is no point (the run ended, SRC failed).
	start := func(job func(dec *tensorload.Decoder), skip func(), ids ...int) {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			defer p.let(ids...)
			if ctx.Err() == nil && p.live(false) {
				job(&tensorload.Decoder{})
			} else {
				skip()
			}
		})
	}
	var idle, replicas []int // bank experts no job reads; replicas that run
	for id := r.e; id < p.bankSize; id++ {
		if _, ok := p.jobs[id]; ok && p.f != nil {
			replicas = append(replicas, id)
		} else {
			idle = append(idle, id)
		}
	}
	for id := range r.e {
		if _, ok := p.jobs[id]; !ok && !r.uses(id) {
			idle = append(idle, id)
		}
	}
	p.let(idle...)
	p.common = &tensorload.Decoder{}
	p.ready = make(chan struct{})
	p.holds.Store(int64(len(replicas)) + 1)
	if r.layer.Shared != nil || (p.f != nil && p.f.fl.Shared != nil) {
		start(func(*tensorload.Decoder) { p.shared(ctx) }, func() { p.loaded(nil); p.drop() })
	} else {
		p.loaded(nil)
	}
	for _, id := range replicas {
		start(func(*tensorload.Decoder) {
			<-p.ready
			defer p.drop()
			p.bank(ctx, p.common, id)
		}, p.drop, id)
	}
	for id := range r.e {
		if _, ok := p.jobs[id]; ok || r.uses(id) {
			start(func(dec *tensorload.Decoder) { p.expert(ctx, dec, id) }, func() {}, id)
		}
	}
	wg.Wait()
}

// bankRange is the bank experts [lo, hi).
func (p *pair) bankRange(lo, hi int) []int {
	var ids []int
	for id := lo; id < hi; id++ {
		ids = append(ids, id)
	}
	return ids
}

// let tells Release that bank experts ids are done with, each once.
func (p *pair) let(ids ...int) {
	if p.release == nil {
		return
	}
	for _, id := range ids {
		p.mu.Lock()
		first := !p.let1[id]
		p.let1[id] = true
		p.mu.Unlock()
		if first {
			p.release(id)
		}
	}
}

// expert is routed expert id's job on both sides.
func (p *pair) expert(ctx context.Context, dec *tensorload.Decoder, id int) {
	var m *refMLP
	if p.r.uses(id) {
		var err error
		if m, err = p.r.loadExpert(dec, id); err != nil {
			p.fail(false, stepExperts, err)
			return
		}
		defer m.release()
	}
	p.bank(ctx, dec, id)
	if m != nil {
		p.r.runExpert(id, m)
	}
}

// bank runs DST's bank expert id on its blocks, where it has any.
func (p *pair) bank(ctx context.Context, dec *tensorload.Decoder, id int) {
	j, ok := p.jobs[id]
	if !ok || !p.live(true) {
		return
	}
	f := p.f
	m, err := fusedLoader(f.fl, dec, p.dst, f.h, f.inter, f.wf)(ctx, id)
	if err != nil {
		p.fail(true, stepExperts, err)
		return
	}
	defer dec.ReleaseExpert(m)
	if err := f.runJob(j, m); err != nil {
		p.fail(true, stepExperts, err)
	}
}

// shared is the shared expert's job: SRC's shared expert over every token
// and DST's unfused one. SRC's stays loaded in the common decoder until
// the replica jobs, which load DST's replicas of it through that decoder
// (sharing its decoding where they hold its bytes), are done with it.
func (p *pair) shared(ctx context.Context) {
	r := p.r
	var m *refMLP
	defer p.drop()
	if r.layer.Shared != nil {
		var err error
		if m, err = r.loadShared(p.common); err != nil {
			p.fail(false, stepShared, err)
			p.loaded(nil)
			return
		}
	}
	p.loaded(m)
	if m != nil {
		if err := r.runSharedWith(ctx, m); err != nil {
			p.fail(false, stepShared, err)
			return
		}
	}
	if p.f != nil && p.f.fl.Shared != nil && p.f.denseSharedErr() == nil && p.live(true) {
		if err := p.f.runDense(p.common); err != nil {
			p.fail(true, stepShared, err)
		}
	}
}

// loaded records SRC's shared expert (nil: none, or it failed) and lets the
// replica jobs start; only the first call counts.
func (p *pair) loaded(m *refMLP) {
	p.once.Do(func() {
		p.sharedMLP = m
		close(p.ready)
	})
}

// drop is one of the shared job and the replica jobs done: the last one
// hands SRC's shared expert back.
func (p *pair) drop() {
	if p.holds.Add(-1) == 0 && p.sharedMLP != nil {
		p.sharedMLP.release()
	}
}
