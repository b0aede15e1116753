package kernels_test

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/validate"
)

type alignCase struct {
	name            string
	numel, e, block int
	ids             func(r *rand.Rand, i int) int32 // nil: uniform
}

var alignCases = []alignCase{
	{name: "T=1 top-8+1 over 264, block 64", numel: 9, e: 264, block: 64},
	{name: "T=37 K=9 over 264, block 16", numel: 37 * 9, e: 264, block: 16},
	{name: "777 slots (not a multiple of the chunk) over 384, block 64", numel: 777, e: 384, block: 64},
	{name: "T=4096 K=9 over 264, block 64", numel: 4096 * 9, e: 264, block: 64},
	{name: "T=4096 K=8 over 256, block 128", numel: 4096 * 8, e: 256, block: 128},
	{name: "block size 1", numel: 1000, e: 60, block: 1},
	{name: "one expert", numel: 300, e: 1, block: 16},
	{name: "all slots on one expert of 392", numel: 2000, e: 392, block: 64, ids: func(*rand.Rand, int) int32 { return 391 }},
	{name: "only even experts have tokens", numel: 5000, e: 264, block: 32, ids: func(r *rand.Rand, _ int) int32 { return int32(2 * r.IntN(132)) }},
	{name: "skewed: most slots on expert 0", numel: 3000, e: 384, block: 64, ids: func(r *rand.Rand, _ int) int32 {
		if r.IntN(4) > 0 {
			return 0
		}
		return int32(r.IntN(384))
	}},
	{name: "3000 experts (more than the scan's threads)", numel: 20000, e: 3000, block: 16},
	{name: "65536 slots (the single kernel's limit) over 256", numel: 1 << 16, e: 256, block: 64},
	{name: "40000 slots over 512 (21 owner warps)", numel: 40000, e: 512, block: 64},
	{name: "2000 experts (the single kernel with 4 warps)", numel: 5000, e: 2000, block: 16},
	{name: "65537 slots (past the single kernel's limit)", numel: 1<<16 + 1, e: 256, block: 64},
}

// TestAlignMatchesCPU checks every array of moe_align_block_size against
// validate.AlignBlockSize exactly, order inside each expert included.
func TestAlignMatchesCPU(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(7, 77))
	for _, c := range alignCases {
		for _, variant := range []string{kernels.AlignSingle, kernels.AlignMulti} {
			if variant == kernels.AlignSingle && !kernels.AlignSingleFits(c.numel, c.e) {
				continue
			}
			t.Run(variant+"/"+c.name, func(t *testing.T) { testAlignCase(t, dev, r, c, variant) })
		}
	}
}

func testAlignCase(t *testing.T, dev *cuda.Device, r *rand.Rand, c alignCase, variant string) {
	ids := make([]int32, c.numel)
	for i := range ids {
		if c.ids != nil {
			ids[i] = c.ids(r, i)
		} else {
			ids[i] = int32(r.IntN(c.e))
		}
	}
	want, err := validate.AlignBlockSize(ids, c.e, c.block)
	if err != nil {
		t.Fatal(err)
	}
	a, err := kernels.NewAlignment(dev, c.numel, c.e, c.block)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Free()
	for _, b := range []interface{ Fill(int32) error }{a.SortedTokenIDs, a.ExpertIDs, a.Counts, a.Cumsum, a.Total} {
		if err := b.Fill(-5); err != nil {
			t.Fatal(err)
		}
	}
	d := toDevice(t, dev, ids)
	if err := dev.Do(func(cx *cuda.Ctx) error { return kernels.AlignVariantCtx(cx, variant, 0, d, a) }); err != nil {
		t.Fatal(err)
	}
	got, err := a.Host()
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case got.TotalPadded != want.TotalPadded:
		t.Fatalf("total %d, twin %d", got.TotalPadded, want.TotalPadded)
	case !slices.Equal(got.Counts, want.Counts):
		t.Fatalf("counts differ:\n%v\n%v", got.Counts, want.Counts)
	case !slices.Equal(got.Cumsum, want.Cumsum):
		t.Fatalf("cumsum differs:\n%v\n%v", got.Cumsum, want.Cumsum)
	case !slices.Equal(got.ExpertIDs, want.ExpertIDs):
		t.Fatalf("expert ids differ")
	}
	if i := firstDiff(got.SortedTokenIDs, want.SortedTokenIDs); i >= 0 {
		t.Fatalf("sorted_token_ids differ first at %d: %d, twin %d", i, got.SortedTokenIDs[i], want.SortedTokenIDs[i])
	}
}

func firstDiff(a, b []int32) int {
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func TestAlignRejectsBadIDs(t *testing.T) {
	dev := testDevice(t)
	ids := []int32{1, 2, 3, 64, 5, -1}
	for _, variant := range []string{kernels.AlignSingle, kernels.AlignMulti} {
		a, err := kernels.NewAlignment(dev, len(ids), 64, 16)
		if err != nil {
			t.Fatal(err)
		}
		d := toDevice(t, dev, ids)
		// Twice: the second call must report the bad slot again (the
		// single-launch kernel writes its status without a memset).
		for range 2 {
			if err := dev.Do(func(cx *cuda.Ctx) error { return kernels.AlignVariantCtx(cx, variant, 0, d, a) }); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Host(); err == nil || !strings.Contains(err.Error(), "slot 3") {
				t.Fatalf("%s: out-of-range ids: got %v, want an error naming slot 3", variant, err)
			}
		}
		// and good ids afterwards pass: the status is rewritten, not sticky.
		good := toDevice(t, dev, []int32{1, 2, 3, 4, 5, 6})
		if err := dev.Do(func(cx *cuda.Ctx) error { return kernels.AlignVariantCtx(cx, variant, 0, good, a) }); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Host(); err != nil {
			t.Fatalf("%s: good ids after bad ones: %v", variant, err)
		}
		a.Free()
	}
}

func TestNewAlignmentChecks(t *testing.T) {
	for _, c := range [][3]int{{0, 8, 16}, {8, 0, 16}, {8, 8, 0}, {8, 1 << 20, 16}, {1 << 30, 1 << 10, 1 << 10}} {
		if _, err := kernels.NewAlignment(nil, c[0], c[1], c[2]); err == nil {
			t.Errorf("NewAlignment%v accepted", c)
		}
	}
}

// TestGateThenAlign chains the two kernels on the device, as the fused
// path does, and compares with the CPU chain.
func TestGateThenAlign(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(3, 33))
	c := gateCases[4] // 264 experts, shared slots
	c.t = 513
	logits, bias := gateInputs(r, c)
	routing, err := validate.Route(routeSpec(c.spec), logits, bias, c.t)
	if err != nil {
		t.Fatal(err)
	}
	slots, err := validate.FusedSlots(routing, contractFor(c.spec))
	if err != nil {
		t.Fatal(err)
	}
	bank := c.spec.NumExperts + c.spec.SharedSlots*c.spec.SharedReplicas
	want, err := validate.AlignBlockSize(slots.IDs, bank, 64)
	if err != nil {
		t.Fatal(err)
	}
	out, err := kernels.NewGateOut(dev, c.spec, c.t, false)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Free()
	if err := kernels.Gate(0, c.spec, c.t, toDevice(t, dev, logits), toDevice(t, dev, bias), out); err != nil {
		t.Fatal(err)
	}
	a, err := kernels.NewAlignment(dev, c.t*out.K, bank, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Free()
	if err := kernels.AlignBlockSize(0, out.IDs, a); err != nil {
		t.Fatal(err)
	}
	got, err := a.Host()
	if err != nil {
		t.Fatal(err)
	}
	if got.TotalPadded != want.TotalPadded || !slices.Equal(got.SortedTokenIDs, want.SortedTokenIDs) || !slices.Equal(got.ExpertIDs, want.ExpertIDs) {
		t.Fatalf("gate+align chain differs from the CPU chain (total %d vs %d)", got.TotalPadded, want.TotalPadded)
	}
}

// TestAlignTiming logs moe_align_block_size's device time, both variants.
func TestAlignTiming(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(1, 2))
	for _, tok := range []int{16, 128, 1024, 4096} {
		numel := tok * 9
		ids := make([]int32, numel)
		for i := range ids {
			ids[i] = int32(r.IntN(264))
		}
		d := toDevice(t, dev, ids)
		a, err := kernels.NewAlignment(dev, numel, 264, 64)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{kernels.AlignSingle, kernels.AlignMulti} {
			us := rtTimeUs(t, dev, 50, func(c *cuda.Ctx) error { return kernels.AlignVariantCtx(c, v, 0, d, a) })
			t.Logf("align %s E=264 block 64 T=%d K=9: %.1f us", v, tok, us)
		}
		a.Free()
	}
}
