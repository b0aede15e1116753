package main

import (
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
)

// TestContractMisfitExit1: through the CLI, a DST whose contract breaks its
// format's rules (in-out on INT4) or does not fit SRC (zero_experts) is a
// failed check, exit 1, with --bytes and without, the one error line
// naming the key (issue 41; validate/contractfit_test.go holds the rest).
func TestContractMisfitExit1(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		edit      func(c map[string]any)
		want      string
	}{
		{"orientation in-out on INT4", "deepseek-v3-int4", func(c map[string]any) { c["orientation"] = "in-out" }, "moeprep contract: orientation in-out, but INT4"},
		{"zero_experts", "longcat-flash", func(c map[string]any) { c["zero_experts"] = 3 }, "zero_experts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := filepath.Join(fixturesDir, tc.src)
			dst := filepath.Join(t.TempDir(), "dst")
			if code, _, stderr := runCLI(t, "convert", "-q", src, dst); code != 0 {
				t.Fatalf("convert: exit %d: %s", code, stderr)
			}
			testkit.EditJSON(t, filepath.Join(dst, "config.json"), func(m map[string]any) { tc.edit(m[layout.ContractKey].(map[string]any)) })
			// the manifest rehashed, as someone who can write DST would
			man := filepath.Join(dst, layout.ManifestFileName)
			testkit.EditJSON(t, man, func(m map[string]any) {
				fi, err := layout.HashFile(filepath.Join(dst, "config.json"))
				if err != nil {
					t.Fatal(err)
				}
				m["files"].(map[string]any)["config.json"] = fi
			})
			for _, args := range [][]string{{"validate", "-q", "--bytes", src, dst}, {"validate", "-q", "--device", "cpu", "--tokens", "8", src, dst}, {"validate", "-q", "--device", "cpu", "--skip-bytes", "--tokens", "8", src, dst}} {
				code, _, stderr := runCLI(t, args...)
				if code != 1 {
					t.Errorf("%v: exit %d, want 1: %s", args[:len(args)-2], code, stderr)
				}
				assertCleanError(t, stderr, tc.want)
			}
		})
	}
}
