package layout

import (
	"fmt"
	"path"
)

// ExpertParallel is the contract's record of an output prepared per rank
// (convert or fuse-shared --ep N [--moe-tp M]): which physical slots each
// of the N*M ranks holds, which logical expert each slot is, and the files
// that hold them. A loader reads the shared files (the top-level index:
// everything but the routed experts) and its own rank's, and maps a
// router's logical expert ids to its local slots through
// PhysicalToLogical.
type ExpertParallel struct {
	EP    int `json:"ep"`     // N, expert-parallel groups
	MoETP int `json:"moe_tp"` // M, ways each expert's intermediate dimension is cut
	Ranks int `json:"ranks"`  // N*M; rank = ep_rank*M + moe_tp_rank
	// Slots is the physical slots of every MoE layer, S = E + redundant;
	// EP group g holds slots [g*S/N, (g+1)*S/N) of every layer.
	Slots        int `json:"slots"`
	SlotsPerRank int `json:"slots_per_rank"` // S/N
	// Placement says where the map came from: "contiguous" (slot p holds
	// expert p mod E), "stats" (balanced from recorded loads,
	// moeprep placement's algorithm) or "map" (a placement file).
	Placement string `json:"placement"`
	// PhysicalToLogical[i][p] is the logical expert slot p of the
	// contract's Layers[i] holds (a replica is a copy of its expert's
	// bytes).
	PhysicalToLogical [][]int `json:"physical_to_logical_map"`
	// SharedIndex is the index of the tensors every rank reads.
	SharedIndex string     `json:"shared_index"`
	RankFiles   []RankInfo `json:"rank_files"`
}

// RankInfo is one rank's part of a per-rank output.
type RankInfo struct {
	Rank      int `json:"rank"`
	EPRank    int `json:"ep_rank"`
	MoETPRank int `json:"moe_tp_rank"`
	// FirstSlot is the physical slot the rank's local slot 0 is, in every
	// MoE layer: local slot j is physical slot FirstSlot+j, j < slots_per_rank.
	// With fused shared experts, local ids slots_per_rank + s are the
	// rank's own replica's S slices.
	FirstSlot int `json:"first_slot"`
	// Intermediate is the [first, end) rows of every expert's (and shared
	// slice's) intermediate dimension the rank holds: gate and up rows,
	// down columns.
	Intermediate [2]int64 `json:"intermediate"`
	Index        string   `json:"index"` // the rank's index, relative to the directory
	Files        []string `json:"files"` // its shards, relative to the directory
}

// RankDir is rank r's directory of n ranks: "rank-00003-of-00008" holds
// rank 3 (ranks count from 0, as torch.distributed numbers them).
func RankDir(r, n int) string { return fmt.Sprintf("rank-%05d-of-%05d", r, n) }

// RankIndex is rank r's index file, relative to the output directory.
func RankIndex(r, n int) string { return path.Join(RankDir(r, n), "model.safetensors.index.json") }

// Rank is rank r's record.
func (x *ExpertParallel) Rank(r int) (RankInfo, bool) {
	if x == nil || r < 0 || r >= len(x.RankFiles) {
		return RankInfo{}, false
	}
	return x.RankFiles[r], true
}

// Logical is the logical expert that local slot j of rank r holds in the
// contract's layer i.
func (x *ExpertParallel) Logical(i int, ri RankInfo, j int) int {
	return x.PhysicalToLogical[i][ri.FirstSlot+j]
}

// check verifies the record against the contract it is in: E experts, n
// MoE layers, intermediate range per rank consistent with M.
// MaxRanks bounds a per-rank output's N*M ranks: the largest EP
// deployments are a few hundred GPUs. A contract naming more is refused
// before anything is sized by it.
const MaxRanks = 4096

func (x *ExpertParallel) check(E, layers int) error {
	switch {
	case x.EP < 1 || x.MoETP < 1 || x.EP > MaxRanks || x.MoETP > MaxRanks/x.EP || x.Ranks != x.EP*x.MoETP:
		return fmt.Errorf("moeprep contract: expert_parallel: ep %d, moe_tp %d, ranks %d", x.EP, x.MoETP, x.Ranks)
	case x.Slots < E || x.Slots%x.EP != 0 || x.SlotsPerRank != x.Slots/x.EP:
		return fmt.Errorf("moeprep contract: expert_parallel: slots %d, slots_per_rank %d for ep %d and %d experts", x.Slots, x.SlotsPerRank, x.EP, E)
	case len(x.PhysicalToLogical) != layers:
		return fmt.Errorf("moeprep contract: expert_parallel: physical_to_logical_map has %d layers, the contract %d", len(x.PhysicalToLogical), layers)
	case len(x.RankFiles) != x.Ranks:
		return fmt.Errorf("moeprep contract: expert_parallel: %d rank_files for %d ranks", len(x.RankFiles), x.Ranks)
	}
	switch x.Placement {
	case "contiguous", "stats", "map":
	default:
		return fmt.Errorf("moeprep contract: expert_parallel: placement %q", x.Placement)
	}
	for i, row := range x.PhysicalToLogical {
		if len(row) != x.Slots {
			return fmt.Errorf("moeprep contract: expert_parallel: layer %d's map has %d slots, want %d", i, len(row), x.Slots)
		}
		seen := make([]bool, E)
		for p, e := range row {
			if e < 0 || e >= E {
				return fmt.Errorf("moeprep contract: expert_parallel: layer %d slot %d holds expert %d of %d", i, p, e, E)
			}
			seen[e] = true
		}
		for e, ok := range seen {
			if !ok {
				return fmt.Errorf("moeprep contract: expert_parallel: layer %d: expert %d has no slot", i, e)
			}
		}
	}
	for r, ri := range x.RankFiles {
		if ri.Rank != r || ri.EPRank != r/x.MoETP || ri.MoETPRank != r%x.MoETP || ri.FirstSlot != ri.EPRank*x.SlotsPerRank {
			return fmt.Errorf("moeprep contract: expert_parallel: rank_files[%d] is rank %d (ep %d, moe_tp %d, first slot %d)", r, ri.Rank, ri.EPRank, ri.MoETPRank, ri.FirstSlot)
		}
		if ri.Index != RankIndex(r, x.Ranks) {
			return fmt.Errorf("moeprep contract: expert_parallel: rank %d's index %q, want %q", r, ri.Index, RankIndex(r, x.Ranks))
		}
		for _, f := range ri.Files {
			if path.Dir(f) != RankDir(r, x.Ranks) {
				return fmt.Errorf("moeprep contract: expert_parallel: rank %d's file %q is not in %s", r, f, RankDir(r, x.Ranks))
			}
		}
	}
	return nil
}

// Ranks is N*M of a per-rank output, 0 for one bank.
func (c *Contract) Ranks() int {
	if c.ExpertParallel == nil {
		return 0
	}
	return c.ExpertParallel.Ranks
}
