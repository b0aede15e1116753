package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// placement end to end: the text table, --json's schema, the engines'
// files written once and never over an existing file, and refusals of a
// shape that does not fit, each naming the numbers.
func TestPlacementCommand(t *testing.T) {
	dir := t.TempDir()
	stats := filepath.Join(dir, "loads.json")
	testkit.WriteFile(t, stats, []byte(`{"logical_count": [[100, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0]]}`))
	code, out, errOut := runCLI(t, "placement", stats, "--ep", "2", "--slots", "10")
	if code != 0 || !strings.Contains(out, "8 experts on 10 slots, 2 ranks of 5, global") || !strings.Contains(out, "mean ") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "placement", stats, "--ep", "2", "--slots", "10", "--json")
	var doc struct {
		Schema string    `json:"schema"`
		P2L    [][]int   `json:"physical_to_logical_map"`
		Imb    []float64 `json:"imbalance"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil || doc.Schema != "moeprep.placement/v1" || len(doc.P2L) != 2 {
		t.Fatalf("exit %d: %s", code, out)
	}
	// Layer 1 recorded nothing: it keeps the contiguous map.
	if got := doc.P2L[1]; len(got) != 10 || got[8] != 0 || got[9] != 1 || doc.Imb[1] != 0 {
		t.Errorf("unrecorded layer: %v, imbalance %v", got, doc.Imb[1])
	}
	sg := filepath.Join(dir, "sg.json")
	if code, _, errOut := runCLI(t, "placement", stats, "--ep", "2", "--slots", "10", "--sglang", sg); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if b, err := os.ReadFile(sg); err != nil || !strings.Contains(string(b), `"physical_to_logical_map"`) {
		t.Fatalf("%s: %v %s", sg, err, b)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ep", "2", "--slots", "10", "--sglang", sg}, "--sglang " + sg + ": exists; moeprep writes a new file only"},
		{[]string{"--ep", "3", "--slots", "10"}, "10 slots do not divide among 3 ranks"},
		{[]string{"--ep", "2", "--slots", "6"}, "6 slots cannot hold 8 experts"},
		{[]string{"--ep", "2", "--slots", "8", "--nodes", "2", "--n-group", "3"}, "8 experts do not divide into 3 groups"},
	} {
		code, _, errOut := runCLI(t, append([]string{"placement", stats}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
}

// The binary forms of recorded loads (SGLang's torch.save dump, TensorRT-
// LLM's statistics directory: placement/testdata) place exactly as the
// same loads written as JSON, and a refusal exits 2 naming the file.
func TestPlacementBinaryStats(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		stats, same string
	}{
		// stat.pt's two passes summed; layer 2 recorded nothing.
		{"../../placement/testdata/sglang/stat.pt", `{"logical_count": [[11, 22, 33, 44], [5, 0, 7, 2], [0, 0, 0, 0]]}`},
		// Both ranks' iterations 100 and 101 summed, per layer.
		{"../../placement/testdata/trtllm", `{"3": [9, 5, 2, 10], "5": [3, 7, 7, 1]}`},
	} {
		js := filepath.Join(dir, filepath.Base(tc.stats)+".json")
		testkit.WriteFile(t, js, []byte(tc.same))
		var outs []string
		for _, p := range []string{tc.stats, js} {
			code, out, errOut := runCLI(t, "placement", p, "--ep", "2", "--slots", "6", "--json")
			if code != 0 {
				t.Fatalf("%s: exit %d: %s", p, code, errOut)
			}
			outs = append(outs, out)
		}
		if outs[0] != outs[1] || !strings.Contains(outs[0], `"physical_to_logical_map"`) {
			t.Errorf("%s places\n%s\nthe same loads as JSON place\n%s", tc.stats, outs[0], outs[1])
		}
	}
	bad := "../../placement/testdata/sglang/negative.pt"
	code, _, errOut := runCLI(t, "placement", bad, "--ep", "2", "--slots", "4")
	if want := bad + ": logical_count: pass 1, layer 1, expert 2: count -5"; code != 2 || !strings.Contains(errOut, want) {
		t.Errorf("exit %d, %q; want 2 and %q", code, errOut, want)
	}
}
