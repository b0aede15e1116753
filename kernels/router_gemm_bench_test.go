package kernels_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
)

// TestRouterGEMMTiming times every bf16 router kernel at DeepSeek-V3's shape
// (H 7168, 256 experts) when MOEPREP_ROUTER_BENCH=1, for choosing among
// them: the mean of back-to-back runs after a warm-up (no L2 flush, so
// small T runs from L2), with each kernel's max |d| against router_mma_l
// relative to the largest |logit|. A measurement, not a check (beyond
// the kernels' errors and unwritten logits). MOEPREP_ROUTER_BENCH_FAMILY
// names another build of router_gemm.cu to time (a <name>.fatbin in
// $MOEPREP_KERNELS_DIR, e.g. built with -DRC_STAGES=3).
func TestRouterGEMMTiming(t *testing.T) {
	dev := benchDevice(t, "MOEPREP_ROUTER_BENCH", "the router GEMM kernels")
	family := os.Getenv("MOEPREP_ROUTER_BENCH_FAMILY")
	if family == "" {
		family = "router_gemm"
	}
	const h, e, maxTok = 7168, 256, 4096
	r := rand.New(rand.NewPCG(3, 4))
	x := kernels.BF16Mat(toDevice(t, dev, toBF16(randn(r, maxTok*h, 1))))
	w := kernels.BF16Mat(toDevice(t, dev, toBF16(randn(r, e*h, 1/math.Sqrt(h)))))
	names := kernels.RouterKernels(dev)
	var tab strings.Builder
	fmt.Fprintf(&tab, "%5s %9s", "T", "picked")
	for _, n := range names {
		fmt.Fprintf(&tab, " %9s", strings.TrimPrefix(n, "router_mma_"))
	}
	worst := map[string]float64{}
	for _, tok := range []int{1, 16, 128, 256, 512, 768, 1024, 1536, 1792, 2048, 2560, 3072, 3584, 4096} {
		ref := poisoned(t, dev, tok*e)
		if err := dev.Do(func(c *cuda.Ctx) error {
			return kernels.LaunchRouterKernelCtx(c, family, "router_mma_l", x, w, ref, tok, h, e)
		}); err != nil {
			t.Fatal(err)
		}
		want := fromDevice(t, ref)
		scale := 0.0
		for _, v := range want {
			scale = max(scale, math.Abs(float64(v)))
		}
		fmt.Fprintf(&tab, "\n%5d %9s", tok, strings.TrimPrefix(kernels.RouterKernel(dev, tok, e), "router_mma_"))
		for _, n := range names {
			if n == "router_mma_s" && tok > 16 || n == "router_mma_l" && tok < 128 {
				fmt.Fprintf(&tab, " %9s", "-")
				continue
			}
			out := poisoned(t, dev, tok*e)
			us := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error {
				return kernels.LaunchRouterKernelCtx(c, family, n, x, w, out, tok, h, e)
			})
			for i, v := range fromDevice(t, out) {
				d := math.Abs(float64(v) - float64(want[i]))
				if !(d <= scale) { // NaN: unwritten
					t.Fatalf("%s T %d: logit %d = %v, router_mma_l %v", n, tok, i, v, want[i])
				}
				worst[n] = max(worst[n], d/scale)
			}
			fmt.Fprintf(&tab, " %9.1f", us)
		}
	}
	fmt.Fprintf(&tab, "\nmax |d| / max |logit| vs router_mma_l:")
	for _, n := range names {
		fmt.Fprintf(&tab, " %s %.1e", strings.TrimPrefix(n, "router_mma_"), worst[n])
	}
	t.Logf("%s: router GEMM us, H %d, E %d, %s:\n%s", family, h, e, dev, tab.String())
}
