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
}

// TestAlignMatchesCPU checks every array of moe_align_block_size against
// validate.AlignBlockSize exactly, order inside each expert included.
func TestAlignMatchesCPU(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(7, 77))
	for _, c := range alignCases {
		t.Run(c.name, func(t *testing.T) {
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
			if err := kernels.AlignBlockSize(0, toDevice(t, dev, ids), a); err != nil {
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
		})
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
	a, err := kernels.NewAlignment(dev, len(ids), 64, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Free()
	if err := kernels.AlignBlockSize(0, toDevice(t, dev, ids), a); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Host(); err == nil || !strings.Contains(err.Error(), "slot 3") {
		t.Fatalf("out-of-range ids: got %v, want an error naming slot 3", err)
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

// TestAlignTiming logs moe_align_block_size's device time (3 launches).
func TestAlignTiming(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(1, 2))
	for _, tok := range []int{16, 128, 4096} {
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
		us := rtTimeUs(t, dev, 50, func(c *cuda.Ctx) error { return kernels.AlignBlockSizeCtx(c, 0, d, a) })
		t.Logf("align E=264 block 64 T=%d K=9: %.1f us (memset + 3 launches)", tok, us)
		a.Free()
	}
}
