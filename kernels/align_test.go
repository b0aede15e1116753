package kernels_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/moe"
)

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
			_, err := a.Host()
			testkit.ErrorContains(t, err, "slot 3", variant+": out-of-range ids")
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
// path does, and compares with the CPU chain (moe.Route, moe.FusedSlots,
// moe.AlignBlockSize) array by array.
func TestGateThenAlign(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(3, 33))
	spec := kernels.GateSpec{
		RouteSpec: moe.RouteSpec{Scoring: moe.Sigmoid, NumExperts: 264, TopK: 8, NGroup: 8, TopKGroup: 3, NormTopKProb: true, RoutedScalingFactor: 2.5},
		Shared:    moe.SharedSlots{PerToken: 2, Replicas: 3, Weight: 0.4},
	}
	const tok = 513
	logits, bias := gateInputs(r, spec, tok)
	routing, err := moe.Route(spec.RouteSpec, logits, bias, tok)
	if err != nil {
		t.Fatal(err)
	}
	slots, err := moe.FusedSlots(routing, spec.NumExperts, spec.Shared, 1)
	if err != nil {
		t.Fatal(err)
	}
	bank := spec.NumExperts + spec.Shared.PerToken*spec.Shared.Replicas
	want, err := moe.AlignBlockSize(slots.IDs, bank, 64)
	if err != nil {
		t.Fatal(err)
	}
	out, err := kernels.NewGateOut(dev, spec, tok, false)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Free()
	if err := kernels.Gate(0, spec, tok, toDevice(t, dev, logits), toDevice(t, dev, bias), out); err != nil {
		t.Fatal(err)
	}
	a, err := kernels.NewAlignment(dev, tok*out.K, bank, 64)
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
