package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

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
