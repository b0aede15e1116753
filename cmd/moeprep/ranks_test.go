package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A placement written by `moeprep placement` (its JSON and SGLang's file)
// is what convert --ep --placement-map writes into the contract, slot for
// slot; --placement STATS places the same way; refusals exit 2 in one line
// naming the numbers; --dry-run lists each rank's bytes.
func TestConvertPerRankCommand(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(fixturesDir, "qwen3-moe") // 8 experts, MoE layers 1 and 2 (layer 0 is dense)
	stats := filepath.Join(dir, "loads.json")
	if err := os.WriteFile(stats, []byte(`{"logical_count": [[0, 0, 0, 0, 0, 0, 0, 0], [100, 1, 1, 1, 1, 1, 1, 50], [1, 1, 1, 1, 1, 1, 90, 1]]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	sg := filepath.Join(dir, "sg.json")
	code, out, errOut := runCLI(t, "placement", stats, "--ep", "2", "--slots", "10", "--json", "--sglang", sg)
	if code != 0 {
		t.Fatalf("placement: exit %d: %s", code, errOut)
	}
	pj := filepath.Join(dir, "placement.json")
	if err := os.WriteFile(pj, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	var placed struct {
		P2L [][]int `json:"physical_to_logical_map"`
	}
	if err := json.Unmarshal([]byte(out), &placed); err != nil {
		t.Fatal(err)
	}
	contractMap := func(dst string) [][]int {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dst, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
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
