package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

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
