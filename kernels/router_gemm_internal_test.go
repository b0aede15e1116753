package kernels

import "testing"

// TestRouterKernelChoice checks which bf16 router kernel runs at each token
// count, on Hopper (132 SMs) and elsewhere (no GPU needed).
func TestRouterKernelChoice(t *testing.T) {
	cases := []struct {
		tok, e int
		hopper bool
		want   string
	}{
		{1, 256, true, "router_mma_s"},
		{16, 256, true, "router_mma_s"},
		{128, 256, true, "router_mma_m"},
		{routerClusterMinTokens - 1, 256, true, "router_mma_m"},
		{routerClusterMinTokens, 256, true, "router_mma_c64s8"}, // 8 x 8 CTAs
		{1024, 256, true, "router_mma_c64s8"},                   // 16 x 8
		{2048, 256, true, "router_mma_c128s8"},                  // 16 x 8
		{4000, 256, true, "router_mma_c128s4"},                  // 32 x 4 (ties with c128s8, 2 waves of 32 x 8)
		{4096, 256, true, "router_mma_c128s4"},                  // 32 x 4
		{4200, 256, true, "router_mma_c64s8"},                   // 5 waves of 66 x 8 x 64 rows beat 2 of 33 x 4 x 128
		{2100, 264, true, "router_mma_c64s8"},                   // 2 x 33 x 8 = 528 CTAs: 5 waves of 64 rows / 8
		{8192, 256, true, "router_mma_c128s4"},                  // 2 waves
		{4096, 256, false, "router_mma_l"},                      // elsewhere: unchanged
		{1024, 256, false, "router_mma_m"},
		{16, 256, false, "router_mma_s"},
	}
	for _, c := range cases {
		if got := routerMMAConfig(c.tok, c.e, c.hopper, 132).fn; got != c.want {
			t.Errorf("T %d, E %d, hopper %v: %s, want %s", c.tok, c.e, c.hopper, got, c.want)
		}
	}
	for _, c := range routerClusters {
		if c.threads != 256 || c.n != 256 || c.smem != uint32(4*(c.m+256)*128) || c.smem > 227<<10 {
			t.Errorf("%s: %d threads, n %d, %d B shared: want RC_THREADS 256, RC_BN 256, 4 stages of (m + 256) x 128 B within 227 KiB",
				c.fn, c.threads, c.n, c.smem)
		}
	}
}
