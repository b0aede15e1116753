package layout

import (
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// A contract's expert_parallel record is held to the ranks convert writes
// before anything is sized by it: counts past MaxRanks, and ep x moe_tp
// products that wrap, are refused; a well-formed record passes.
func TestExpertParallelCheck(t *testing.T) {
	good := func() *ExpertParallel {
		return &ExpertParallel{EP: 2, MoETP: 1, Ranks: 2, Slots: 4, SlotsPerRank: 2, Placement: "contiguous",
			PhysicalToLogical: [][]int{{0, 1, 2, 3}},
			RankFiles: []RankInfo{
				{Rank: 0, EPRank: 0, FirstSlot: 0, Index: RankIndex(0, 2)},
				{Rank: 1, EPRank: 1, FirstSlot: 2, Index: RankIndex(1, 2)},
			}}
	}
	for _, tc := range []struct {
		name string
		edit func(x *ExpertParallel)
		want string
	}{
		{"well formed", func(*ExpertParallel) {}, ""},
		{"ep past the bound", func(x *ExpertParallel) { x.EP, x.Ranks = MaxRanks+1, MaxRanks+1 }, "expert_parallel: ep 4097, moe_tp 1"},
		{"a product that wraps", func(x *ExpertParallel) { x.EP, x.MoETP, x.Ranks = 2, 1<<62, 0 }, "expert_parallel: ep 2, moe_tp 4611686018427387904, ranks 0"},
		{"a slot past the experts", func(x *ExpertParallel) { x.PhysicalToLogical[0][3] = 4 }, "layer 0 slot 3 holds expert 4 of 4"},
		{"an expert with no slot", func(x *ExpertParallel) { x.PhysicalToLogical[0][3] = 2 }, "layer 0: expert 3 has no slot"},
		{"a file outside its rank's folder", func(x *ExpertParallel) { x.RankFiles[1].Files = []string{RankDir(0, 2) + "/a.safetensors"} }, "rank 1's file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := good()
			tc.edit(x)
			err := x.check(4, 1)
			testkit.WantErr(t, err, tc.want)
		})
	}
}
