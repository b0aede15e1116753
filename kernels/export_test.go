package kernels

import (
	"fmt"
	"slices"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/moe"
)

// GateBlockScorings are the scorings GateBlock and GateWarp implement
// (the rest are GateReg's alone).
func GateBlockScorings() []moe.Scoring { return slices.Clone(gateBlockScorings) }

// RouterKernel names the bf16 router kernel RouterGEMM runs for t tokens and
// e experts on dev (for test logs).
func RouterKernel(dev *cuda.Device, t, e int) string {
	return routerMMAConfig(t, e, isHopper(dev)).fn
}

// RouterKernels are the bf16 router kernels a timing test may name: the
// cluster kernels only on Hopper.
func RouterKernels(dev *cuda.Device) []string {
	out := []string{"router_mma_s", "router_mma_m", "router_mma_l"}
	if isHopper(dev) {
		for _, c := range routerClusters {
			out = append(out, c.fn)
		}
	}
	return out
}

// LaunchRouterKernelCtx queues bf16 router kernel fn (one of
// RouterKernels) of kernel family (router_gemm, or a variant build under
// another name) on the default stream from inside a Do closure, with
// RouterGEMM's grid and shared memory.
func LaunchRouterKernelCtx(cx *cuda.Ctx, family, fn string, x, w Mat, logits *cuda.Buffer[float32], t, h, e int) error {
	c := routerMMA{}
	for _, k := range append([]routerMMA{routerMMAConfig(1, e, false), routerMMAConfig(128, e, false),
		routerMMAConfig(4096, e, false)}, routerClusters...) {
		if k.fn == fn {
			c = k
		}
	}
	if c.fn == "" {
		return fmt.Errorf("no router kernel %q", fn)
	}
	m, err := LoadCtx(cx, family)
	if err != nil {
		return err
	}
	return m.LaunchCtx(cx, c.fn, c.grid(t, e), Block(c.threads), c.smem, 0, x.Ptr, w.Ptr, logits, int32(t), int32(e), int32(h))
}
