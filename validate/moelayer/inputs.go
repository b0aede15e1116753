package moelayer

import (
	"fmt"
	"math"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// InputPrep is how a layer with two inputs (Gemma 4) derives them from
// its input x, the residual stream: the router reads rmsnorm(x) *
// RouterScale * H^-1/2, the experts (and any shared MLP) rmsnorm(x) *
// ExpertNorm, both RMSNorms with Eps. The zero value is a layer whose
// router and experts both read x.
type InputPrep struct {
	RouterScale, ExpertNorm string // [H] each; "" for none
	Eps                     float64
}

// PrepOf is a planned layer's InputPrep.
func PrepOf(p *family.Plan, l *family.Layer) InputPrep {
	return InputPrep{RouterScale: l.RouterInputScale, ExpertNorm: l.ExpertInputNorm, Eps: p.InputNormEps}
}

// None reports whether the router and the experts read x as it is.
func (p InputPrep) None() bool { return p.RouterScale == "" && p.ExpertNorm == "" }

// Inputs are the experts' and the router's inputs for t rows of x [t,h]:
// x itself and nil (the router reads the experts' input) for a layer
// without an InputPrep. As Gemma4RMSNorm computes them in float32: each
// row's mean square (here accumulated in float64) plus eps, to the power
// -1/2, times the row, rounded; then times the weight, rounded (the
// experts'), or times the router's scale and H^-1/2, each product
// rounded (the router's).
func (p InputPrep) Inputs(src tensorload.TensorSource, x []float32, t, h int) (xe, xr []float32, err error) {
	if p.None() {
		return x, nil, nil
	}
	if p.RouterScale == "" || p.ExpertNorm == "" {
		return nil, nil, fmt.Errorf("a layer with two inputs needs both the router's input scale and the experts' input norm (have %q, %q)", p.RouterScale, p.ExpertNorm)
	}
	if !(p.Eps > 0) || math.IsInf(p.Eps, 0) {
		return nil, nil, fmt.Errorf("input norms: epsilon %g: want a positive number", p.Eps)
	}
	if len(x) != t*h {
		return nil, nil, fmt.Errorf("input norms: x has %d values for %d tokens x %d", len(x), t, h)
	}
	rs, err := tensorload.LoadVector(src, p.RouterScale, h)
	if err != nil {
		return nil, nil, err
	}
	en, err := tensorload.LoadVector(src, p.ExpertNorm, h)
	if err != nil {
		return nil, nil, err
	}
	root := float32(math.Pow(float64(h), -0.5))
	eps := float32(p.Eps)
	xe, xr = make([]float32, t*h), make([]float32, t*h)
	for i := range t {
		row := x[i*h : (i+1)*h]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		ms := float32(ss/float64(h)) + eps
		inv := float32(1 / math.Sqrt(float64(ms)))
		for j, v := range row {
			n := v * inv
			xe[i*h+j] = n * en[j]
			xr[i*h+j] = (n * rs[j]) * root
		}
	}
	return xe, xr, nil
}

// Prepare is Inputs for x's t rows and for cov's forced rows (nil: none),
// which stand for tokens of the residual stream too: the experts' input,
// the router's (nil: x's) and cov with its rows the experts' input.
func (p InputPrep) Prepare(src tensorload.TensorSource, x []float32, t, h int, cov *Coverage) (xe, xr []float32, c *Coverage, err error) {
	if xe, xr, err = p.Inputs(src, x, t, h); err != nil || p.None() || cov == nil {
		return xe, xr, cov, err
	}
	if len(cov.X) != cov.T*h {
		return nil, nil, nil, fmt.Errorf("coverage: %d values for %d forced tokens x %d", len(cov.X), cov.T, h)
	}
	cx, _, err := p.Inputs(src, cov.X, cov.T, h)
	if err != nil {
		return nil, nil, nil, err
	}
	c2 := *cov
	c2.X = cx
	return xe, xr, &c2, nil
}

// ExpertScales reads the router's per-expert scale (Gemma 4's
// per_expert_scale) of e values; nil when the router has none.
func ExpertScales(src tensorload.TensorSource, rr RouterRef, e int) ([]float32, error) {
	if rr.ExpertScale == "" {
		return nil, nil
	}
	return tensorload.LoadVector(src, rr.ExpertScale, e) // finite: every read is checked (tensorbytes.CheckFinite)
}

// ScaleByExpert applies the router's per-expert scale to r's weights.
func ScaleByExpert(src tensorload.TensorSource, rr RouterRef, r *moe.Routing, e int) error {
	s, err := ExpertScales(src, rr, e)
	if err != nil || s == nil {
		return err
	}
	return moe.ScaleByExpert(r, s)
}
