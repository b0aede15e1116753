package kernels

import "testing"

// TestRouterKernelChoice checks which bf16 router kernel runs at each token
// count, on Hopper and elsewhere (no GPU needed).
func TestRouterKernelChoice(t *testing.T) {
	cases := []struct {
		tok, e int
		hopper bool
		want   string
	}{
		{1, 256, true, "router_mma_s"},
		{16, 256, true, "router_mma_s"},
		{128, 256, true, "router_mma_m"},
		{routerClusterMinRows - 1, 256, true, "router_mma_m"},
		{routerClusterMinRows, 256, true, "router_mma_c64n256s8"},
		{896, 256, true, "router_mma_c64n256s8"}, // 112 CTAs
		{897, 256, true, "router_mma_c128n256s8"},
		{1024, 256, true, "router_mma_c128n256s8"},
		{1792, 256, true, "router_mma_c128n256s8"}, // 112 CTAs
		{1793, 256, true, "router_mma_c128n256s6"},
		{2048, 256, true, "router_mma_c128n256s6"}, // 96 CTAs
		{2049, 256, true, "router_mma_c128n256s4"},
		{3584, 256, true, "router_mma_c128n256s4"}, // 112 CTAs
		{3585, 256, true, "router_mma_c128n128s2"},
		{4096, 256, true, "router_mma_c128n128s2"}, // 128 CTAs in clusters of 2
		{65536, 256, true, "router_mma_c128n128s2"},
		{300, 264, true, "router_mma_c64n256s8"},   // 2 column tiles: 600 rows
		{2100, 264, true, "router_mma_c128n128s2"}, // 4200 rows
		{4096, 256, false, "router_mma_l"},         // elsewhere: unchanged
		{1024, 256, false, "router_mma_m"},
		{16, 256, false, "router_mma_s"},
	}
	for _, c := range cases {
		if got := routerMMAConfig(c.tok, c.e, c.hopper).fn; got != c.want {
			t.Errorf("T %d, E %d, hopper %v: %s, want %s", c.tok, c.e, c.hopper, got, c.want)
		}
	}
	// Grids: expert tiles x token tiles x the cluster's K split.
	for _, g := range []struct {
		tok, e int
		want   [3]uint32
	}{
		{4096, 256, [3]uint32{2, 32, 2}}, // c128n128s2: 128 CTAs
		{1024, 256, [3]uint32{1, 8, 8}},  // c128n256s8
		{300, 264, [3]uint32{2, 5, 8}},   // c64n256s8, a partial expert tile
		{4096, 256, [3]uint32{4, 64, 1}}, // elsewhere: router_mma_l 64 x 64
	} {
		hopper := g.want[2] > 1
		if got := routerMMAConfig(g.tok, g.e, hopper).grid(g.tok, g.e); got != g.want {
			t.Errorf("T %d, E %d, hopper %v: grid %v, want %v", g.tok, g.e, hopper, got, g.want)
		}
	}
	names := map[string]bool{}
	for _, c := range routerClusters {
		names[c.fn] = true
		if c.threads != 256 || c.smem != uint32(4*(c.m+c.n)*128) || c.smem > 227<<10 || c.split < 2 || c.split > 8 {
			t.Errorf("%s: %d threads, %d B shared, split %d: want RC_THREADS 256, 4 stages of (m + n) x 128 B within 227 KiB, 2..8 CTAs a cluster",
				c.fn, c.threads, c.smem, c.split)
		}
	}
	last := 0
	for _, p := range routerClusterPick {
		if !names[p.fn] || p.maxRows <= last {
			t.Errorf("pick %v: unknown kernel or rows not increasing", p)
		}
		last = p.maxRows
	}
}
