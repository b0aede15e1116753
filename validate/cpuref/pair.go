package cpuref

import (
	"context"
	"fmt"
	"sync"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/cores"
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
	// Paired runs each routed expert's two paths band by band together
	// (moe.RunPaired), every band of the products at once on the job's
	// cores: SRC's and DST's bytes of an expert are then read in the same
	// order, so a stream that cuts the expert into parts (each of DST's
	// rows with the SRC rows they copy) can let each part go once both
	// paths are past it, instead of holding the whole expert.
	Paired bool
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
// reaches it and lets their bytes go, so each expert's bytes are held once
// while both paths need them (each path decodes them a band of rows at a
// time), and the jobs go in the order a stream reads the layer: the shared
// expert with DST's replicas of it first, then the routed experts. The
// reference is ReferenceLayer's bit for bit, and so is the error: a failing
// reference is reported before anything of the fused path, as when the two
// ran one after the other. The fused path is FusedLayerRun's bit for bit
// (each expert is computed as it computes it, and the sums run in slot
// order after all of them) except, with Paired, where an expert's product
// is the same on both sides (DST's rows hold SRC's bytes and both multiply
// them by the same tokens): that product is computed once, by the
// reference's sums, and the fused path takes its outputs. Multiplying the
// same bytes by the same tokens again would only round differently. So
// where DST's routed expert holds SRC's codes with routed_scaling_factor
// folded into its float32 scales, as the contract says (moe.ScaledRows):
// the fused path takes the reference's product times the factor, which
// is its own product to within a few u. The path's own arithmetic still
// runs wherever DST's bytes or tokens differ otherwise (a requantised
// weight, w8a8's quantised tokens, a fold into bf16 weights).
func PairLayer(ctx context.Context, src tensorload.TensorSource, plan *family.Plan, layer *family.Layer, dst tensorload.TensorSource, fl *moelayer.FusedLayer, x []float32, t int, o PairOptions) (*moelayer.RefResult, *moelayer.FusedResult, error) {
	r, err := newRefLayer(src, plan, layer, x, t, RefOptions{Tokens: o.Tokens, Coverage: o.Coverage, Workers: o.Workers, RequantShared: o.RequantShared, RouterInput: o.RouterInput})
	if err != nil {
		return nil, nil, &SideError{Err: err}
	}
	p := &pair{r: r, dst: dst, release: o.Release, bankSize: fl.Contract.BankSize(), let1: map[int]bool{}, paired: o.Paired}
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
	mu       sync.Mutex
	let1     map[int]bool // bank experts let go
	errs     [2]error
	errStep  [2]int
	paired   bool // PairOptions.Paired
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
	start := func(job func(), ids ...int) {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			defer p.let(ids...)
			if ctx.Err() == nil && p.live(false) {
				job()
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
	if r.layer.Shared != nil || (p.f != nil && p.f.fl.Shared != nil) {
		start(func() { p.shared(ctx) })
	}
	for _, id := range replicas {
		start(func() { p.bank(ctx, id) }, id)
	}
	for id := range r.e {
		if _, ok := p.jobs[id]; ok || r.uses(id) {
			start(func() { p.expert(ctx, id) }, id)
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
func (p *pair) expert(ctx context.Context, id int) {
	if p.paired {
		p.expertPaired(ctx, id)
		return
	}
	var m *refMLP
	if p.r.uses(id) {
		var err error
		if m, err = p.r.loadExpert(id); err != nil {
			p.fail(false, stepExperts, err)
			return
		}
		defer m.release()
	}
	p.bank(ctx, id)
	if m != nil {
		if err := p.r.runExpert(id, m); err != nil {
			p.fail(false, stepExperts, err)
		}
	}
}

// bank runs DST's bank expert id on its blocks, where it has any.
func (p *pair) bank(ctx context.Context, id int) {
	j, ok := p.jobs[id]
	if !ok || !p.live(true) {
		return
	}
	f := p.f
	m, err := fusedLoader(f.fl, p.dst, f.h, f.inter, f.wf)(ctx, id)
	if err != nil {
		p.fail(true, stepExperts, err)
		return
	}
	defer tensorload.ReleaseExpert(m)
	if err := f.runJob(j, m); err != nil {
		p.fail(true, stepExperts, err)
	}
}

// shared is the shared expert's job: SRC's shared expert over every token
// and DST's unfused one.
func (p *pair) shared(ctx context.Context) {
	r := p.r
	if r.layer.Shared != nil {
		m, err := r.loadShared()
		if err != nil {
			p.fail(false, stepShared, err)
			return
		}
		err = r.runSharedWith(ctx, m)
		m.release()
		if err != nil {
			p.fail(false, stepShared, err)
			return
		}
	}
	if p.f != nil && p.f.fl.Shared != nil && p.f.denseSharedErr() == nil && p.live(true) {
		if err := p.f.runDense(); err != nil {
			p.fail(true, stepShared, err)
		}
	}
}

// expertPaired is expert, the two paths' products run band by band
// together on every core the jobs leave (the outputs are expert's: a
// band's outputs are its rows' alone).
func (p *pair) expertPaired(ctx context.Context, id int) {
	var ref, fused moe.Stages
	if p.r.uses(id) {
		m, err := p.r.loadExpert(id)
		if err != nil {
			p.fail(false, stepExperts, err)
			return
		}
		defer m.release()
		ref = m.stages(p.r.expertRows(id))
	}
	if j, ok := p.jobs[id]; ok && p.live(true) {
		f := p.f
		m, err := fusedLoader(f.fl, p.dst, f.h, f.inter, f.wf)(ctx, id)
		if err == nil {
			defer tensorload.ReleaseExpert(m)
			fused, err = j.Stages(f.gx, f.h, f.inter, f.gk, f.al, m, f.out, false)
		}
		if err != nil {
			p.fail(true, stepExperts, err)
		}
	}
	par := max(1, cores.N()/p.r.workers) // the cores the jobs leave
	var errRef, errFused error
	switch {
	case ref != nil && fused != nil:
		errRef, errFused = moe.RunPaired(ref, fused, par)
	case ref != nil:
		errRef = moe.RunStages(ref, par)
	case fused != nil:
		errFused = moe.RunStages(fused, par)
	}
	if errFused != nil {
		p.fail(true, stepExperts, fmt.Errorf("expert %d: %w", id, errFused))
	}
	if errRef != nil {
		p.fail(false, stepExperts, p.r.expertErr(id, errRef))
	}
}
