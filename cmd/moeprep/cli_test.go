package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/fixtures/hf"
	"github.com/moeprep/moeprep/internal/testkit"
)

// runCLI runs one command line in-process and returns exit code, stdout, stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// assertCleanError checks the error contract: one line on stderr, starting
// "moeprep: ", naming what it must name, never a panic or stack trace.
func assertCleanError(t *testing.T, stderr string, mustName ...string) {
	t.Helper()
	// Notices that change what was certified (validate's CPU fallback) may
	// stand before it; the error is the last line, and the only one.
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	errLines := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "moeprep: ") {
			errLines++
		}
	}
	if !strings.HasSuffix(stderr, "\n") || errLines != 1 || !strings.HasPrefix(lines[len(lines)-1], "moeprep: ") {
		t.Errorf("stderr does not end in one 'moeprep: ' line: %q", stderr)
	}
	for _, bad := range []string{"panic", "goroutine ", "internal error"} {
		if strings.Contains(stderr, bad) {
			t.Errorf("stderr shows %q: %q", bad, stderr)
		}
	}
	for _, s := range mustName {
		if !strings.Contains(stderr, s) {
			t.Errorf("stderr should name %q: %q", s, stderr)
		}
	}
}

const fixturesDir = "../../fixtures/hf"

func TestInspectJSONOnHFFixtures(t *testing.T) {
	type want struct {
		Family, ModelType, Format, DType, Quant  string
		Experts, Shared, TopK, NGroup, TopKGroup int
		Scoring                                  string
		RSF                                      float64
		Layers                                   []int
		Tensors                                  int
	}
	dirs, _ := filepath.Glob(filepath.Join(fixturesDir, "*", "config.json"))
	if len(dirs) != len(hf.All()) {
		t.Fatalf("found %d HF fixtures, the index knows %d: keep them in step", len(dirs), len(hf.All()))
	}
	// inspect must report each fixture as its row in the index says
	// (fixtures/hf/index.go; model_type is the wrapper's, the family its text
	// model's).
	for _, fx := range hf.All() {
		name, w := fx.Dir, want{fx.Family, fx.ModelType, string(fx.Files), fx.DType, string(fx.Format), fx.Experts, fx.Shared,
			fx.TopK, fx.NGroup, fx.TopKGroup, fx.Scoring, fx.RSF, fx.MoELayers, fx.Tensors}
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, "inspect", "--json", filepath.Join(fixturesDir, name))
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			var got struct {
				Family       string  `json:"family"`
				ModelType    string  `json:"model_type"`
				Format       string  `json:"format"`
				DType        string  `json:"dtype"`
				Quantization string  `json:"quantization"`
				NumExperts   int     `json:"num_experts"`
				NumShared    int     `json:"num_shared_experts"`
				TopK         int     `json:"top_k"`
				NGroup       int     `json:"n_group"`
				TopKGroup    int     `json:"topk_group"`
				Scoring      string  `json:"scoring"`
				RSF          float64 `json:"routed_scaling_factor"`
				MoELayers    []int   `json:"moe_layers"`
				NumTensors   int     `json:"num_tensors"`
				TotalBytes   int64   `json:"total_bytes"`
				SharedRouted bool    `json:"shared_routed"`
				RouterScaled bool    `json:"router_scaled"`
			}
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, stdout)
			}
			have := want{got.Family, got.ModelType, got.Format, got.DType, got.Quantization, got.NumExperts, got.NumShared,
				got.TopK, got.NGroup, got.TopKGroup, got.Scoring, got.RSF, got.MoELayers, got.NumTensors}
			if !reflect.DeepEqual(have, w) {
				t.Errorf("inspect --json:\n got %+v\nwant %+v", have, w)
			}
			if got.TotalBytes <= 0 {
				t.Errorf("total_bytes = %d", got.TotalBytes)
			}
			// Only Inkling's router weights its shared experts and carries a scale tensor.
			if inkling := name == "inkling-text" || name == "inkling-mm-model"; got.SharedRouted != inkling || got.RouterScaled != inkling {
				t.Errorf("shared_routed %v, router_scaled %v", got.SharedRouted, got.RouterScaled)
			}
		})
	}
}

func TestInspectText(t *testing.T) {
	code, stdout, stderr := runCLI(t, "inspect", filepath.Join(fixturesDir, "deepseek-v3-fp8"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, s := range []string{"deepseek (model_type deepseek_v3)", "fp8_e4m3, quantization fp8_block_128x128", "routed experts:  16", "MoE layers:      2 of 3: 1-2", "4 groups keep 2"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("text output lacks %q:\n%s", s, stdout)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"inspect"}, "takes one checkpoint directory"},
		{[]string{"inspect", "a", "b"}, "takes one checkpoint directory"},
		{[]string{"inspect", "--bogus", "x"}, "unknown flag: --bogus"},
		{[]string{"nosuchcommand"}, "unknown command"},
		{[]string{"inspect", "/nonexistent/ckpt"}, "/nonexistent/ckpt"},
	}
	for _, tt := range tests {
		code, _, stderr := runCLI(t, tt.args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2", tt.args, code)
		}
		assertCleanError(t, stderr, tt.want)
	}
}

// brokenCheckpoint puts one broken weight file next to a valid config.json.
func brokenCheckpoint(t *testing.T, src, asName string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := testkit.ReadFile(t, filepath.Join(fixturesDir, "qwen3-moe", "config.json"))
	testkit.WriteFile(t, filepath.Join(dir, "config.json"), cfg)
	b := testkit.ReadFile(t, src)
	testkit.WriteFile(t, filepath.Join(dir, asName), b)
	return dir
}

// Every deliberately broken file of the readers' testdata is refused by the
// CLI with exit 2 and one line naming the file: no panic, whatever the damage.
func TestBrokenFilesExit2(t *testing.T) {
	cases := map[string]string{}
	st, _ := filepath.Glob("../../safetensors/testdata/broken/*.safetensors")
	for _, f := range st {
		cases[f] = "model.safetensors"
	}
	tb, _ := filepath.Glob("../../torchbin/testdata/*.bin")
	for _, f := range tb {
		cases[f] = "pytorch_model.bin"
	}
	if pt, _ := filepath.Glob("../../torchbin/testdata/*.pt"); len(pt) > 0 {
		for _, f := range pt {
			cases[f] = "pytorch_model.bin"
		}
	}
	if len(st) < 20 || len(tb) < 10 {
		t.Fatalf("expected the readers' broken testdata (found %d safetensors, %d torch files)", len(st), len(tb))
	}
	for src, as := range cases {
		t.Run(filepath.Base(src), func(t *testing.T) {
			dir := brokenCheckpoint(t, src, as)
			code, _, stderr := runCLI(t, "inspect", dir)
			if code == 0 {
				// A well-formed torch file (the readers' good cases) still cannot
				// be a Qwen3 checkpoint: planning must refuse it, naming a layer.
				t.Fatalf("accepted a checkpoint holding only %s", src)
			}
			if code != 2 {
				t.Errorf("exit %d, want 2 (%s)", code, stderr)
			}
			assertCleanError(t, stderr)
			if !strings.Contains(stderr, as) && !strings.Contains(stderr, "layer") {
				t.Errorf("error names neither the file nor a layer: %q", stderr)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	code, stdout, _ := runCLI(t, "version")
	if code != 0 || !strings.HasPrefix(stdout, "moeprep ") {
		t.Fatalf("version: exit %d, %q", code, stdout)
	}
}

// The main job end to end through the CLI: fuse-shared then validate, with the
// exit codes and error lines users script against.
func TestFuseSharedThenValidate(t *testing.T) {
	src := filepath.Join(fixturesDir, "deepseek-v3-fp8")
	dst := filepath.Join(t.TempDir(), "fused")
	code, stdout, stderr := runCLI(t, "fuse-shared", "--tp", "4", "--no-progress", "--json", src, dst)
	if code != 0 {
		t.Fatalf("fuse-shared: exit %d: %s", code, stderr)
	}
	var sum struct {
		Fused  int  `json:"num_fused_shared_experts"`
		Folded bool `json:"routed_scaling_factor_folded"`
		Bytes  int64
	}
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil || sum.Fused != 4 || !sum.Folded {
		t.Fatalf("fuse-shared --json: %v %+v\n%s", err, sum, stdout)
	}
	code, stdout, stderr = runCLI(t, "validate", "--quiet", src, dst, "--golden", filepath.Join(src, "reference"))
	if code != 0 || strings.Count(stdout, "PASS") != 9 || !strings.Contains(stdout, "bytes: PASS") || strings.Count(stdout, "coverage ") != 2 {
		t.Fatalf("validate: exit %d\n%s%s", code, stdout, stderr)
	}
	// DST exists now: refused without --force, naming it.
	code, _, stderr = runCLI(t, "fuse-shared", "--tp", "4", "--no-progress", src, dst)
	if code != 2 {
		t.Errorf("existing DST: exit %d", code)
	}
	assertCleanError(t, stderr, dst)
	// validate --device cuda is not there yet: a usage-level error, exit 2.
	code, _, stderr = runCLI(t, "validate", "--quiet", "--device", "cuda", src, dst)
	if code != 2 {
		t.Errorf("--device cuda: exit %d", code)
	}
	assertCleanError(t, stderr, "cuda")
}

func TestFuseSharedRefusesFamilies(t *testing.T) {
	for name, want := range map[string]string{"mixtral": "shared expert", "qwen3-moe": "shared expert", "qwen2-moe": "gate",
		"inkling-text": "weights each shared expert per token"} {
		dst := filepath.Join(t.TempDir(), "out")
		code, _, stderr := runCLI(t, "fuse-shared", "--no-progress", filepath.Join(fixturesDir, name), dst)
		if code != 2 {
			t.Errorf("%s: exit %d, want 2", name, code)
		}
		assertCleanError(t, stderr, want)
		if _, err := os.Stat(dst); err == nil {
			t.Errorf("%s: refused run left %s behind", name, dst)
		}
	}
}

// A check failure is exit 1, distinct from unusable input (2): validate a
// converted checkpoint against the goldens of a different model.
func TestValidateMismatchExit1(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "stacked")
	if code, _, stderr := runCLI(t, "convert", "--no-progress", filepath.Join(fixturesDir, "deepseek-v3-bf16"), dst); code != 0 {
		t.Fatalf("convert: %s", stderr)
	}
	code, stdout, stderr := runCLI(t, "validate", "--quiet", dst, "--golden", filepath.Join(fixturesDir, "deepseek-v3-fp8", "reference"))
	if code != 1 || !strings.Contains(stdout, "FAIL") {
		t.Fatalf("bf16 model against fp8 goldens: exit %d\n%s%s", code, stdout, stderr)
	}
	assertCleanError(t, stderr, "failed")
}

// The broken sharded checkpoints of safetensors' testdata (index and shards
// disagreeing, a missing shard, path traversal, ...) through the CLI: exit 2,
// one line naming the index or shard.
func TestBrokenShardedExit2(t *testing.T) {
	dirs, _ := filepath.Glob("../../safetensors/testdata/broken/index-*")
	if len(dirs) < 8 {
		t.Fatalf("expected the broken sharded testdata, found %d", len(dirs))
	}
	cfg := testkit.ReadFile(t, filepath.Join(fixturesDir, "qwen3-moe", "config.json"))
	for _, src := range dirs {
		t.Run(filepath.Base(src), func(t *testing.T) {
			dir := t.TempDir()
			entries, err := os.ReadDir(src)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				b := testkit.ReadFile(t, filepath.Join(src, e.Name()))
				testkit.WriteFile(t, filepath.Join(dir, e.Name()), b)
			}
			testkit.WriteFile(t, filepath.Join(dir, "config.json"), cfg)
			code, _, stderr := runCLI(t, "inspect", dir)
			if code != 2 {
				t.Fatalf("exit %d, want 2: %s", code, stderr)
			}
			assertCleanError(t, stderr, ".safetensors")
		})
	}
}
