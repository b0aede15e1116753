package moe

import (
	"context"
	"fmt"
	"math"

	"golang.org/x/sync/errgroup"

	"github.com/moeprep/moeprep/internal/blasdot"
	"github.com/moeprep/moeprep/internal/cores"
)

// Activation is an expert's gated activation act(g, u) beyond SwiGLU
// (layout.Activation, which a contract records, is one).
type Activation interface {
	// SwiGLU reports whether act is plain silu(g) * u.
	SwiGLU() bool
	// Apply is act(g, u) in float64.
	Apply(g, u float64) float64
}

// ClampedSwiGLU is the gated activation of gpt-oss and DeepSeek-V4 experts
// in float64, the one formula behind every Activation of that form:
//
//	act(g, u) = g' sigmoid(alpha g') (u' + upOffset),
//	g' = min(g, limit), u' = clamp(u, -limit, limit)
//
// with alpha 0 meaning 1 and limit 0 no clamp.
func ClampedSwiGLU(g, u, alpha, limit, upOffset float64) float64 {
	if alpha == 0 {
		alpha = 1
	}
	if limit > 0 {
		g = math.Min(g, limit)
		u = math.Max(-limit, math.Min(u, limit))
	}
	return g / (1 + math.Exp(-alpha*g)) * (u + upOffset)
}

// SwiGLUClampedAfter is Step-3.7's activation in float64: the limit caps
// the activated gate, not its input,
//
//	act(g, u) = min(g sigmoid(alpha g), limit) (clamp(u, -limit, limit) + upOffset)
//
// with alpha 0 meaning 1 and limit 0 no clamp.
func SwiGLUClampedAfter(g, u, alpha, limit, upOffset float64) float64 {
	if alpha == 0 {
		alpha = 1
	}
	a := g / (1 + math.Exp(-alpha*g))
	if limit > 0 {
		a = math.Min(a, limit)
		u = math.Max(-limit, math.Min(u, limit))
	}
	return a * (u + upOffset)
}

// GeluTanh is gelu with the tanh approximation in float64 (torch's
// gelu(approximate="tanh"), transformers' gelu_pytorch_tanh):
//
//	0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
//
// Gemma 4's experts run GeGLU, GeluTanh(g) * u.
func GeluTanh(g float64) float64 {
	return 0.5 * g * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(g+0.044715*g*g*g)))
}

// SiTU is Kimi K3's gated activation in float64: beta tanh(g/beta)
// sigmoid(g) times the up projection, itself linearBeta tanh(u/linearBeta)
// where linearBeta is not 0 (SGLang's and vLLM's SituAndMul).
func SiTU(g, u, beta, linearBeta float64) float64 {
	if linearBeta != 0 {
		u = linearBeta * math.Tanh(u/linearBeta)
	}
	return beta * math.Tanh(g/beta) / (1 + math.Exp(-g)) * u
}

// ReLU2 is relu(u)^2 in float64, the activation of Nemotron-H's ungated
// experts (transformers' relu2: square(relu(u))). For a float32 u the
// product is exact in float64, so rounding it to float32 gives torch's
// float32 square bit for bit.
func ReLU2(u float64) float64 {
	if u < 0 { // a NaN stays NaN, as torch's relu keeps it
		u = 0
	}
	return u * u
}

// Ungated is an Activation of experts without a gate projection
// (layout.Activation with GateNoneReLU2): act(g, u) reads u alone, and
// ExpertMats.Gate is nil.
type Ungated interface{ Ungated() bool }

// IsUngated reports whether act is an ungated activation.
func IsUngated(act Activation) bool {
	u, ok := act.(Ungated)
	return ok && u.Ungated()
}

// ExpertMats is one expert's weights dequantised to float32:
// E(x) = Down act(Gate x + GateBias, Up x + UpBias) + DownBias.
type ExpertMats struct {
	Gate, Up []float32 // [I,H]; Gate nil for an ungated Act
	Down     []float32 // [H,I]
	// GateW, UpW and DownW, where set, stand for Gate, Up and Down (then
	// nil): the same weights decoded a band of rows at a time.
	GateW, UpW, DownW Weight
	// GateBias, UpBias [I] and DownBias [H]: nil when the experts have none.
	GateBias, UpBias, DownBias []float32
	Act                        Activation // nil: SwiGLU
}

func (m *ExpertMats) check(h, inter int) error {
	// size is a projection's values: a banded one's are its loader's to check
	size := func(dense []float32, w Weight) int {
		if w != nil {
			return inter * h
		}
		return len(dense)
	}
	gate := size(m.Gate, m.GateW)
	if IsUngated(m.Act) {
		if m.Gate != nil || m.GateW != nil || m.GateBias != nil {
			return fmt.Errorf("an ungated expert holds gate weights")
		}
		gate = inter * h
	}
	if up, down := size(m.Up, m.UpW), size(m.Down, m.DownW); gate != inter*h || up != inter*h || down != h*inter {
		return fmt.Errorf("expert weights have %d/%d/%d values, want %d each (H %d, I %d)", gate, up, down, inter*h, h, inter)
	}
	return nil
}

// ExpertLoader returns expert e's weights. The grouped GEMM calls it once
// per expert that has tokens, from several goroutines at once.
type ExpertLoader func(ctx context.Context, e int) (*ExpertMats, error)

// silu(g) * u, in place into g: the SwiGLU activation every path shares.
func swiGLU(g, u []float32) {
	for i, v := range g {
		s := float64(v) / (1 + math.Exp(-float64(v)))
		g[i] = float32(s) * u[i]
	}
}

// Activate is act(g + gb, u + ub) in place into g, for rows of len(gb)
// (biases nil: none): SwiGLU (act nil or SwiGLU) with the sigmoid in
// float64 and the product in float32, any other activation in float64.
func Activate(act Activation, g, u, gb, ub []float32) {
	if gb != nil || ub != nil {
		AddRowBias(g, gb)
		AddRowBias(u, ub)
	}
	if act == nil || act.SwiGLU() {
		swiGLU(g, u)
		return
	}
	for i, v := range g {
		g[i] = float32(act.Apply(float64(v), float64(u[i])))
	}
}

// AddRowBias adds b to every row of m (rows of len(b)), each sum rounded
// to float32 as a biased linear layer does. A nil b adds nothing.
func AddRowBias(m, b []float32) {
	if b == nil {
		return
	}
	for i := range m {
		m[i] += b[i%len(b)]
	}
}

// Workers is the default number of experts in flight: each holds one
// expert's float32 weights (3*I*H*4 bytes, 176 MB at DeepSeek-V3 size), so
// memory stays bounded by Workers experts whatever the layer size.
func Workers() int { return max(1, min(cores.N(), 4)) }

// GEMMOptions are GroupedGEMM's settings; the zero value is the precise
// numerics with Workers() experts in flight.
type GEMMOptions struct {
	// Workers is how many experts are loaded and run at once (0: Workers()).
	Workers int
	// W8A8 is the block-FP8 serving numerics (actquant.go): the gathered
	// token rows are quantised to e4m3 per ActGroup channels before the
	// gate/up GEMM, and the activated intermediate is rounded to bf16 (the
	// intermediate cache engines keep) and quantised the same way before
	// the down GEMM. Each is multiplied as its dequantised float32 values.
	W8A8 bool
	// Release, when set, gets each loaded expert back once its blocks have
	// run (to recycle its buffers); the GEMM does not touch it after.
	Release func(*ExpertMats)
	// BankExperts, when positive, is the bank's size: blocks of experts
	// from there on are not the bank's (LongCat-Flash's zero-compute
	// experts, IdentityRows') and are left alone, as the kernels leave
	// another rank's.
	BankExperts int
}

// GroupedGEMM is the CPU twin of the fused MoE GEMM. For every block of the
// alignment it takes the block's expert, gathers the block's token rows of x
// [T,H] (slot s reads token s/slotsPerToken; padding entries are skipped, as
// the kernel masks them), computes act(X Gate^T, X Up^T) and then times
// Down^T, and writes each slot's output row: the result is [Numel,H],
// unweighted (Finalize applies the slot weights). Experts are loaded one at
// a time per worker; only experts with tokens are touched. Accumulation is
// float32 (internal/blasdot's SgemmNT), as on the GPU.
func GroupedGEMM(ctx context.Context, x []float32, t, h, inter, slotsPerToken int, al *Alignment, load ExpertLoader, o GEMMOptions) ([]float32, error) {
	if len(x) != t*h || int(al.Numel) != t*slotsPerToken {
		return nil, fmt.Errorf("grouped gemm: x has %d values for %dx%d, alignment %d slots for %d x %d", len(x), t, h, al.Numel, t, slotsPerToken)
	}
	workers := o.Workers
	if workers <= 0 {
		workers = Workers()
	}
	out := make([]float32, int(al.Numel)*h)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for _, j := range al.ExpertJobs() {
		if o.BankExperts > 0 && j.Expert >= o.BankExperts {
			continue
		}
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			m, err := load(gctx, j.Expert)
			if err != nil {
				return err
			}
			if err := j.Run(x, h, inter, slotsPerToken, al, m, out, o.W8A8); err != nil {
				return err
			}
			if o.Release != nil {
				o.Release(m)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// IdentityRows is the CPU twin of moe_identity_rows: every slot of the
// experts lo..hi-1 (LongCat-Flash's zero-compute experts, past the bank)
// gets its token's input row of x [T,H] as its output row of out
// [Numel,H], which Finalize then weights like any other.
func IdentityRows(x []float32, h, slotsPerToken int, al *Alignment, lo, hi int, out []float32) error {
	if len(out) != int(al.Numel)*h || len(x)*slotsPerToken != int(al.Numel)*h {
		return fmt.Errorf("identity rows: %d outputs, %d inputs for %d slots of %d a token x %d", len(out), len(x), al.Numel, slotsPerToken, h)
	}
	for _, j := range al.ExpertJobs() {
		if j.Expert < lo || j.Expert >= hi {
			continue
		}
		for b := j.First; b < j.Last; b++ {
			for _, s := range al.Block(b) {
				tok := int(s) / slotsPerToken
				copy(out[int(s)*h:(int(s)+1)*h], x[tok*h:(tok+1)*h])
			}
		}
	}
	return nil
}

// ExpertJob is one expert's share of a grouped GEMM: its blocks
// [First, Last) of the alignment, which are contiguous.
type ExpertJob struct{ Expert, First, Last int }

// ExpertJobs lists the experts that have blocks, in block order.
func (a *Alignment) ExpertJobs() []ExpertJob {
	var jobs []ExpertJob
	for b := 0; b < a.Blocks(); {
		e := int(a.ExpertIDs[b])
		end := b
		for end < a.Blocks() && int(a.ExpertIDs[end]) == e {
			end++
		}
		jobs = append(jobs, ExpertJob{e, b, end})
		b = end
	}
	return jobs
}

// Run computes the job's blocks with expert weights m into their slots'
// rows of out [Numel,H], as GroupedGEMM does; jobs of different experts
// write disjoint rows, so they may run at once. The blocks' rows go through
// the products together, one pass over each weight (each output row is
// what its block alone would give: blasdot's outputs depend on their rows
// alone).
func (j ExpertJob) Run(x []float32, h, inter, slotsPerToken int, al *Alignment, m *ExpertMats, out []float32, w8a8 bool) error {
	if err := m.check(h, inter); err != nil {
		return fmt.Errorf("expert %d: %w", j.Expert, err)
	}
	var slots []int32
	for b := j.First; b < j.Last; b++ {
		slots = append(slots, al.Block(b)...)
	}
	if err := expertRows(x, h, inter, slotsPerToken, slots, m, out, w8a8); err != nil {
		return fmt.Errorf("expert %d: %w", j.Expert, err)
	}
	return nil
}

// expertRows runs one expert on its slots (padding already left out): rows
// are slot indices, all of one expert. Each slot belongs to exactly one
// expert, so concurrent experts write disjoint rows of out.
func expertRows(x []float32, h, inter, slotsPerToken int, slots []int32, m *ExpertMats, out []float32, w8a8 bool) error {
	if len(slots) == 0 {
		return nil
	}
	return RunStages(newExpertStages(x, h, inter, slotsPerToken, slots, m, out, w8a8), bandsAtOnce())
}

// JobStages are job's work with expert weights m as Stages, for a caller
// that runs it beside another MLP (RunPaired); RunStages of them is Run.
func (j ExpertJob) Stages(x []float32, h, inter, slotsPerToken int, al *Alignment, m *ExpertMats, out []float32, w8a8 bool) (Stages, error) {
	if err := m.check(h, inter); err != nil {
		return nil, fmt.Errorf("expert %d: %w", j.Expert, err)
	}
	var slots []int32
	for b := j.First; b < j.Last; b++ {
		slots = append(slots, al.Block(b)...)
	}
	return newExpertStages(x, h, inter, slotsPerToken, slots, m, out, w8a8), nil
}

// expertStages is one expert on its slots: the gathered token rows xb,
// the gate and up products, and the down product ob that After copies to
// the slots' rows of out.
type expertStages struct {
	xb, gate, up, ob []float32
	rows, h, inter   int
	m                *ExpertMats
	slots            []int32
	out              []float32
	w8a8             bool
	xt, at           *blasdot.Tokens // xb and the activations packed, each released once its products are done
}

func newExpertStages(x []float32, h, inter, slotsPerToken int, slots []int32, m *ExpertMats, out []float32, w8a8 bool) *expertStages {
	rows := len(slots)
	s := &expertStages{rows: rows, h: h, inter: inter, m: m, slots: slots, out: out, w8a8: w8a8}
	s.xb = make([]float32, rows*h)
	for r, sl := range slots {
		tok := int(sl) / slotsPerToken
		copy(s.xb[r*h:(r+1)*h], x[tok*h:(tok+1)*h])
	}
	if w8a8 {
		RoundTripActGroups(s.xb, rows, h, ActGroup)
	}
	s.up = make([]float32, rows*inter)
	s.gate = s.up // act reads u alone; it is written in place
	if !IsUngated(m.Act) {
		s.gate = make([]float32, rows*inter)
	}
	s.ob = make([]float32, rows*h)
	return s
}

func (s *expertStages) Product(i int) (BandProduct, bool) {
	rows, h, inter := s.rows, s.h, s.inter
	gemm := func(a *blasdot.Tokens, k int, c []float32, ldc int) func(r0, r1 int, band []float32) {
		return func(r0, r1 int, band []float32) {
			a.SgemmNT(r1-r0, band, k, c[r0:], ldc)
		}
	}
	// The gate and up products take xb packed once; the down product its
	// activations, packed once gate and up are done (After has run).
	if i != StageDown && s.xt == nil {
		s.xt = blasdot.PackMatrix(rows, h, s.xb, h)
	}
	// Each names its tokens and outputs (rows of xb, gate, up, ob), so
	// that paired with SRC's expert it takes SRC's outputs where both
	// multiply the same bytes by the same tokens.
	row := func(m []float32, n int) func(i int) []float32 {
		return func(i int) []float32 { return m[i*n : (i+1)*n] }
	}
	switch i {
	case StageGate:
		if IsUngated(s.m.Act) {
			return BandProduct{}, false
		}
		return BandProduct{W: s.m.GateW, Dense: s.m.Gate, Rows: inter, Cols: h, F: gemm(s.xt, h, s.gate, inter), Tokens: rows, X: row(s.xb, h), Y: row(s.gate, inter)}, true
	case StageUp:
		return BandProduct{W: s.m.UpW, Dense: s.m.Up, Rows: inter, Cols: h, F: gemm(s.xt, h, s.up, inter), Tokens: rows, X: row(s.xb, h), Y: row(s.up, inter)}, true
	}
	s.at = blasdot.PackMatrix(rows, inter, s.gate, inter)
	return BandProduct{W: s.m.DownW, Dense: s.m.Down, Rows: h, Cols: inter, F: gemm(s.at, inter, s.ob, h), Tokens: rows, X: row(s.gate, inter), Y: row(s.ob, h)}, true
}

func (s *expertStages) After(i int) error {
	switch i {
	case StageUp:
		s.xt.Release() // the up product's bands are done: the buffer serves the next expert
		Activate(s.m.Act, s.gate, s.up, s.m.GateBias, s.m.UpBias)
		if s.w8a8 {
			RoundTripServing(s.gate, s.rows, s.inter)
		}
	case StageDown:
		s.at.Release()
		AddRowBias(s.ob, s.m.DownBias)
		for r, sl := range s.slots {
			copy(s.out[int(sl)*s.h:(int(sl)+1)*s.h], s.ob[r*s.h:(r+1)*s.h])
		}
	}
	return nil
}
