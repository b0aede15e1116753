package moetest

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/moe"
)

// Aligner is moe_align_block_size under test: it groups the slots of ids
// ([T,K] flattened) by expert, numExperts = routed + fused shared experts.
type Aligner interface {
	Align(ids []int32, numExperts, blockSize int) (*moe.Alignment, error)
}

// alignTest is one row of TestAlign's table: ids drawn uniformly over e
// experts unless ids draws them, or given by hand with the arrays they give.
type alignTest struct {
	name            string
	numel, e, block int
	draw            func(r *rand.Rand) int32
	hand            []int32
	want            *moe.Alignment // hand-worked arrays
}

var alignTests = []alignTest{
	// T=3 tokens x K=2 over 4 experts, block 2; the sentinel is numel = 6.
	{name: "hand: 3 tokens x 2 over 4 experts, block 2", e: 4, block: 2, hand: []int32{2, 0, 2, 1, 0, 2}, want: &moe.Alignment{
		NumExperts: 4, BlockSize: 2, Numel: 6, TotalPadded: 8,
		Counts: []int32{2, 1, 3, 0}, Cumsum: []int32{0, 2, 4, 8, 8},
		SortedTokenIDs: []int32{1, 4, 3, 6, 0, 2, 5, 6}, ExpertIDs: []int32{0, 1, 2, 2}}},
	{name: "T=1 K=1", e: 4, block: 64, hand: []int32{3}},
	{name: "T=1 top-8 + a shared slot over 257", e: 257, block: 64, hand: []int32{0, 5, 9, 12, 100, 200, 255, 256}},
	{name: "all on one expert, not a block multiple", e: 8, block: 4, hand: []int32{7, 7, 7, 7, 7}},
	{name: "an exact block multiple", e: 2, block: 4, hand: []int32{1, 1, 1, 1}},
	{name: "block size 1", e: 3, block: 1, hand: []int32{2, 0, 2}},
	{name: "no slots", e: 4, block: 64, hand: []int32{}},
	{name: "T=1 top-8+1 over 264, block 64", numel: 9, e: 264, block: 64},
	{name: "T=37 K=9 over 264, block 16", numel: 37 * 9, e: 264, block: 16},
	{name: "T=128 K=9 over 264, block 64", numel: 128 * 9, e: 264, block: 64},
	{name: "384 experts, few tokens", numel: 3 * 8, e: 384, block: 16},
	{name: "777 slots over 384, block 64", numel: 777, e: 384, block: 64},
	{name: "T=4096 K=9 over 264, block 64", numel: 4096 * 9, e: 264, block: 64},
	{name: "T=4096 K=8 over 256, block 128", numel: 4096 * 8, e: 256, block: 128},
	{name: "1000 slots over 60, block 1", numel: 1000, e: 60, block: 1},
	{name: "one expert", numel: 300, e: 1, block: 16},
	{name: "every slot on the last of 392", numel: 2000, e: 392, block: 64, draw: func(*rand.Rand) int32 { return 391 }},
	{name: "only even experts have slots", numel: 5000, e: 264, block: 32, draw: func(r *rand.Rand) int32 { return int32(2 * r.IntN(132)) }},
	{name: "skewed: most slots on expert 0", numel: 3000, e: 384, block: 64, draw: func(r *rand.Rand) int32 {
		if r.IntN(4) > 0 {
			return 0
		}
		return int32(r.IntN(384))
	}},
	{name: "3000 experts", numel: 20000, e: 3000, block: 16},
	{name: "2000 experts, block 16", numel: 5000, e: 2000, block: 16},
	{name: "40000 slots over 512", numel: 40000, e: 512, block: 64},
	{name: "65536 slots over 256", numel: 1 << 16, e: 256, block: 64},
	{name: "65537 slots over 256", numel: 1<<16 + 1, e: 256, block: 64},
}

// alignRefusals are inputs every Aligner must refuse.
var alignRefusals = []struct {
	name         string
	ids          []int32
	experts, blk int
}{
	{"an id past the experts", []int32{1, 2, 3, 64, 5, 6}, 64, 16},
	{"a negative id", []int32{1, -1, 3}, 64, 16},
	{"block size 0", []int32{0}, 4, 0},
	{"no experts", []int32{0}, 0, 16},
}

// TestAlign checks every array of a's alignments against its definition
// (moe.Alignment's doc), exactly: counts, padded exclusive prefix sums,
// each expert's slots in ascending order followed by sentinel padding, the
// expert of every block; hand-worked arrays where the row has them.
func TestAlign(t *testing.T, a Aligner) {
	runCases(t, len(alignTests), func(i int) string { return alignTests[i].name }, func(t *testing.T, i int) {
		c := alignTests[i]
		ids := c.hand
		if ids == nil {
			r := caseRand(29, i)
			ids = make([]int32, c.numel)
			for j := range ids {
				if c.draw != nil {
					ids[j] = c.draw(r)
				} else {
					ids[j] = int32(r.IntN(c.e))
				}
			}
		}
		got, err := a.Align(slices.Clone(ids), c.e, c.block)
		if skipped(t, err) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		checkAlignment(t, ids, c.e, c.block, got)
		if w := c.want; w != nil {
			if !slices.Equal(got.Counts, w.Counts) || !slices.Equal(got.Cumsum, w.Cumsum) || !slices.Equal(got.SortedTokenIDs, w.SortedTokenIDs) ||
				!slices.Equal(got.ExpertIDs, w.ExpertIDs) || got.TotalPadded != w.TotalPadded {
				t.Errorf("got %+v, worked by hand %+v", got, w)
			}
		}
	})
	for _, bad := range alignRefusals {
		t.Run("refuses "+bad.name, func(t *testing.T) {
			if _, err := a.Align(bad.ids, bad.experts, bad.blk); err == nil || errors.Is(err, ErrUnsupported) {
				t.Errorf("ids %v over %d experts, block %d: not refused (error %v)", bad.ids, bad.experts, bad.blk, err)
			}
		})
	}
}

// checkAlignment holds a to the definition, in one pass over the slots.
func checkAlignment(t *testing.T, ids []int32, e, block int, a *moe.Alignment) {
	t.Helper()
	numel := int32(len(ids))
	bs := int32(block)
	if a.NumExperts != e || a.BlockSize != block || a.Numel != numel {
		t.Fatalf("experts %d block %d numel %d, want %d %d %d", a.NumExperts, a.BlockSize, a.Numel, e, block, numel)
	}
	if len(a.Counts) != e || len(a.Cumsum) != e+1 {
		t.Fatalf("%d counts and %d prefix sums for %d experts", len(a.Counts), len(a.Cumsum), e)
	}
	// The definition, built naively: each expert's slots in ascending order.
	slots := make([][]int32, e)
	for s, id := range ids {
		slots[id] = append(slots[id], int32(s))
	}
	var total int32
	for x := range e {
		n := int32(len(slots[x]))
		padded := (n + bs - 1) / bs * bs
		if a.Counts[x] != n || a.Cumsum[x] != total {
			t.Fatalf("expert %d: count %d from %d, want %d from %d", x, a.Counts[x], a.Cumsum[x], n, total)
		}
		total += padded
	}
	if a.Cumsum[e] != total || a.TotalPadded != total || len(a.SortedTokenIDs) != int(total) || len(a.ExpertIDs) != int(total/bs) {
		t.Fatalf("total %d (prefix sum %d), %d sorted ids, %d blocks; want %d, %d blocks", a.TotalPadded, a.Cumsum[e], len(a.SortedTokenIDs), len(a.ExpertIDs), total, total/bs)
	}
	if int(total) > moe.MaxPaddedTokens(len(ids), e, block) {
		t.Fatalf("total %d over the worst case %d", total, moe.MaxPaddedTokens(len(ids), e, block))
	}
	for x := range e {
		lo, hi := a.Cumsum[x], a.Cumsum[x+1]
		n := int32(len(slots[x]))
		if got := a.SortedTokenIDs[lo : lo+n]; !slices.Equal(got, slots[x]) {
			t.Fatalf("expert %d holds slots %v, want %v", x, got, slots[x])
		}
		for j, s := range a.SortedTokenIDs[lo+n : hi] {
			if s != numel {
				t.Fatalf("expert %d padding %d holds %d, want the sentinel %d", x, j, s, numel)
			}
		}
		for b := lo / bs; b < hi/bs; b++ {
			if a.ExpertIDs[b] != int32(x) {
				t.Fatalf("block %d belongs to expert %d, want %d", b, a.ExpertIDs[b], x)
			}
		}
	}
}

// alignment builds an alignment by its definition, for the grouped GEMM
// cases' inputs.
func alignment(ids []int32, e, block int) *moe.Alignment {
	bs := int32(block)
	a := &moe.Alignment{NumExperts: e, BlockSize: block, Numel: int32(len(ids)), Counts: make([]int32, e), Cumsum: make([]int32, e+1)}
	slots := make([][]int32, e)
	for s, id := range ids {
		slots[id] = append(slots[id], int32(s))
	}
	for x, sl := range slots {
		a.Counts[x] = int32(len(sl))
		a.Cumsum[x+1] = a.Cumsum[x] + (a.Counts[x]+bs-1)/bs*bs
		padded := slices.Repeat([]int32{a.Numel}, int(a.Cumsum[x+1]-a.Cumsum[x]))
		copy(padded, sl)
		a.SortedTokenIDs = append(a.SortedTokenIDs, padded...)
		for range len(padded) / block {
			a.ExpertIDs = append(a.ExpertIDs, int32(x))
		}
	}
	a.TotalPadded = a.Cumsum[e]
	if a.SortedTokenIDs == nil {
		a.SortedTokenIDs, a.ExpertIDs = []int32{}, []int32{}
	}
	return a
}
