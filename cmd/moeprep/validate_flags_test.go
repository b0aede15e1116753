package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// validate's GPU-run flags: documented in --help, a bad --cpu-check is a
// one-line usage error (exit 2), and on the CPU --io-baseline leaves a note
// in the JSON report and no timings.
func TestValidateCPUCheckFlags(t *testing.T) {
	code, stdout, _ := runCLI(t, "validate", "--help")
	if code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, s := range []string{"--cpu-check", "auto (first and last, or all when <= 4), none", "--io-baseline"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("--help lacks %q", s)
		}
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
	js := filepath.Join(t.TempDir(), "r.json")
	code, _, stderr = runCLI(t, "validate", "--quiet", "--device", "cpu", "--cpu-check", "none", "--io-baseline", "--json", js, src, dst)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Notes   []string          `json:"notes"`
		Timings []json.RawMessage `json:"timings"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Timings) != 0 || !strings.Contains(strings.Join(rep.Notes, "|"), "no I/O baseline") {
		t.Errorf("CPU run with --io-baseline: notes %q, %d timings", rep.Notes, len(rep.Timings))
	}
}

// --no-progress is common to every command that reports progress, so a CI
// script can pass it everywhere: each such command takes it and then writes
// nothing to stderr on success.
func TestNoProgressEverywhere(t *testing.T) {
	src := filepath.Join(fixturesDir, "deepseek-v3-bf16")
	tmp := t.TempDir()
	dst := filepath.Join(tmp, "fused")
	runs := [][]string{
		{"inspect", "--no-progress", "--read", src},
		{"fuse-shared", "--tp", "2", "--no-progress", src, dst},
		{"validate", "--no-progress", "--device", "cpu", "--tokens", "8", src, dst},
		{"validate", "--quiet", "--device", "cpu", "--tokens", "8", src, dst},
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
