package main

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

// systemPython is Debian's interpreter, whose python3-torch carries
// torch.distributed with gloo; the consumer needs nothing else.
const systemPython = "/usr/bin/python3"

// consumerReady skips the test where the interpreter or its torch.distributed
// is missing: the script is the only thing in the project that needs them.
func consumerReady(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the consumer starts a process per rank")
	}
	if err := exec.Command(systemPython, "-c", "import torch.distributed as d, torch.multiprocessing; assert d.is_gloo_available()").Run(); err != nil {
		t.Skipf("%s has no torch.distributed with gloo (%v): the rank consumer cannot run here", systemPython, err)
	}
}

// consumerRun is one run of scripts/rank_consumer.py over DST with the
// fixture's goldens: its exit code, its output and every rank's summary.
type consumerRank struct {
	Rank         int            `json:"rank"`
	FilesRead    map[string]int `json:"files_read"`
	OwnDirRead   int            `json:"own_dir_bytes_read"`
	OwnDirBytes  int            `json:"own_dir_bytes"`
	Pass         bool           `json:"pass"`
	LayerResults []struct {
		Layer   int     `json:"layer"`
		Replica string  `json:"replica"`
		RelL2   float64 `json:"rel_l2"`
		Cosine  float64 `json:"cosine"`
		Pass    bool    `json:"pass"`
	} `json:"layers"`
}

func runConsumer(t *testing.T, dst, golden string) (int, string, []consumerRank) {
	t.Helper()
	js := filepath.Join(t.TempDir(), "ranks.json")
	cmd := exec.Command(systemPython, "../../scripts/rank_consumer.py", dst, "--golden", golden, "--json", js)
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("rank_consumer.py: %v", err)
		}
		code = ee.ExitCode()
	}
	var ranks []consumerRank
	if b, err := os.ReadFile(js); err == nil {
		if err := json.Unmarshal(b, &ranks); err != nil {
			t.Fatalf("%s: %v", js, err)
		}
	}
	return code, string(out), ranks
}

// The independent consumer (torch.distributed on gloo, one process a rank,
// each reading only its rank directory and the shared files) recomposes
// every MoE layer of per-rank outputs of the transformers-written fixtures
// and matches transformers' own MoE block output: EP only, EP x MoE-TP 2,
// redundant slots from moeprep placement (first and last replica), and
// fuse-shared with a shared-expert replica per rank; FP8 too (no MoE-TP:
// its 32-wide experts cannot be cut on 128-wide scale blocks).
func TestRankConsumerMatchesTransformers(t *testing.T) {
	consumerReady(t)
	dir := t.TempDir()
	// skewed loads: one or two hot experts a layer, keyed by the fixture's MoE layer index
	loads := map[string]string{
		"deepseek-v3-bf16": `{"1": [500,1,1,1,1,1,1,1,300,1,1,1,1,1,1,200], "2": [1,1,1,900,1,1,1,1,1,1,1,1,1,1,1,400]}`,
		"deepseek-v3-fp8":  `{"1": [1,1,1,1,1,700,1,1,1,1,1,1,1,1,1,1], "2": [1,1,1,1,1,1,1,1,1,1,1,1,80,90,1,1]}`,
		"qwen3-moe":        `{"1": [100,1,1,1,1,1,1,50], "2": [1,1,1,1,1,1,90,1]}`,
		"mixtral":          `{"0": [1,80,1,1,1,1,1,1], "1": [1,1,1,60,40,1,1,1]}`,
		"gpt-oss":          `{"0": [1,1,70,1,1,1,1,1], "1": [30,1,1,1,1,1,1,90]}`,
	}
	for _, tc := range []struct {
		fixture, name string
		args          []string
		place         []string // moeprep placement flags; the map goes to --placement-map
		ranks         int
	}{
		{"deepseek-v3-bf16", "ep4", []string{"convert", "--ep", "4"}, nil, 4},
		{"deepseek-v3-bf16", "ep4-tp2-gate-up", []string{"convert", "--ep", "4", "--moe-tp", "2", "--layout", "gate-up"}, nil, 8},
		{"deepseek-v3-bf16", "ep4-slots24-tp2", []string{"convert", "--ep", "4", "--moe-tp", "2"}, []string{"--ep", "4", "--slots", "24"}, 8},
		{"deepseek-v3-bf16", "fuse-shared-ep4-tp2", []string{"fuse-shared", "--ep", "4", "--moe-tp", "2"}, nil, 8},
		// FP8 128x128 blocks dequantised by the consumer, transposed stacks, the unfused shared expert's FP8 too
		{"deepseek-v3-fp8", "fuse-shared-ep4-in-out-gate-up", []string{"fuse-shared", "--ep", "4", "--orientation", "in-out", "--layout", "gate-up"}, nil, 4},
		{"deepseek-v3-fp8", "ep4-slots24", []string{"convert", "--ep", "4"}, []string{"--ep", "4", "--slots", "24"}, 4},
		{"qwen3-moe", "ep2", []string{"convert", "--ep", "2"}, nil, 2},
		{"qwen3-moe", "ep2-tp2", []string{"convert", "--ep", "2", "--moe-tp", "2"}, nil, 4},
		{"qwen3-moe", "ep2-slots10-up-gate", []string{"convert", "--ep", "2", "--layout", "up-gate"}, []string{"--ep", "2", "--slots", "10"}, 2},
		{"mixtral", "ep2", []string{"convert", "--ep", "2"}, nil, 2},
		{"mixtral", "ep2-tp2-gate-up", []string{"convert", "--ep", "2", "--moe-tp", "2", "--layout", "gate-up"}, nil, 4},
		{"mixtral", "ep4-slots12", []string{"convert", "--ep", "4"}, []string{"--ep", "4", "--slots", "12"}, 4},
		// gpt-oss: router bias, clamped SwiGLU, expert biases; under --moe-tp the down bias on part 0 alone
		{"gpt-oss", "ep2-tp2", []string{"convert", "--ep", "2", "--moe-tp", "2"}, nil, 4},
		{"gpt-oss", "ep2-slots10-tp2-gate-up", []string{"convert", "--ep", "2", "--moe-tp", "2", "--layout", "gate-up"}, []string{"--ep", "2", "--slots", "10"}, 4},
	} {
		t.Run(tc.fixture+"/"+tc.name, func(t *testing.T) {
			src := filepath.Join(fixturesDir, tc.fixture)
			dst := filepath.Join(dir, tc.fixture+"-"+tc.name)
			args := append(append([]string{}, tc.args...), "--quiet", src, dst)
			if tc.place != nil {
				stats := filepath.Join(dir, tc.fixture+"-loads.json")
				testkit.WriteFile(t, stats, []byte(loads[tc.fixture]))
				code, out, errOut := runCLI(t, append([]string{"placement", stats, "--json"}, tc.place...)...)
				if code != 0 {
					t.Fatalf("placement: exit %d: %s", code, errOut)
				}
				pm := filepath.Join(dir, tc.fixture+"-"+tc.name+"-placement.json")
				testkit.WriteFile(t, pm, []byte(out))
				args = append(args, "--placement-map", pm)
			}
			if code, _, errOut := runCLI(t, args...); code != 0 {
				t.Fatalf("%v: exit %d: %s", args, code, errOut)
			}
			code, out, ranks := runConsumer(t, dst, filepath.Join(src, "reference"))
			if code != 0 || !strings.Contains(out, "PASS") {
				t.Fatalf("consumer: exit %d:\n%s", code, out)
			}
			if len(ranks) != tc.ranks {
				t.Fatalf("consumer ran %d ranks, want %d:\n%s", len(ranks), tc.ranks, out)
			}
			if n := len(ranks[0].LayerResults); n != 4 { // 2 MoE layers x first and last replica
				t.Errorf("rank 0 compared %d layer runs, want 4", n)
			}
			for _, l := range ranks[0].LayerResults {
				if !l.Pass || l.RelL2 > 1e-5 || l.Cosine < 1-1e-9 {
					t.Errorf("layer %d (%s replica): rel L2 %.3g, cosine %.12f", l.Layer, l.Replica, l.RelL2, l.Cosine)
				}
			}
			// each rank opened config.json, the shared files and its own directory, nothing else,
			// and read its directory's bytes once
			for _, r := range ranks {
				own := filepath.Base(filepath.Dir(mustRankIndex(t, dst, r.Rank)))
				for f := range r.FilesRead {
					if !strings.HasPrefix(f, own+"/") && strings.Contains(f, "/") {
						t.Errorf("rank %d opened %s", r.Rank, f)
					}
				}
				if r.OwnDirRead != r.OwnDirBytes || r.OwnDirBytes == 0 {
					t.Errorf("rank %d read %d bytes of its %d-byte directory", r.Rank, r.OwnDirRead, r.OwnDirBytes)
				}
			}
		})
	}
}

// mustRankIndex is rank r's index path in DST, from the contract.
func mustRankIndex(t *testing.T, dst string, r int) string {
	t.Helper()
	doc := testkit.ReadJSON(t, filepath.Join(dst, "config.json"))
	ep := doc["moeprep"].(map[string]any)["expert_parallel"].(map[string]any)
	return ep["rank_files"].([]any)[r].(map[string]any)["index"].(string)
}

// The consumer's comparison can fail: a rank file whose expert bytes were
// overwritten, or a contract whose placement map names the wrong expert for
// two slots, makes it exit 1 saying FAIL.
func TestRankConsumerFailsOnDamage(t *testing.T) {
	consumerReady(t)
	src := filepath.Join(fixturesDir, "qwen3-moe")
	golden := filepath.Join(src, "reference")
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dst string)
	}{
		{"rank 1's shard overwritten", func(t *testing.T, dst string) {
			shard := filepath.Join(dst, "rank-00001-of-00002", "model-00001-of-00001.safetensors")
			b := testkit.ReadFile(t, shard)
			body := 8 + int(binary.LittleEndian.Uint64(b[:8]))
			for i := body; i < len(b); i++ {
				b[i] = 0x3f // bf16 0x3f3f = 0.746: finite, wrong
			}
			testkit.WriteFile(t, shard, b)
		}},
		{"experts 0 and 7 swapped in the map", func(t *testing.T, dst string) {
			doc := testkit.ReadJSON(t, filepath.Join(dst, "config.json"))
			ep := doc["moeprep"].(map[string]any)["expert_parallel"].(map[string]any)
			row := ep["physical_to_logical_map"].([]any)[0].([]any)
			row[0], row[7] = row[7], row[0]
			b, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			testkit.WriteFile(t, filepath.Join(dst, "config.json"), b)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "ep2")
			if code, _, errOut := runCLI(t, "convert", "--ep", "2", "--quiet", src, dst); code != 0 {
				t.Fatalf("convert: exit %d: %s", code, errOut)
			}
			tc.damage(t, dst)
			code, out, ranks := runConsumer(t, dst, golden)
			if code != 1 || !strings.Contains(out, "\nFAIL ") || len(ranks) != 2 || ranks[0].Pass {
				t.Fatalf("consumer on a damaged DST: exit %d, want 1 from a comparison that failed:\n%s", code, out)
			}
			worst := 0.0
			for _, l := range ranks[0].LayerResults {
				worst = max(worst, l.RelL2)
			}
			if !(worst > 1e-2) { // NaN counts as failed too, but a finite wrong value is what this damage gives
				t.Errorf("worst relative L2 %g: the damage should move a layer past 1e-2:\n%s", worst, out)
			}
		})
	}
}

// gpt-oss under --moe-tp: the down bias lives on part 0 alone. A rank file
// whose part-1 down biases are part 0's (the bias added twice in the sum)
// makes the consumer exit 1 saying FAIL.
func TestRankConsumerDownBiasOnce(t *testing.T) {
	consumerReady(t)
	src := filepath.Join(fixturesDir, "gpt-oss")
	dst := filepath.Join(t.TempDir(), "ep2-tp2")
	if code, _, errOut := runCLI(t, "convert", "--ep", "2", "--moe-tp", "2", "--quiet", src, dst); code != 0 {
		t.Fatalf("convert: exit %d: %s", code, errOut)
	}
	shard := func(r int) string {
		return filepath.Join(dst, layout.RankDir(r, 4), "model-00001-of-00001.safetensors")
	}
	bias := func(r int) (int64, int64) { // the byte range of rank r's layer-1 down-bias stack
		f, err := safetensors.Open(shard(r))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		ti, ok := f.Lookup("model.layers.1.mlp.experts.all_down.bias")
		if !ok {
			t.Fatal("no down-bias stack")
		}
		return f.DataStart + ti.Begin, f.DataStart + ti.End
	}
	a0, b0 := bias(0)
	a1, b1 := bias(1)
	p0 := testkit.ReadFile(t, shard(0))
	p1 := testkit.ReadFile(t, shard(1))
	if b1-a1 != b0-a0 || strings.Trim(string(p1[a1:b1]), "\x00") != "" {
		t.Fatalf("rank 1's down biases are not %d zero bytes", b0-a0)
	}
	copy(p1[a1:b1], p0[a0:b0])
	testkit.WriteFile(t, shard(1), p1)
	code, out, ranks := runConsumer(t, dst, filepath.Join(src, "reference"))
	if code != 1 || !strings.Contains(out, "\nFAIL ") || len(ranks) != 4 || ranks[0].Pass {
		t.Fatalf("consumer with the down bias on two parts: exit %d, want 1:\n%s", code, out)
	}
	for _, l := range ranks[0].LayerResults {
		if l.Pass == (l.Layer == 1) {
			t.Errorf("layer %d: pass %v (rel L2 %.3g); only layer 1's biases were doubled", l.Layer, l.Pass, l.RelL2)
		}
	}
}
