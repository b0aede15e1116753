package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// MOEPREP_CPUPROFILE and MOEPREP_HEAPPROFILE each write a pprof profile (a
// gzip stream) of the command; without them nothing is written and the
// sampling rate is left alone.
func TestProfileVariables(t *testing.T) {
	dir := t.TempDir()
	cpu, heap := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "heap.pprof")
	rate := runtime.MemProfileRate
	defer func() { runtime.MemProfileRate = rate }()

	if code, _, stderr := runCLI(t, "inspect", filepath.Join(fixturesDir, "mixtral")); code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, stderr)
	}
	if runtime.MemProfileRate != rate {
		t.Errorf("MemProfileRate %d without the variables, want %d", runtime.MemProfileRate, rate)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("%d files written without the variables", len(entries))
	}

	t.Setenv("MOEPREP_CPUPROFILE", cpu)
	t.Setenv("MOEPREP_HEAPPROFILE", heap)
	if code, _, stderr := runCLI(t, "inspect", filepath.Join(fixturesDir, "mixtral")); code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, stderr)
	}
	for _, path := range []string{cpu, heap} {
		b := testkit.ReadFile(t, path)
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: not a pprof profile: %v", filepath.Base(path), err)
		}
		if n, err := io.Copy(io.Discard, zr); err != nil || n == 0 {
			t.Errorf("%s: %d bytes of profile, %v", filepath.Base(path), n, err)
		}
	}
}
