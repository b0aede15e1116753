package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// A gpt-oss-style repo whose original/ and metal/ folders each hold another
// copy of the model: the default copies them and says so by name; --exclude
// leaves them out, the contract lists each file left out, and validate
// passes such a DST (noting what was left out) while still failing one that
// lost a file by accident or whose contract names a file SRC lacks.
func TestConvertExclude(t *testing.T) {
	src := filepath.Join(t.TempDir(), "gpt-oss")
	testkit.CopyDir(t, filepath.Join("..", "..", "fixtures", "hf", "gpt-oss"), src)
	model := testkit.ReadFile(t, filepath.Join(src, "model.safetensors"))
	for _, f := range []string{"original/model.safetensors", "metal/model.bin"} {
		testkit.WriteFile(t, filepath.Join(src, f), model)
	}
	testkit.WriteFile(t, filepath.Join(src, "original", "config.json"), []byte("{}\n"))

	all := filepath.Join(t.TempDir(), "all")
	code, out, errOut := runCLI(t, "convert", "-q", src, all)
	if code != 0 || !strings.Contains(errOut, "convert: copying original/, 274 kB of weights (2 files); ") || !strings.Contains(errOut, "--exclude 'original' leaves it out") ||
		!strings.Contains(errOut, "convert: copying metal/, 274 kB of weights (1 file); --exclude 'metal' leaves it out\n") || !strings.Contains(out, "copied 6 files, ") {
		t.Fatalf("default: exit %d\n%s\n%s", code, out, errOut)
	}

	dst := filepath.Join(t.TempDir(), "slim")
	code, out, errOut = runCLI(t, "convert", "-q", "--exclude", "original", "--exclude", "metal/*", src, dst)
	if code != 0 || strings.Contains(errOut, "copying") || !strings.Contains(out, "excluded 3 files: metal/model.bin, original/config.json, original/model.safetensors") {
		t.Fatalf("--exclude: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, f := range []string{"original", "metal"} {
		if _, err := os.Stat(filepath.Join(dst, f)); !os.IsNotExist(err) {
			t.Errorf("DST holds %s: %v", f, err)
		}
	}
	cfg := testkit.ReadJSON(t, filepath.Join(dst, "config.json"))
	ex, _ := cfg["moeprep"].(map[string]any)["excluded_files"].([]any)
	if len(ex) != 3 || ex[0] != "metal/model.bin" || ex[2] != "original/model.safetensors" {
		t.Errorf("contract excluded_files %v", ex)
	}
	code, out, errOut = runCLI(t, "validate", "--device", "cpu", src, dst)
	if code != 0 || !strings.Contains(out, "DST leaves out 3 of SRC's files on purpose") {
		t.Fatalf("validate: exit %d\n%s\n%s", code, out, errOut)
	}

	// A file lost by accident still fails, naming it.
	lost := filepath.Join(t.TempDir(), "lost")
	testkit.CopyDir(t, dst, lost)
	if err := os.Remove(filepath.Join(lost, "generation_config.json")); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := runCLI(t, "validate", "--device", "cpu", "--bytes", src, lost); code != 1 || !strings.Contains(out, "generation_config.json") {
		t.Errorf("a lost file: exit %d\n%s", code, out)
	}
	// A contract naming a file SRC lacks fails too.
	forged := filepath.Join(t.TempDir(), "forged")
	testkit.CopyDir(t, dst, forged)
	p := filepath.Join(forged, "config.json")
	b := testkit.ReadFile(t, p)
	b = bytes.Replace(b, []byte(`"metal/model.bin",`), []byte(`"metal/model.bin", "metal/other.bin",`), 1)
	testkit.WriteFile(t, p, b)
	if code, out, errOut := runCLI(t, "validate", "--device", "cpu", "--bytes", src, forged); code != 1 || !strings.Contains(out+errOut, "metal/other.bin") {
		t.Errorf("a forged excluded_files: exit %d\n%s\n%s", code, out, errOut)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--exclude", "nothing"}, `--exclude "nothing" names no file of SRC that moeprep would copy`},
		{[]string{"--exclude", "*.safetensors"}, `--exclude "*.safetensors" names model.safetensors, which moeprep reads to write the output`},
		{[]string{"--exclude", "../x"}, `--exclude "../x": not a pattern of paths inside SRC`},
		{[]string{"--exclude", "[a"}, `--exclude "[a": not a pattern of paths inside SRC`},
	} {
		code, _, errOut := runCLI(t, append(append([]string{"convert", "-q", "--dry-run"}, tc.args...), src, filepath.Join(t.TempDir(), "x"))...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %q; want %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestMoELayersBeyondNotice: a Llama 4 config trimmed for tests (moe_layers
// naming layers past num_hidden_layers, as transformers 5.17 writes it)
// runs every command, each saying once on stderr, even with -q, what it
// ignored, and carrying it in its JSON (notices, validate's notes).
func TestMoELayersBeyondNotice(t *testing.T) {
	src := filepath.Join(t.TempDir(), "llama4-trimmed")
	testkit.CopyDir(t, filepath.Join(fixturesDir, "llama4-text"), src)
	testkit.EditJSON(t, filepath.Join(src, "config.json"), func(m map[string]any) { m["moe_layers"] = []any{1, 3, 5, 7} })
	const note = "config.json: moe_layers lists 5 and 7 beyond num_hidden_layers=4: ignored, as transformers ignores them"
	dst := filepath.Join(t.TempDir(), "out")
	for _, c := range []struct {
		args []string
		key  string // the JSON field that carries it
	}{
		{[]string{"inspect", "--json", src}, "notices"},
		{[]string{"convert", "-q", "--dry-run", "--json", src, dst}, "notices"},
		{[]string{"convert", "-q", "--json", src, dst}, "notices"},
		{[]string{"validate", "-q", "--device", "cpu", "--json", "--golden", src, src, dst}, "notes"},
	} {
		code, out, stderr := runCLI(t, c.args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", c.args, code, stderr)
		}
		if want := c.args[0] + ": " + note + "\n"; stderr != want {
			t.Errorf("%v: stderr %q, want %q", c.args, stderr, want)
		}
		var doc map[string]any
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatal(err)
		}
		got, _ := doc[c.key].([]any)
		if !slices.Contains(got, any(note)) {
			t.Errorf("%v: %s %v, want %q", c.args, c.key, doc[c.key], note)
		}
		if c.args[0] == "inspect" && fmt.Sprint(doc["moe_layers"]) != "[1 3]" {
			t.Errorf("inspect --json: moe_layers %v, want [1 3]", doc["moe_layers"])
		}
	}
}

// convert --dtype: its help says it names the dtype dequantised tensors
// get and that nothing else changes; a dtype it does not write is a usage
// error; a run prints (and --json reports) what it dequantised, and
// validate proves it; --dry-run plans the larger output.
func TestConvertDType(t *testing.T) {
	_, help, _ := runCLI(t, "convert", "--help")
	for _, want := range []string{"--dtype", "the dtype the dequantised tensors get", "rounded once to nearest even", "input_scale", "quantization_config", "every other tensor stays byte for byte"} {
		if !strings.Contains(strings.Join(strings.Fields(help), " "), want) {
			t.Errorf("convert --help does not say %q", want)
		}
	}
	src := filepath.Join(fixturesDir, "deepseek-v3-fp8")
	dir := t.TempDir()
	code, _, stderr := runCLI(t, "convert", "--dtype", "fp8", src, filepath.Join(dir, "x"))
	if code != 2 {
		t.Errorf("--dtype fp8: exit %d", code)
	}
	assertCleanError(t, stderr, `--dtype "fp8"`, "bf16, f16 or f32")
	code, out, stderr := runCLI(t, "fuse-shared", "--dry-run", "--json", "--tp", "2", "--dtype", "bf16", src, filepath.Join(dir, "plan"))
	var plan map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &plan) != nil || plan["dtype"] != "bf16" || plan["dequantized_tensors"] == nil {
		t.Fatalf("--dry-run --dtype bf16: exit %d, %s %s", code, out, stderr)
	}
	dst := filepath.Join(dir, "out")
	code, out, stderr = runCLI(t, "convert", "-q", "--json", "--dtype", "BF16", src, dst)
	var sum map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &sum) != nil || sum["dtype"] != "bf16" || sum["dequantized_tensors"].(float64) <= 0 {
		t.Fatalf("convert --dtype BF16: exit %d, %s %s", code, out, stderr)
	}
	if code, out, stderr := runCLI(t, "validate", "-q", "--device", "cpu", src, dst); code != 0 || !strings.Contains(out, "dequantised") {
		t.Fatalf("validate: exit %d\n%s%s", code, out, stderr)
	}
	if code, out, _ := runCLI(t, "inspect", dst); code != 0 || !strings.Contains(out, "dequantised:     to BF16 (nearest-even): 96 expert weights from fp8_block_128x128") {
		t.Errorf("inspect: exit %d\n%s", code, out)
	}
}

// TestOrientationFlag: --orientation in-out converts, says so in the
// summary (text and JSON), the plan and inspect, and validates; a value
// that is not an orientation, and a format packed along the row, are
// refused in one line, exit 2.
func TestOrientationFlag(t *testing.T) {
	src := filepath.Join(fixturesDir, "deepseek-v3-fp8")
	dst := filepath.Join(t.TempDir(), "kmajor")
	code, out, stderr := runCLI(t, "fuse-shared", "-q", "--tp", "2", "--layout", "gate-up", "--orientation", "in-out", "--dry-run", src, dst)
	if code != 0 || !strings.Contains(out, "(layout gate-up, in-out)") {
		t.Fatalf("--dry-run: exit %d: %s%s", code, out, stderr)
	}
	code, out, stderr = runCLI(t, "fuse-shared", "-q", "--tp", "2", "--layout", "gate-up", "--orientation", "in-out", "--json", src, dst)
	var sum struct{ Orientation string }
	if code != 0 || json.Unmarshal([]byte(out), &sum) != nil || sum.Orientation != "in-out" {
		t.Fatalf("fuse-shared --orientation in-out: exit %d: %s%s", code, out, stderr)
	}
	if code, out, stderr = runCLI(t, "inspect", dst); code != 0 || !strings.Contains(out, "layout gate-up, in-out ([in, out] per expert)") {
		t.Errorf("inspect: exit %d: %s%s", code, out, stderr)
	}
	if code, out, stderr = runCLI(t, "validate", "-q", "--device", "auto", "--golden", src, src, dst); code != 0 || !strings.Contains(out, "bytes: PASS") {
		t.Errorf("validate: exit %d: %s%s", code, out, stderr)
	}
	code, _, stderr = runCLI(t, "convert", "--orientation", "k-major", src, filepath.Join(t.TempDir(), "x"))
	if code != 2 {
		t.Errorf("--orientation k-major: exit %d", code)
	}
	assertCleanError(t, stderr, "--orientation", "out-in or in-out")
}

// DST as rclone and hf download --local-dir take it: an empty directory is
// filled, missing parents are made; a directory holding anything, or a
// path through a file, is still refused.
func TestConvertDestinations(t *testing.T) {
	src := filepath.Join("..", "..", "fixtures", "hf", "qwen3-moe")
	base := t.TempDir()
	empty := filepath.Join(base, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	full := filepath.Join(base, "full")
	testkit.WriteFile(t, filepath.Join(full, "notes.txt"), []byte("mine"))
	file := filepath.Join(base, "file")
	testkit.WriteFile(t, file, "")
	for _, tc := range []struct {
		dst  string
		code int
		want string
	}{
		{empty, 0, "wrote " + empty},
		{filepath.Join(base, "a", "b", "out"), 0, "wrote " + filepath.Join(base, "a", "b", "out")},
		{full, 2, "full: already exists"},
		{filepath.Join(file, "out"), 2, "cannot create the output directory"},
	} {
		code, out, errOut := runCLI(t, "convert", "-q", src, tc.dst)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("%s: exit %d, %s%s; want %d and %q", tc.dst, code, out, errOut, tc.code, tc.want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(full, "notes.txt")); err != nil || string(b) != "mine" {
		t.Errorf("the refused DST's file: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(empty, "config.json")); err != nil {
		t.Errorf("the empty DST was not filled: %v", err)
	}
	// Rerunning a finished convert says how to check it instead.
	code, _, errOut := runCLI(t, "convert", "-q", src, empty)
	if code != 2 || !strings.Contains(errOut, "already exists and is moeprep output; --resume checks it against this run's plan") {
		t.Errorf("rerun: exit %d, %s", code, errOut)
	}
	if code, out, errOut := runCLI(t, "convert", "--resume", src, empty); code != 0 || !strings.Contains(out, "is already complete") {
		t.Errorf("--resume of the finished run: exit %d\n%s\n%s", code, out, errOut)
	}
}
