package moelayer

import (
	"fmt"
	"math"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// Latent is a latent MoE layer's (Kimi K3's) transforms around its routed
// experts, as SGLang's KimiK3MoE and vLLM's KimiMoE compute them: the
// experts read In(x) = x Down^T (Down [L,H]); their weighted sum s [L]
// leaves through Out(s) = Up rmsnorm(s) (Up [H,L]; the RMSNorm of weight
// Norm and epsilon Eps where the layer has one). The router and the shared
// experts read x itself. Both paths of a check apply the same Latent (the
// same tensors from one checkpoint), so the routed experts they compare see
// the same input and their sums the same output transform.
type Latent struct {
	// Down, Norm and Up name the tensors in the checkpoint a path reads
	// them from (Norm "": none).
	Down, Norm, Up string
	H, L           int
	Eps            float64
}

// LatentOf is layer l's Latent under plan p; nil for a plan without one.
func LatentOf(p *family.Plan, l *family.Layer) (*Latent, error) {
	if p == nil || p.Latent == nil || l == nil {
		return nil, nil
	}
	lt := &Latent{Down: l.LatentDown, Norm: l.LatentNorm, Up: l.LatentUp, H: p.Latent.Hidden, L: p.HiddenSize, Eps: p.Latent.Eps}
	if lt.Down == "" || lt.Up == "" || (p.Latent.Norm && lt.Norm == "") {
		return nil, fmt.Errorf("layer %d: a latent MoE layer without its projections or norm planned", l.Key())
	}
	return lt, nil
}

// In is the routed experts' input for t rows of x [t,H]: [t,L], each value
// a float64 dot product rounded to float32.
func (lt *Latent) In(src tensorload.TensorSource, x []float32, t int) ([]float32, error) {
	if len(x) != t*lt.H {
		return nil, fmt.Errorf("latent down projection: x has %d values for %d tokens x %d", len(x), t, lt.H)
	}
	return linear(src, lt.Down, x, t, lt.H, lt.L)
}

// Out is the block's routed output for n rows of routed sums y [n,L]:
// [n,H], through the norm (Norm) and the up projection.
func (lt *Latent) Out(src tensorload.TensorSource, y []float32, n int) ([]float32, error) {
	in, err := lt.Normed(src, y, n)
	if err != nil {
		return nil, err
	}
	return linear(src, lt.Up, in, n, lt.L, lt.H)
}

// Normed is the up projection's input for n rows of routed sums y [n,L]:
// each row through the norm as the engines' RMSNorm computes it (the row
// times 1/sqrt(mean square + eps), rounded, times the weight, rounded),
// or y itself for a layer without one. The GPU paths run it on the host
// too (no kernel computes an RMSNorm), so every path normalises alike.
func (lt *Latent) Normed(src tensorload.TensorSource, y []float32, n int) ([]float32, error) {
	if len(y) != n*lt.L {
		return nil, fmt.Errorf("latent up projection: %d values for %d rows x %d", len(y), n, lt.L)
	}
	if lt.Norm == "" {
		return y, nil
	}
	g, err := tensorload.LoadVector(src, lt.Norm, lt.L)
	if err != nil {
		return nil, err
	}
	if !(lt.Eps > 0) || math.IsInf(lt.Eps, 0) {
		return nil, fmt.Errorf("latent norm %s: epsilon %g: want a positive number", lt.Norm, lt.Eps)
	}
	in := make([]float32, len(y))
	for i := range n {
		row := y[i*lt.L : (i+1)*lt.L]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		inv := float32(1 / math.Sqrt(ss/float64(lt.L)+lt.Eps))
		for j, v := range row {
			in[i*lt.L+j] = (v * inv) * g[j]
		}
	}
	return in, nil
}

// linear is x [t,in] times src's matrix name [out,in] transposed: [t,out],
// each value a float64 dot product rounded to float32. In and Out both
// project through it, so the down and up projections load and multiply alike.
func linear(src tensorload.TensorSource, name string, x []float32, t, in, out int) ([]float32, error) {
	w, err := tensorload.LoadMatrix(src, tensorload.MatrixRef{Name: name, Index: -1, Rows: out, Cols: in})
	if err != nil {
		return nil, err
	}
	defer tensorload.PutFloats(w)
	y := make([]float32, t*out)
	for i := range t {
		row := x[i*in : (i+1)*in]
		for o := range out {
			y[i*out+o] = float32(moe.Dot64(row, w[o*in:(o+1)*in]))
		}
	}
	return y, nil
}
