// A latent MoE layer (Kimi K3) on the GPU: the bank runs on the latent
// routed_expert_down_proj(x), the router on x, and the bank's sums leave
// through routed_expert_norm and routed_expert_up_proj before the shared
// experts, on x, are added.
//
// The two projections are dense GEMMs, small next to the bank (L x H each
// against E x 3 x I x L), and run on the router GEMM's f32 kernel, the one
// dense x . W^T the kernels have (f32 weights and f32 sums, as the router
// runs in validate). The norm has no kernel: the sums come back to the
// host, pass moelayer.Latent.Normed (the reference's own code) and go up
// again. The down projection's output comes back to the host too, once: it
// is the bank's input in the GEMM's activation type (the host converts it,
// as it converts every input) with the coverage's forced rows, already
// latent, after it.

package gpurun

import (
	"fmt"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// latentIn is the bank's input of a latent MoE layer whose block input is
// x (the routed tokens, H wide): lt.Down(x) on the device, then cov's
// forced rows (nil: none); its router reads x.
func (g *Runner) latentIn(src tensorload.TensorSource, lt *moelayer.Latent, x *Input, cov *moelayer.Coverage, fr *Frees) (*Input, error) {
	if x.h != lt.H {
		return nil, fmt.Errorf("latent down projection: x is %d wide, the layer's hidden state %d", x.h, lt.H)
	}
	xl, err := g.dense(src, lt.Down, x.x32, x.t, lt.H, lt.L, fr)
	if err != nil {
		return nil, err
	}
	rows, err := xl.ToHost(x.t * lt.L)
	if err != nil {
		return nil, err
	}
	if cov != nil {
		if len(cov.X) != cov.T*lt.L {
			return nil, fmt.Errorf("latent MoE: %d forced values for %d tokens x the latent %d", len(cov.X), cov.T, lt.L)
		}
		rows = append(rows, cov.X...)
	}
	in, err := g.Input(rows, len(rows)/lt.L, lt.L, fr)
	if err != nil {
		return nil, err
	}
	in.Tokens, in.r32, in.rh = x.Tokens, x.x32, lt.H
	return in, nil
}

// latentOut is the block's routed output [n,H] of the bank's sums y [n,L]
// on the device: lt.Normed on the host, then lt.Up on the device.
func (g *Runner) latentOut(src tensorload.TensorSource, lt *moelayer.Latent, y *cuda.Buffer[float32], n int, fr *Frees) (*cuda.Buffer[float32], error) {
	yh, err := y.ToHost(n * lt.L)
	if err != nil {
		return nil, err
	}
	normed, err := lt.Normed(src, yh, n)
	if err != nil {
		return nil, err
	}
	nd, err := toDevice(g, normed, fr)
	if err != nil {
		return nil, err
	}
	return g.dense(src, lt.Up, nd, n, lt.L, lt.H, fr)
}

// dense is x [t,in] . W^T on the device for src's matrix name W [out,in],
// uploaded as f32: [t,out] in f32, by the router GEMM's kernel.
func (g *Runner) dense(src tensorload.TensorSource, name string, x *cuda.Buffer[float32], t, in, out int, fr *Frees) (*cuda.Buffer[float32], error) {
	w, err := tensorload.LoadMatrix(src, tensorload.MatrixRef{Name: name, Index: -1, Rows: out, Cols: in})
	if err != nil {
		return nil, err
	}
	dw, err := toDevice(g, w, fr)
	tensorload.PutFloats(w)
	if err != nil {
		return nil, err
	}
	y, err := g.f32Buffer(t*out, fr)
	if err != nil {
		return nil, err
	}
	if err := g.lr.Router(kernels.F32Mat(x), kernels.F32Mat(dw), y, t, in, out); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return y, nil
}
