package validate

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestAlignHand(t *testing.T) {
	// T=3 tokens x K=2 slots over 4 experts, block 2.
	ids := []int32{2, 0, 2, 1, 0, 2}
	a, err := AlignBlockSize(ids, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	const S = 6 // sentinel = numel
	check := func(name string, got, want []int32) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("counts", a.Counts, []int32{2, 1, 3, 0})
	check("cumsum", a.Cumsum, []int32{0, 2, 4, 8, 8})
	check("sorted_token_ids", a.SortedTokenIDs, []int32{1, 4, 3, S, 0, 2, 5, S})
	check("expert_ids", a.ExpertIDs, []int32{0, 1, 2, 2})
	if a.TotalPadded != 8 || a.Numel != S {
		t.Errorf("total %d numel %d, want 8 6", a.TotalPadded, a.Numel)
	}
	check("block 1", a.Block(1), []int32{3})
	check("block 3", a.Block(3), []int32{5})
	if got := MaxPaddedTokens(6, 4, 2); got != 10 {
		t.Errorf("MaxPaddedTokens = %d, want 10", got)
	}
}

func TestAlignCases(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	randIDs := func(n, e int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(r.IntN(e))
		}
		return out
	}
	tests := []struct {
		name      string
		ids       []int32
		e, block  int
		wantTotal int32
	}{
		{"T=1 K=1", []int32{3}, 4, 64, 64},
		{"T=1 K=8 + shared", []int32{0, 5, 9, 12, 100, 200, 255, 256}, 257, 64, 8 * 64},
		{"all on one expert, not a block multiple", []int32{7, 7, 7, 7, 7}, 8, 4, 8},
		{"exact block multiple", []int32{1, 1, 1, 1}, 2, 4, 4},
		{"block size 1", []int32{2, 0, 2}, 3, 1, 3},
		{"264 experts random", randIDs(128*9, 264), 264, 64, -1},
		{"384 experts few tokens", randIDs(3*8, 384), 384, 16, -1},
	}
	for _, tt := range tests {
		a, err := AlignBlockSize(tt.ids, tt.e, tt.block)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if tt.wantTotal >= 0 && a.TotalPadded != tt.wantTotal {
			t.Errorf("%s: total %d, want %d", tt.name, a.TotalPadded, tt.wantTotal)
		}
		checkAlignInvariants(t, tt.name, tt.ids, a)
	}
}

// checkAlignInvariants verifies the arrays against their definition,
// independently of how AlignBlockSize builds them.
func checkAlignInvariants(t *testing.T, name string, ids []int32, a *Alignment) {
	t.Helper()
	numel := int32(len(ids))
	if a.Numel != numel || int(a.TotalPadded) != len(a.SortedTokenIDs) || int(a.TotalPadded)%a.BlockSize != 0 {
		t.Fatalf("%s: numel %d total %d len %d", name, a.Numel, a.TotalPadded, len(a.SortedTokenIDs))
	}
	if len(a.ExpertIDs) != int(a.TotalPadded)/a.BlockSize || int(a.TotalPadded) > MaxPaddedTokens(len(ids), a.NumExperts, a.BlockSize) {
		t.Fatalf("%s: %d expert ids for total %d", name, len(a.ExpertIDs), a.TotalPadded)
	}
	seen := make([]bool, len(ids))
	var sum int32
	for e := range a.NumExperts {
		var want []int32
		for i, id := range ids {
			if int(id) == e {
				want = append(want, int32(i))
			}
		}
		lo, hi := a.Cumsum[e], a.Cumsum[e+1]
		padded := (int32(len(want)) + int32(a.BlockSize) - 1) / int32(a.BlockSize) * int32(a.BlockSize)
		if lo != sum || hi-lo != padded || a.Counts[e] != int32(len(want)) {
			t.Fatalf("%s: expert %d range [%d,%d) count %d, want start %d size %d count %d", name, e, lo, hi, a.Counts[e], sum, padded, len(want))
		}
		sum += padded
		got := a.SortedTokenIDs[lo : lo+int32(len(want))]
		if !slices.Equal(got, want) { // ascending slot order (a multiset check would do for the GPU)
			t.Fatalf("%s: expert %d slots %v, want %v", name, e, got, want)
		}
		for _, s := range got {
			seen[s] = true
		}
		for _, s := range a.SortedTokenIDs[lo+int32(len(want)) : hi] {
			if s != numel {
				t.Fatalf("%s: expert %d padding holds %d, want sentinel %d", name, e, s, numel)
			}
		}
		for b := lo / int32(a.BlockSize); b < hi/int32(a.BlockSize); b++ {
			if a.ExpertIDs[b] != int32(e) {
				t.Fatalf("%s: block %d expert %d, want %d", name, b, a.ExpertIDs[b], e)
			}
		}
	}
	if sum != a.TotalPadded {
		t.Fatalf("%s: padded sum %d, total %d", name, sum, a.TotalPadded)
	}
	for i, ok := range seen {
		if !ok {
			t.Fatalf("%s: slot %d missing", name, i)
		}
	}
}

func TestAlignRefuses(t *testing.T) {
	if _, err := AlignBlockSize([]int32{0, 4}, 4, 64); err == nil {
		t.Error("expert id 4 of 4 accepted")
	}
	if _, err := AlignBlockSize([]int32{-1}, 4, 64); err == nil {
		t.Error("negative id accepted")
	}
	if _, err := AlignBlockSize([]int32{0}, 4, 0); err == nil {
		t.Error("block size 0 accepted")
	}
	a, err := AlignBlockSize(nil, 4, 64)
	if err != nil || a.TotalPadded != 0 || len(a.ExpertIDs) != 0 {
		t.Errorf("no tokens: %v %+v", err, a)
	}
}
