package kernels

import "testing"

// The single-launch align kernel's shared memory (woff [owners][E], cnt
// [E], cums [E+1], wsum [32], bad [1]) must stay within the 48 KiB a launch
// gets without opting in, for every expert count and size it accepts; and
// it must accept the shapes real models use.
func TestAlignSingleSharedMemory(t *testing.T) {
	for e := 1; e <= alignMaxExperts; e++ {
		for _, numel := range []int{1, 255, 256, 257, 4096 * 9, alignSingleMaxNumel} {
			if !AlignSingleFits(numel, e) {
				continue
			}
			owners := alignSingleOwners(numel, e)
			if owners < 1 || owners > 32 || owners*alignMaxSlotsPerOwner < numel {
				t.Fatalf("E=%d numel=%d: %d owners", e, numel, owners)
			}
			if b := 4 * (owners*e + 2*e + 34); b > 48<<10 {
				t.Fatalf("E=%d: %d owners need %d B of shared memory", e, owners, b)
			}
		}
	}
	for _, c := range []struct {
		numel, e int
		fits     bool
		owners   int
	}{
		{9, 264, true, 1},           // DeepSeek-V3 + 8 shared, T=1
		{16 * 9, 264, true, 1},      // T=16: one warp, its ids in registers
		{128 * 9, 264, true, 5},     // T=128
		{4096 * 9, 264, true, 32},   // T=4096
		{4096 * 9, 392, true, 29},   // Kimi-K2 + 8 shared: shared memory caps the owners
		{1 << 16, 512, false, 21},   // 21 owners cannot walk 65536 slots
		{40000, 512, true, 21},      // but can 40000
		{1<<16 + 1, 256, false, 32}, // too many slots
		{100, 6000, false, 0},       // too many experts
	} {
		if got := AlignSingleFits(c.numel, c.e); got != c.fits {
			t.Errorf("AlignSingleFits(%d, %d) = %v", c.numel, c.e, got)
		}
		if got := alignSingleOwners(c.numel, c.e); got != c.owners {
			t.Errorf("alignSingleOwners(%d, %d) = %d, want %d", c.numel, c.e, got, c.owners)
		}
	}
}
