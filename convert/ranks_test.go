package convert

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/placement"
	"github.com/moeprep/moeprep/safetensors"
)

// readTensors reads every tensor dir's index names (dir: DST for the
// shared files, DST/rank-... for a rank's).
func readTensors(t *testing.T, dir string) map[string]tensorData {
	t.Helper()
	sh, err := safetensors.OpenSharded(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	out := map[string]tensorData{}
	for _, f := range sh.Shards {
		for _, ti := range f.Tensors {
			b, err := f.ReadTensor(ti.Name)
			if err != nil {
				t.Fatal(err)
			}
			out[ti.Name] = tensorData{ti.DType, ti.Shape, b}
		}
	}
	return out
}

// part is the bytes of an expert's matrix (rows x cols elements of es
// bytes... as stored) that moe-tp rank t of m holds: the rows of a gate or
// up tensor (each half's rows of a fused gate-up one), the columns of a
// down tensor, cut m ways; a tensor whose cut dimension m does not divide
// (a per-tensor or per-row scale) is whole in every part.
func tpPart(name string, shape []int64, b []byte, t, m int64) []byte {
	if m > 1 && strings.Contains(name, "bias") && len(shape) == 1 {
		// an expert bias: gate and up rows as their weights'; the down
		// bias on part 0 alone, zeros in the others (added once in the sum)
		if strings.Contains(name, "down") {
			if t == 0 {
				return b
			}
			return make([]byte, len(b))
		}
		halves := int64(1)
		if strings.Contains(name, "gate_up") || strings.Contains(name, "up_gate") {
			halves = 2
		}
		hb := int64(len(b)) / halves
		var out []byte
		for h := range halves {
			out = append(out, b[h*hb+t*hb/m:h*hb+(t+1)*hb/m]...)
		}
		return out
	}
	if m == 1 || len(shape) < 2 {
		return b
	}
	rows, cols := shape[0], int64(1)
	for _, d := range shape[1:] {
		cols *= d
	}
	rowBytes := int64(len(b)) / rows
	if strings.Contains(name, "down") {
		if shape[1]%m != 0 {
			return b
		}
		w := rowBytes / m
		var out []byte
		for r := range rows {
			out = append(out, b[r*rowBytes+t*w:r*rowBytes+(t+1)*w]...)
		}
		return out
	}
	halves := int64(1)
	if strings.Contains(name, "gate_up") || strings.Contains(name, "up_gate") {
		halves = 2
	}
	hr := rows / halves
	if hr%m != 0 {
		return b
	}
	var out []byte
	for h := range halves {
		r0 := h*hr + t*hr/m
		out = append(out, b[r0*rowBytes:(r0+hr/m)*rowBytes]...)
	}
	return out
}

// checkRanks compares a per-rank output with the whole-model output of the
// same run without --ep: the shared files hold exactly the whole output's
// tensors that are not expert stacks, byte for byte; every rank's stack
// slice j is the whole stack's slice of the logical expert its slot holds
// (the shared slices after its slots), cut to the rank's part.
func checkRanks(t *testing.T, whole, ranked string) {
	t.Helper()
	var doc struct {
		C layout.Contract `json:"moeprep"`
	}
	b := testkit.ReadFile(t, filepath.Join(ranked, "config.json"))
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	c := doc.C
	x := c.ExpertParallel
	if x == nil {
		t.Fatal("no expert_parallel record")
	}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	w := readTensors(t, whole)
	shared := readTensors(t, ranked)
	stacks := map[string]int{} // stack name -> contract layer
	for i, li := range c.Layers {
		for _, n := range c.Names(li).Names() {
			stacks[n] = i
		}
		if bn, ok := c.Biases(li); ok {
			for _, n := range []string{bn.Gate, bn.Up, bn.GateUp, bn.Down} {
				if n != "" {
					stacks[n] = i
				}
			}
		}
	}
	for n, wt := range w {
		if _, ok := stacks[n]; ok {
			if _, in := shared[n]; in {
				t.Errorf("expert stack %s is in the shared files", n)
			}
			continue
		}
		st, ok := shared[n]
		checkAsIs(t, n, st, ok, wt, "shared files against the whole output")
	}
	for n := range shared {
		if _, ok := w[n]; !ok {
			t.Errorf("shared files hold %s, which the whole output does not", n)
		}
	}
	S := c.SharedSlices
	per := x.SlotsPerRank
	checked := 0
	for _, ri := range x.RankFiles {
		rt := readTensors(t, filepath.Join(ranked, layout.RankDir(ri.Rank, x.Ranks)))
		seen := 0
		for n, got := range rt {
			li, ok := stacks[n]
			if !ok {
				t.Errorf("rank %d holds %s, not an expert stack", ri.Rank, n)
				continue
			}
			seen++
			wt := w[n]
			bank := wt.shape[0]
			if got.shape[0] != int64(per+S) {
				t.Errorf("rank %d %s: %d slots, want %d + %d shared", ri.Rank, n, got.shape[0], per, S)
				continue
			}
			wslice := int64(len(wt.data)) / bank
			var want []byte
			for j := range per + S {
				e := int64(x.Logical(li, ri, min(j, per-1)))
				if j >= per { // the rank's own shared replica's slice
					e = int64(c.NumExperts + ri.EPRank*S + (j - per))
				}
				want = append(want, tpPart(n, wt.shape[1:], wt.data[e*wslice:(e+1)*wslice], int64(ri.MoETPRank), int64(x.MoETP))...)
			}
			if !bytes.Equal(got.data, want) {
				t.Errorf("rank %d %s (shape %v): bytes differ from the whole output's slots", ri.Rank, n, got.shape)
			}
			checked++
		}
		if seen != len(stacks) {
			t.Errorf("rank %d holds %d stacks, the layers have %d", ri.Rank, seen, len(stacks))
		}
	}
	if checked == 0 {
		t.Fatal("no stack compared")
	}
}

// writePlacement writes a moeprep.placement/v1 map for the given layers.
func writePlacement(t *testing.T, layers []int, rows [][]int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "placement.json")
	b, _ := json.Marshal(map[string]any{"schema": "moeprep.placement/v1", "layers": layers, "physical_to_logical_map": rows})
	testkit.WriteFile(t, p, b)
	return p
}

// scrambled is a placement of e experts on s slots: reversed, the
// redundant slots replicas of the last experts.
func scrambled(e, s int) []int {
	row := make([]int, s)
	for p := range row {
		row[p] = (e - 1 - p%e + e) % e
	}
	return row
}

func TestRanksEqualWholeOutputSlices(t *testing.T) {
	fp8 := filepath.Join(t.TempDir(), "fp8-256")
	cktest.WriteSpec(t, fp8, fixtures.SynthSpec{Family: "deepseek_v3", Layers: 2, DenseLayers: 1, Hidden: 256, Intermediate: 256,
		Experts: 8, SharedExperts: 1, TopK: 2, NGroup: 1, TopKGroup: 1, RoutedScalingFactor: 2.5, DType: "fp8", Vocab: 64, Seed: 11})
	mtp := cktest.WritePreset(t, "tiny-deepseek-v3-fp8")
	int4 := filepath.Join(t.TempDir(), "int4-64")
	cktest.WriteSpec(t, int4, fixtures.SynthSpec{Family: "kimi_k2", Layers: 2, DenseLayers: 1, Hidden: 64, Intermediate: 64,
		Experts: 8, SharedExperts: 1, TopK: 2, NGroup: 1, TopKGroup: 1, RoutedScalingFactor: 2.827, DType: "int4-pack", GroupSize: 32, Vocab: 64, Seed: 12})
	ds := filepath.Join(hfDir, "deepseek-v3-bf16")
	stats := filepath.Join(t.TempDir(), "loads.json")
	testkit.WriteFile(t, stats, []byte(`{"0": [0,0,0,0,0,0,0,0], "1": [900,10,10,10,10,10,10,300], "2": [5,5,5,5,5,5,700,80]}`))
	cases := []struct {
		name string
		src  string
		o    Options
	}{
		{"deepseek-v3-bf16 ep4", ds, Options{EP: 4}},
		{"deepseek-v3-bf16 ep4 gate-up", ds, Options{EP: 4, Layout: layout.GateUp}},
		{"deepseek-v3-bf16 ep2 moe-tp2", ds, Options{EP: 2, MoETP: 2}},
		{"deepseek-v3-bf16 ep4 slots20", ds, Options{EP: 4, Slots: 20}},
		{"deepseek-v3-bf16 ep4 map", ds, Options{EP: 4, PlacementMap: "v1:20"}},
		{"deepseek-v3-bf16 fuse ep4", ds, Options{EP: 4, FuseShared: true}},
		{"deepseek-v3-bf16 fuse ep2 moe-tp2 up-gate slots18", ds, Options{EP: 2, MoETP: 2, FuseShared: true, Slots: 18, Layout: layout.UpGate}},
		{"deepseek-v3-fp8 ep4", filepath.Join(hfDir, "deepseek-v3-fp8"), Options{EP: 4}},
		{"deepseek-v3-fp8 fuse ep8 gate-up", filepath.Join(hfDir, "deepseek-v3-fp8"), Options{EP: 8, FuseShared: true, Layout: layout.GateUp}},
		{"tiny-deepseek-v3-fp8 mtp ep2 slots18", mtp, Options{EP: 2, Slots: 18}},
		{"fp8 I256 ep2 moe-tp2", fp8, Options{EP: 2, MoETP: 2}},
		{"fp8 I256 fuse ep4 moe-tp2 gate-up", fp8, Options{EP: 4, MoETP: 2, FuseShared: true, Layout: layout.GateUp}},
		{"fp8 I256 ep2 moe-tp2 dtype bf16", fp8, Options{EP: 2, MoETP: 2, DType: safetensors.BF16}},
		{"int4 g32 fuse requantize ep2 moe-tp2", int4, Options{EP: 2, MoETP: 2, FuseShared: true, RequantizeShared: true}},
		{"int4 g32 ep4 moe-tp2 gate-up", int4, Options{EP: 4, MoETP: 2, Layout: layout.GateUp}},
		{"deepseek-v3-int4 ep4", filepath.Join(hfDir, "deepseek-v3-int4"), Options{EP: 4}},
		{"deepseek-v3-nvfp4 ep2 moe-tp2", filepath.Join(hfDir, "deepseek-v3-nvfp4"), Options{EP: 2, MoETP: 2}},
		{"deepseek-v3-fp8-tensor ep2 moe-tp2 gate-up", filepath.Join(hfDir, "deepseek-v3-fp8-tensor"), Options{EP: 2, MoETP: 2, Layout: layout.GateUp}},
		{"qwen3-moe-fp8-channel ep2 moe-tp2", filepath.Join(hfDir, "qwen3-moe-fp8-channel"), Options{EP: 2, MoETP: 2}},
		{"gpt-oss-mxfp4 ep4", filepath.Join(hfDir, "gpt-oss-mxfp4"), Options{EP: 4}},
		{"gpt-oss ep2 in-out", filepath.Join(hfDir, "gpt-oss"), Options{EP: 2, Orientation: layout.InOut}},
		{"gpt-oss ep2 moe-tp2", filepath.Join(hfDir, "gpt-oss"), Options{EP: 2, MoETP: 2}},
		{"gpt-oss ep2 moe-tp2 gate-up", filepath.Join(hfDir, "gpt-oss"), Options{EP: 2, MoETP: 2, Layout: layout.GateUp}},
		{"gpt-oss ep1 moe-tp4 up-gate slots10", filepath.Join(hfDir, "gpt-oss"), Options{EP: 1, MoETP: 4, Layout: layout.UpGate, Slots: 10}},
		{"qwen3-moe ep4", filepath.Join(hfDir, "qwen3-moe"), Options{EP: 4}},
		{"ernie4-5-vl-moe two banks ep4 slots12", filepath.Join(hfDir, "ernie4-5-vl-moe"), Options{EP: 4, Slots: 12}},
		{"ernie4-5-vl-moe two banks ep2 moe-tp2 gate-up", filepath.Join(hfDir, "ernie4-5-vl-moe"), Options{EP: 2, MoETP: 2, Layout: layout.GateUp}},
		{"qwen3-moe ep2 moe-tp2 gate-up", filepath.Join(hfDir, "qwen3-moe"), Options{EP: 2, MoETP: 2, Layout: layout.GateUp}},
		{"qwen3-moe ep4 stats slots12", filepath.Join(hfDir, "qwen3-moe"), Options{EP: 4, Slots: 12, PlacementStats: stats}},
		{"mixtral ep2 moe-tp4", filepath.Join(hfDir, "mixtral"), Options{EP: 2, MoETP: 4}},
		{"mixtral ep8 gate-up", filepath.Join(hfDir, "mixtral"), Options{EP: 8, Layout: layout.GateUp}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fp := cktest.Plan(t, tc.src)
			o := tc.o
			if strings.HasPrefix(o.PlacementMap, "v1:") {
				var s int
				fmt.Sscanf(o.PlacementMap, "v1:%d", &s)
				var layers []int
				var rows [][]int
				for _, l := range fp.Layers {
					layers, rows = append(layers, l.Index), append(rows, scrambled(fp.NumExperts, s))
				}
				o.PlacementMap = writePlacement(t, layers, rows)
			}
			dir := t.TempDir()
			wo := Options{Src: tc.src, Dst: filepath.Join(dir, "whole"), Layout: o.Layout, FuseShared: o.FuseShared, DType: o.DType,
				RequantizeShared: o.RequantizeShared, Orientation: o.Orientation}
			if o.FuseShared {
				wo.Replicas = o.EP
			}
			if _, err := Convert(context.Background(), wo); err != nil {
				t.Fatal(err)
			}
			o.Src, o.Dst = tc.src, filepath.Join(dir, "ranked")
			sum, err := Convert(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if sum.Ranks != o.EP*max(o.MoETP, 1) {
				t.Errorf("summary: %d ranks, want %d", sum.Ranks, o.EP*max(o.MoETP, 1))
			}
			checkRanks(t, wo.Dst, o.Dst)
			m, err := layout.ReadManifest(o.Dst)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Verify(o.Dst); err != nil {
				t.Error(err)
			}
		})
	}
}

// Refusals name the numbers: ranks that do not divide the experts or
// slots, widths that do not divide, a placement of other layers.
func TestRanksRefusals(t *testing.T) {
	ds := filepath.Join(hfDir, "deepseek-v3-bf16") // E 16, I 32, MoE layers 1 and 2
	fp8 := filepath.Join(hfDir, "deepseek-v3-fp8")
	full := func(e, s int) []int { return scrambled(e, s) }
	missing := full(16, 16)
	missing[3] = 4 // expert 12 (reversed) has no slot
	stats := filepath.Join(t.TempDir(), "loads.json")
	testkit.WriteFile(t, stats, []byte(`{"0": [1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0], "1": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1], "2": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}`))
	short := filepath.Join(t.TempDir(), "short.json")
	testkit.WriteFile(t, short, []byte(`{"1": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}`))
	for _, tc := range []struct {
		name string
		src  string
		o    Options
		want string
	}{
		{"ep does not divide E", ds, Options{EP: 3}, "--ep 3 does not divide the 16 experts"},
		{"ep does not divide S", ds, Options{EP: 3, Slots: 20}, "--ep 3 does not divide the 20 slots (16 experts + 4 redundant)"},
		{"slots below E", ds, Options{EP: 4, Slots: 12}, "12 slots cannot hold the 16 experts"},
		{"moe-tp does not divide I", ds, Options{EP: 2, MoETP: 3}, "experts are 32 wide (moe_intermediate_size), which 3 does not divide"},
		{"moe-tp cuts FP8 blocks", fp8, Options{EP: 2, MoETP: 2}, "a part of 16 would cut the FP8 scale blocks of 128x128"},
		{"moe-tp without ep", ds, Options{MoETP: 2}, "--moe-tp 2 needs --ep"},
		{"ranks whose product wraps", ds, Options{EP: 2, MoETP: 1 << 62}, "--moe-tp 4611686018427387904 with --ep 2: want at most 4096 ranks in all"},
		{"slots without ep", ds, Options{Slots: 20}, "need --ep"},
		{"replicas not N", ds, Options{EP: 4, FuseShared: true, Replicas: 2}, "--replicas 2 with --ep 4"},
		{"map of another layer", ds, Options{EP: 4, PlacementMap: writePlacement(t, []int{1, 5}, [][]int{full(16, 16), full(16, 16)})}, "no placement for MoE layer 2: the file places layers 1, 5, the model's MoE layers are 1, 2"},
		{"map of an extra layer", ds, Options{EP: 4, PlacementMap: writePlacement(t, []int{1, 2, 7}, [][]int{full(16, 16), full(16, 16), full(16, 16)})}, "places layer 7, which is not one of the model's MoE layers 1, 2"},
		{"map missing an expert", ds, Options{EP: 4, PlacementMap: writePlacement(t, []int{1, 2}, [][]int{full(16, 16), missing})}, "layer 2: expert 12 has no slot"},
		{"map of other experts", ds, Options{EP: 4, PlacementMap: writePlacement(t, []int{1, 2}, [][]int{full(16, 16), full(20, 16)})}, "layer 2: slot 0 holds expert 19, the model has 16"},
		{"map slots and --slots", ds, Options{EP: 4, Slots: 16, PlacementMap: writePlacement(t, []int{1, 2}, [][]int{full(16, 20), full(16, 20)})}, "20 slots a layer, --slots says 16"},
		{"map and stats", ds, Options{EP: 4, PlacementStats: stats, PlacementMap: stats}, "contradict"},
		{"stats load on a dense layer", ds, Options{EP: 4, PlacementStats: stats}, "layer 0 has recorded loads, but the model's MoE layers are 1, 2"},
		{"stats missing a layer", ds, Options{EP: 4, PlacementStats: short}, "no recorded loads for MoE layer 2"},
		{"two banks and a placement file", filepath.Join(hfDir, "ernie4-5-vl-moe"), Options{EP: 4, PlacementStats: stats},
			"--placement and --placement-map: ernie4_5_vl_moe (model_type ernie4_5_vl_moe_text) holds two routed banks a layer (text and vision), and a placement file has one row a layer; give --ep [--slots]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			o.Src, o.Dst = tc.src, filepath.Join(t.TempDir(), "out")
			_, err := Convert(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			if _, serr := os.Stat(o.Dst); serr == nil {
				t.Errorf("a refused run left %s", o.Dst)
			}
		})
	}
}

// --dry-run reports each rank's bytes, which sum with the shared files'
// to what it writes, and writes nothing.
func TestRanksDryRun(t *testing.T) {
	src := filepath.Join(hfDir, "deepseek-v3-bf16")
	dst := filepath.Join(t.TempDir(), "out")
	p, err := DryRun(context.Background(), Options{Src: src, Dst: dst, EP: 4, Slots: 20})
	if err != nil {
		t.Fatal(err)
	}
	if p.Ranks != 4 || len(p.RankBytes) != 4 {
		t.Fatalf("ranks %d, rank_bytes %v", p.Ranks, p.RankBytes)
	}
	// 5 slots a rank, 2 MoE layers, gate up and down [32, 160] bf16 each,
	// plus each shard's header
	var shards, rankShards int64
	for _, s := range p.Shards {
		shards += s.Bytes
		if strings.HasPrefix(s.Name, "rank-") {
			rankShards += s.Bytes
		}
	}
	var sum int64
	for r, b := range p.RankBytes {
		if b < 5*2*3*32*160*2 || b > 5*2*3*32*160*2+4096 {
			t.Errorf("rank %d: %d bytes, want 5 slots x 2 layers x 3 x 32x160 bf16 and a header", r, b)
		}
		sum += b
	}
	if sum != rankShards {
		t.Errorf("rank bytes sum to %d, the rank shards to %d", sum, rankShards)
	}
	if _, err := os.Stat(dst); err == nil {
		t.Error("--dry-run wrote DST")
	}
}

// --placement with --nodes places as moeprep placement does with the
// model's n_group: hierarchical where the groups divide among the nodes;
// an MTP layer the loads do not record keeps the contiguous map.
func TestRanksPlacementHierarchical(t *testing.T) {
	src := cktest.WritePreset(t, "tiny-deepseek-v3-fp8") // E 16, n_group 4, MoE layers 1, 2 and MTP layer 3
	stats := filepath.Join(t.TempDir(), "loads.json")
	testkit.WriteFile(t, stats, []byte(`{"1": [90,1,1,1,1,1,1,1,1,1,1,1,1,1,1,40], "2": [1,1,1,1,1,1,1,1,70,1,1,1,1,1,1,1]}`))
	dst := filepath.Join(t.TempDir(), "out")
	if _, err := Convert(context.Background(), Options{Src: src, Dst: dst, EP: 4, Slots: 20, Nodes: 2, PlacementStats: stats}); err != nil {
		t.Fatal(err)
	}
	b := testkit.ReadFile(t, filepath.Join(dst, "config.json"))
	var doc struct {
		C layout.Contract `json:"moeprep"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	st, err := placement.ReadStats(stats)
	if err != nil {
		t.Fatal(err)
	}
	spec := placement.Spec{Experts: 16, Slots: 20, Ranks: 4, Nodes: 2, Groups: 4}
	want, err := placement.Place(spec, st)
	if err != nil {
		t.Fatal(err)
	}
	if !want.Hierarchical {
		t.Fatal("the reference placement is not hierarchical")
	}
	x := doc.C.ExpertParallel
	if x.Placement != "stats" || len(x.PhysicalToLogical) != 3 {
		t.Fatalf("placement %q, %d layers", x.Placement, len(x.PhysicalToLogical))
	}
	for i := range 2 {
		if !slices.Equal(x.PhysicalToLogical[i], want.PhysicalToLogical[i]) {
			t.Errorf("layer %d: %v, moeprep placement gives %v", i+1, x.PhysicalToLogical[i], want.PhysicalToLogical[i])
		}
	}
	if !slices.Equal(x.PhysicalToLogical[2], placement.Contiguous(spec).Map) {
		t.Errorf("MTP layer: %v, want the contiguous map", x.PhysicalToLogical[2])
	}
	if _, err := Convert(context.Background(), Options{Src: src, Dst: filepath.Join(t.TempDir(), "x"), EP: 4, Nodes: 2}); err == nil || !strings.Contains(err.Error(), "--nodes 2 applies to --placement") {
		t.Errorf("--nodes without --placement: %v", err)
	}
}

// --resume over a complete per-rank output verifies every rank's files and
// exits with nothing to do; another placement is refused.
func TestRanksResumeComplete(t *testing.T) {
	src := filepath.Join(hfDir, "qwen3-moe")
	dst := filepath.Join(t.TempDir(), "out")
	o := Options{Src: src, Dst: dst, EP: 2, MoETP: 2, Slots: 10}
	if _, err := Convert(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	o.Resume = true
	sum, err := Convert(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !sum.AlreadyComplete || sum.Ranks != 4 {
		t.Errorf("resume over the complete output: already complete %v, ranks %d", sum.AlreadyComplete, sum.Ranks)
	}
	o.Slots = 12
	if _, err := Convert(context.Background(), o); err == nil || !strings.Contains(err.Error(), "contract differs") {
		t.Errorf("resume with other slots: %v", err)
	}
}
