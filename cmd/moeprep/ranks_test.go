package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/validate/rankproof"
)

// A placement written by `moeprep placement` (its JSON and SGLang's file)
// is what convert --ep --placement-map writes into the contract, slot for
// slot; --placement STATS places the same way; refusals exit 2 in one line
// naming the numbers; --dry-run lists each rank's bytes.
func TestConvertPerRankCommand(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(fixturesDir, "qwen3-moe") // 8 experts, MoE layers 1 and 2 (layer 0 is dense)
	stats := filepath.Join(dir, "loads.json")
	testkit.WriteFile(t, stats, []byte(`{"logical_count": [[0, 0, 0, 0, 0, 0, 0, 0], [100, 1, 1, 1, 1, 1, 1, 50], [1, 1, 1, 1, 1, 1, 90, 1]]}`))
	sg := filepath.Join(dir, "sg.json")
	code, out, errOut := runCLI(t, "placement", stats, "--ep", "2", "--slots", "10", "--json", "--sglang", sg)
	if code != 0 {
		t.Fatalf("placement: exit %d: %s", code, errOut)
	}
	pj := filepath.Join(dir, "placement.json")
	testkit.WriteFile(t, pj, []byte(out))
	var placed struct {
		P2L [][]int `json:"physical_to_logical_map"`
	}
	if err := json.Unmarshal([]byte(out), &placed); err != nil {
		t.Fatal(err)
	}
	contractMap := func(dst string) [][]int {
		t.Helper()
		b := testkit.ReadFile(t, filepath.Join(dst, "config.json"))
		var doc struct {
			M struct {
				EP struct {
					P2L       [][]int `json:"physical_to_logical_map"`
					Placement string  `json:"placement"`
				} `json:"expert_parallel"`
			} `json:"moeprep"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		return doc.M.EP.P2L
	}
	for i, args := range [][]string{
		{"--placement-map", pj},
		{"--placement-map", sg},
		{"--placement", stats, "--slots", "10"},
		// The same loads as TensorRT-LLM's statistics directory records them.
		{"--placement", "../../placement/testdata/trtllm-qwen3", "--slots", "10"},
	} {
		dst := filepath.Join(dir, "out"+string(rune('a'+i)))
		code, _, errOut := runCLI(t, append([]string{"convert", "--ep", "2", "--quiet", src, dst}, args...)...)
		if code != 0 {
			t.Fatalf("convert %v: exit %d: %s", args, code, errOut)
		}
		got := contractMap(dst)
		// layer 0 is dense: the placement keeps it contiguous, the contract lists MoE layers only
		if !slices.EqualFunc(got, placed.P2L[1:], slices.Equal) || slices.Equal(got[0][:8], []int{0, 1, 2, 3, 4, 5, 6, 7}) {
			t.Errorf("convert %v: contract map %v, placement wrote %v", args, got, placed.P2L)
		}
		if _, err := os.Stat(filepath.Join(dst, "rank-00001-of-00002", "model.safetensors.index.json")); err != nil {
			t.Error(err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ep", "3"}, "--ep 3 does not divide the 8 experts"},
		{[]string{"--ep", "4", "--slots", "10"}, "--ep 4 does not divide the 10 slots (8 experts + 2 redundant)"},
		{[]string{"--ep", "2", "--moe-tp", "3"}, "which 3 does not divide"},
		{[]string{"--moe-tp", "2"}, "--moe-tp 2 needs --ep"},
	} {
		code, _, errOut := runCLI(t, append([]string{"convert", "--quiet", src, filepath.Join(dir, "refused")}, tc.args...)...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2", tc.args, code)
		}
		assertCleanError(t, errOut, tc.want)
	}
	code, out, errOut = runCLI(t, "convert", "--dry-run", "--ep", "4", src, filepath.Join(dir, "plan"))
	if code != 0 || !strings.Contains(out, "rank-00003-of-00004/model-00001-of-00001.safetensors") || !strings.Contains(out, "    rank 3 ") {
		t.Errorf("--dry-run --ep 4: exit %d\n%s\n%s", code, out, errOut)
	}
}

// validate on a per-rank output: the whole proof and --rank r exit 0; a
// slot's byte changed exits 1 in one line naming the rank; --rank where
// it cannot apply exits 2.
func TestValidatePerRank(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(fixturesDir, "deepseek-v3-bf16")
	dst := filepath.Join(dir, "ep4")
	if code, _, errOut := runCLI(t, "fuse-shared", "--quiet", "--ep", "4", "--slots", "20", src, dst); code != 0 {
		t.Fatalf("fuse-shared: %s", errOut)
	}
	code, out, errOut := runCLI(t, "validate", "--quiet", src, dst)
	if code != 0 || !strings.Contains(out, "per-rank output (4 ranks): PASS") || !strings.Contains(out, "48 slots proven") ||
		strings.Count(out, "routed experts from the ranks") != 4 {
		t.Fatalf("validate: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "validate", "--quiet", "--rank", "2", "--json", src, dst)
	var res rankproof.Result
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Schema != "moeprep.validate-rank/v1" || !slices.Equal(res.Ranks, []int{2}) {
		t.Fatalf("validate --rank 2: exit %d\n%s\n%s", code, out, errOut)
	}
	if res.DSTBytesRead > res.SharedBytes+res.RankBytes {
		t.Errorf("--rank 2 read %d bytes, over the shared %d and its own %d", res.DSTBytesRead, res.SharedBytes, res.RankBytes)
	}
	shard := filepath.Join(dst, "rank-00001-of-00004", "model-00001-of-00001.safetensors")
	raw := testkit.ReadFile(t, shard)
	raw[len(raw)-5] ^= 0x40
	testkit.WriteFile(t, shard, raw)
	if code, _, _ := runCLI(t, "validate", "--quiet", "--rank", "2", src, dst); code != 0 {
		t.Errorf("--rank 2 after rank 1's file changed: exit %d, want 0 (it reads only rank 2's)", code)
	}
	code, _, errOut = runCLI(t, "validate", "--quiet", "--rank", "1", src, dst)
	if code != 1 {
		t.Errorf("--rank 1 after its file changed: exit %d, want 1", code)
	}
	assertCleanError(t, errOut, "rank 1: layer 2: slot")
	code, _, errOut = runCLI(t, "validate", "--quiet", "--rank", "4", src, dst)
	if code != 2 {
		t.Errorf("--rank 4 of 4: exit %d, want 2", code)
	}
	assertCleanError(t, errOut, "--rank 4: the output has 4 ranks (0..3)")
	whole := filepath.Join(dir, "whole")
	if code, _, errOut := runCLI(t, "convert", "--quiet", src, whole); code != 0 {
		t.Fatal(errOut)
	}
	code, _, errOut = runCLI(t, "validate", "--quiet", "--rank", "0", src, whole)
	if code != 2 {
		t.Errorf("--rank on a whole-model output: exit %d, want 2", code)
	}
	assertCleanError(t, errOut, "not a per-rank output")
}

// --layers and --device on a per-rank output: the layers recomposed are
// those --layers names (the report lists the others, whose bytes are
// still proven), a layer that is not a MoE layer and --device cuda
// without a GPU exit 2 as a whole-model validate does, and --device auto
// without one recomposes on the CPU with the fallback in the report.
func TestValidatePerRankLayersDevice(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(fixturesDir, "qwen3-moe") // MoE layers 1 and 2
	dst := filepath.Join(dir, "ep2tp2")
	if code, _, errOut := runCLI(t, "convert", "--quiet", "--ep", "2", "--moe-tp", "2", src, dst); code != 0 {
		t.Fatalf("convert: %s", errOut)
	}
	whole := filepath.Join(dir, "whole")
	if code, _, errOut := runCLI(t, "convert", "--quiet", src, whole); code != 0 {
		t.Fatalf("convert: %s", errOut)
	}
	var res struct {
		Slots          int      `json:"slots"`
		Device         string   `json:"device"`
		Selection      string   `json:"layer_selection"`
		Recomposed     []int    `json:"layers_recomposed"`
		NotRecomposed  []int    `json:"layers_not_recomposed"`
		Notes          []string `json:"notes"`
		RecomposedRows []struct {
			Layer  int    `json:"layer"`
			Device string `json:"device"`
		} `json:"recomposed"`
	}
	code, out, errOut := runCLI(t, "validate", "--quiet", "--json", "--device", "cpu", "--layers", "2", src, dst)
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("--layers 2: exit %d\n%s\n%s", code, out, errOut)
	}
	if res.Device != "cpu" || res.Selection != "2" || !slices.Equal(res.Recomposed, []int{2}) || !slices.Equal(res.NotRecomposed, []int{1}) ||
		len(res.RecomposedRows) != 1 || res.RecomposedRows[0].Layer != 2 || res.RecomposedRows[0].Device != "cpu" || res.Slots != 32 {
		t.Errorf("--layers 2: %+v", res)
	}
	code, out, _ = runCLI(t, "validate", "--quiet", "--device", "cpu", "--layers", "sample:1", src, dst)
	if code != 0 || !strings.Contains(out, "layer 1 routed experts from the ranks (cpu, replica 0 of each)") ||
		!strings.Contains(out, "layers not recomposed: 2 (--layers sample:1, or hash-routed); their slots' bytes are proven") {
		t.Errorf("--layers sample:1: exit %d\n%s", code, out)
	}
	// The same refusals, word for word, as on the whole-model output.
	for _, args := range [][]string{{"--layers", "7"}, {"--layers", "0"}, {"--device", "cuda"}, {"--device", "tpu"}} {
		if args[0] == "--device" && args[1] == "cuda" && cuda.Available() == nil {
			continue // a GPU is present: --device cuda runs
		}
		code, _, errOut := runCLI(t, append([]string{"validate", "--quiet"}, append(args, src, dst)...)...)
		wcode, _, wantErr := runCLI(t, append([]string{"validate", "--quiet"}, append(args, src, whole)...)...)
		if code != 2 || wcode != 2 || errOut != wantErr {
			t.Errorf("%v: exit %d %q; on the whole-model output exit %d %q", args, code, errOut, wcode, wantErr)
		}
		assertCleanError(t, errOut)
	}
	if cuda.Available() != nil {
		code, out, _ := runCLI(t, "validate", "--quiet", "--json", src, dst)
		res.Notes = nil
		if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Device != "cpu" || len(res.Notes) != 1 ||
			!strings.HasSuffix(res.Notes[0], "; running on the CPU (--device auto)") || !slices.Equal(res.Recomposed, []int{1, 2}) {
			t.Errorf("--device auto without a GPU: exit %d %+v", code, res)
		}
	}
	// --rank proves one rank's bytes on any machine: no device to resolve.
	if code, _, errOut := runCLI(t, "validate", "--quiet", "--device", "cuda", "--rank", "1", src, dst); code != 0 {
		t.Errorf("--device cuda --rank 1: exit %d %s", code, errOut)
	}
}
