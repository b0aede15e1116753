package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// fusedFixture fuses the HF DeepSeek-V3 bf16 fixture (MoE layers 1 and 2,
// 16 experts and a shared one: banks of 18 with --tp 2) into a temporary
// directory and returns SRC and DST.
func fusedFixture(t *testing.T) (src, dst string) {
	t.Helper()
	src = filepath.Join(fixturesDir, "deepseek-v3-bf16")
	dst = filepath.Join(t.TempDir(), "fused")
	if code, _, stderr := runCLI(t, "fuse-shared", "--tp", "2", "--no-progress", src, dst); code != 0 {
		t.Fatalf("fuse-shared: exit %d: %s", code, stderr)
	}
	return src, dst
}

// validate's GPU-run flags are documented in --help, a bad --cpu-check is a
// one-line usage error (exit 2), and with --device cpu every GPU-only flag
// is refused by name instead of being ignored.
func TestValidateCPUCheckFlags(t *testing.T) {
	code, stdout, _ := runCLI(t, "validate", "--help")
	if code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	// Flag help is wrapped to the terminal: compare with the lines joined.
	flat := strings.Join(strings.Fields(stdout), " ")
	for _, s := range []string{"--cpu-check", "auto (first and last, or all when <= 4), none", "--io-baseline", "-j, --jobs", "-q, --quiet",
		"--no-progress", "-o, --output FILE", "--json", "validate/SCHEMA.md"} {
		if !strings.Contains(flat, s) {
			t.Errorf("--help lacks %q", s)
		}
	}
	if strings.Contains(stdout, "--workers") {
		t.Error("--help still offers the deprecated --workers")
	}
	src := filepath.Join(fixturesDir, "deepseek-v3-fp8")
	code, _, stderr := runCLI(t, "validate", "--quiet", "--cpu-check", "sometimes", src, "--golden", filepath.Join(src, "reference"))
	if code != 2 {
		t.Errorf("--cpu-check sometimes: exit %d", code)
	}
	assertCleanError(t, stderr, "--cpu-check", "sometimes")

	dst := filepath.Join(t.TempDir(), "fused")
	if code, _, stderr := runCLI(t, "fuse-shared", "--tp", "4", "--no-progress", src, dst); code != 0 {
		t.Fatalf("fuse-shared: exit %d: %s", code, stderr)
	}
	for _, gpuFlag := range [][]string{{"--cpu-check", "none"}, {"--cpu-check", "auto"}, {"--io-baseline"}, {"--precision", "fp8"}, {"--precision", "f32"}} {
		args := append([]string{"validate", "--quiet", "--device", "cpu"}, gpuFlag...)
		code, stdout, stderr := runCLI(t, append(args, src, dst)...)
		if code != 2 || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q", gpuFlag, code, stdout)
		}
		assertCleanError(t, stderr, gpuFlag[0], "GPU runs", "--device cpu")
	}
	// bf16 is what the CPU comparison is anyway: saying so is no conflict.
	if code, _, stderr := runCLI(t, "validate", "--quiet", "--device", "cpu", "--precision", "bf16", "--tokens", "8", "--skip-bytes", src, dst); code != 0 {
		t.Errorf("--device cpu --precision bf16: exit %d: %s", code, stderr)
	}
}

// --no-progress is common to every command that reports progress, so a CI
// script can pass it everywhere: each such command takes it, and -q and
// --quiet, and then writes nothing to stderr on success.
func TestNoProgressEverywhere(t *testing.T) {
	src := filepath.Join(fixturesDir, "deepseek-v3-bf16")
	tmp := t.TempDir()
	dst := filepath.Join(tmp, "fused")
	runs := [][]string{
		{"inspect", "--no-progress", "--read", src},
		{"fuse-shared", "--tp", "2", "--no-progress", src, dst},
		{"validate", "--no-progress", "--device", "cpu", "--tokens", "8", src, dst},
		{"validate", "--quiet", "--device", "cpu", "--tokens", "8", src, dst},
		{"validate", "-q", "--device", "cpu", "--tokens", "8", src, dst},
		{"validate", "-q", "--bytes", src, dst},
	}
	for _, args := range runs {
		code, stdout, stderr := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		if stderr != "" {
			t.Errorf("%v: stderr not empty with --no-progress: %q", args, stderr)
		}
		if stdout == "" {
			t.Errorf("%v: no output on stdout", args)
		}
	}
}

// -j/--jobs is validate's parallelism, as convert's; --workers still works,
// with a notice naming the new flag, and both at once is an error.
func TestValidateJobsFlag(t *testing.T) {
	src, dst := fusedFixture(t)
	for _, tc := range []struct {
		args       []string
		code       int
		stderrHas  string
		stderrNone bool
	}{
		{[]string{"-j", "1"}, 0, "", true},
		{[]string{"--jobs", "3"}, 0, "", true},
		{[]string{"--workers", "2"}, 0, "--workers is deprecated: use -j/--jobs", false},
		{[]string{"-j", "2", "--workers", "2"}, 2, "--workers is the old name of --jobs", false},
		{[]string{"-j", "-1"}, 2, "--jobs -1", false},
		{[]string{"--jobs", "many"}, 2, `--jobs "many": want a whole number`, false},
	} {
		args := append(append([]string{"validate", "-q", "--device", "cpu", "--tokens", "8", "--skip-bytes"}, tc.args...), src, dst)
		code, _, stderr := runCLI(t, args...)
		if code != tc.code {
			t.Errorf("%v: exit %d, want %d: %s", tc.args, code, tc.code, stderr)
		}
		if tc.stderrNone && stderr != "" {
			t.Errorf("%v: stderr %q", tc.args, stderr)
		}
		if !strings.Contains(stderr, tc.stderrHas) {
			t.Errorf("%v: stderr %q lacks %q", tc.args, stderr, tc.stderrHas)
		}
		if tc.code == 2 {
			assertCleanError(t, stderr)
		}
	}
}

// readReport decodes a validate JSON report.
func readReport(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("not a JSON report: %v\n%s", err, b)
	}
	if doc["schema"] != "moeprep.validate/v1" {
		t.Fatalf("schema %v", doc["schema"])
	}
	return doc
}

// writeFile writes a file for a test.
