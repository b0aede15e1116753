package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
)

// --json is a switch (the report as JSON on stdout, nothing else there);
// -o FILE writes the same JSON to FILE and the table still goes to stdout.
func TestValidateJSONAndOutput(t *testing.T) {
	src, dst := fusedFixture(t)
	base := []string{"validate", "-q", "--device", "cpu", "--tokens", "8"}

	code, stdout, stderr := runCLI(t, append(base, "--json", src, dst)...)
	if code != 0 || stderr != "" {
		t.Fatalf("--json: exit %d: %s", code, stderr)
	}
	doc := readReport(t, []byte(stdout))
	if doc["mode"] != "layers+bytes" || doc["failed"] != false || doc["src"] != src || doc["dst"] != dst {
		t.Errorf("--json report: mode %v failed %v src %v dst %v", doc["mode"], doc["failed"], doc["src"], doc["dst"])
	}

	out := filepath.Join(t.TempDir(), "report.json")
	code, stdout, stderr = runCLI(t, append(base, "-o", out, src, dst)...)
	if code != 0 || stderr != "" {
		t.Fatalf("-o: exit %d: %s", code, stderr)
	}
	if !strings.HasPrefix(stdout, "layer  ") || !strings.Contains(stdout, "checks passed") {
		t.Errorf("-o: the table should still be printed:\n%s", stdout)
	}
	b := testkit.ReadFile(t, out)
	fileDoc := readReport(t, b)
	if fileDoc["summary"] == nil || !strings.Contains(stdout, fileDoc["summary"].(string)) {
		t.Errorf("-o: the file's summary %q is not the table's last line:\n%s", fileDoc["summary"], stdout)
	}
	// A report moeprep wrote may be overwritten by the next run.
	if code, _, stderr = runCLI(t, append(base, "--json", "-o", out, src, dst)...); code != 0 {
		t.Errorf("-o over an earlier report: exit %d: %s", code, stderr)
	}
	entries, _ := os.ReadDir(filepath.Dir(out))
	if len(entries) != 1 {
		t.Errorf("-o left temporary files: %v", entries)
	}
}

// -o is checked before anything runs: a path inside SRC, DST or the golden
// directory, or an existing file that is not a moeprep report, is refused
// (exit 2, one line) and left as it was.
func TestValidateOutputRefused(t *testing.T) {
	src, dst := fusedFixture(t)
	tmp := t.TempDir()
	notReport := filepath.Join(tmp, "notes.json")
	testkit.WriteFile(t, notReport, `{"mine": true}`)
	otherSchema := filepath.Join(tmp, "other.json")
	testkit.WriteFile(t, otherSchema, `{"schema": "someone.else/v1"}`)
	golden := filepath.Join(src, "reference")
	cfg := testkit.ReadFile(t, filepath.Join(dst, "config.json"))
	tests := []struct {
		name string
		path string
		args []string
		want string
	}{
		{"DST's config.json", filepath.Join(dst, "config.json"), []string{src, dst}, "inside the checkpoint"},
		{"a new file in SRC", filepath.Join(src, "report.json"), []string{src, dst}, "inside the checkpoint"},
		{"DST itself", dst, []string{src, dst}, "inside the checkpoint"},
		{"the golden directory", filepath.Join(golden, "r.json"), []string{dst, "--golden", golden}, "inside the checkpoint"},
		{"a file that is no report", notReport, []string{src, dst}, "not a moeprep report"},
		{"another tool's schema", otherSchema, []string{src, dst}, "not a moeprep report"},
		{"a directory", tmp, []string{src, dst}, "give a file name"},
	}
	for _, tt := range tests {
		args := append([]string{"validate", "-q", "--device", "cpu", "-o", tt.path}, tt.args...)
		code, stdout, stderr := runCLI(t, args...)
		if code != 2 || stdout != "" {
			t.Errorf("%s: exit %d, stdout %q", tt.name, code, stdout)
		}
		assertCleanError(t, stderr, "-o", tt.want)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "config.json")); string(b) != string(cfg) {
		t.Error("DST's config.json changed")
	}
	if b, _ := os.ReadFile(notReport); string(b) != `{"mine": true}` {
		t.Error("a file that is no report was overwritten")
	}
	if _, err := os.Stat(filepath.Join(src, "report.json")); err == nil {
		t.Error("a report was written into SRC")
	}
}

// The old form --json FILE cannot be misread any more: its FILE is an
// argument, and every way of writing it is a one-line usage error (exit
// 2) that says -o FILE is the new form, writing nothing anywhere.
func TestValidateOldJSONForm(t *testing.T) {
	src, dst := fusedFixture(t)
	tmp := t.TempDir()
	report := filepath.Join(tmp, "report.json")
	srcCfg := testkit.ReadFile(t, filepath.Join(src, "config.json"))
	tests := []struct {
		name string
		args []string
	}{
		{"--json FILE SRC DST", []string{"--json", report, src, dst}},
		{"--json=FILE SRC DST", []string{"--json=" + report, src, dst}},
		{"--json FILE DST --golden", []string{"--json", report, dst, "--golden", filepath.Join(src, "reference")}},
		{"--json SRC/config.json SRC DST", []string{"--json", filepath.Join(src, "config.json"), src, dst}},
		{"--json SRC/config.json DST --golden", []string{"--json", filepath.Join(src, "config.json"), dst, "--golden", filepath.Join(src, "reference")}},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCLI(t, append([]string{"validate", "-q", "--device", "cpu"}, tt.args...)...)
		if code != 2 || stdout != "" {
			t.Errorf("%s: exit %d, stdout %q", tt.name, code, stdout)
		}
		assertCleanError(t, stderr, "--json", "-o ")
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Errorf("files written: %v", entries)
	}
	if b, _ := os.ReadFile(filepath.Join(src, "config.json")); string(b) != string(srcCfg) {
		t.Error("SRC's config.json changed")
	}
	// --json before SRC DST is the switch, not a file name.
	code, stdout, stderr := runCLI(t, "validate", "-q", "--device", "cpu", "--tokens", "8", "--json", src, dst)
	if code != 0 || readReport(t, []byte(stdout))["src"] != src {
		t.Errorf("--json SRC DST: exit %d: %s", code, stderr)
	}
}

// Flags that cannot apply together are refused before anything runs,
// each naming the flag, exit 2; --bytes with --device cuda is not among
// them: the byte proof needs no GPU.
func TestValidateFlagConflicts(t *testing.T) {
	src, dst := fusedFixture(t)
	golden := filepath.Join(src, "reference")
	tests := []struct {
		args []string
		name []string // the error names each
	}{
		{[]string{"--tokens", "0", src, dst}, []string{"--tokens 0"}},
		{[]string{"--tokens", "-3", src, dst}, []string{"--tokens -3"}},
		{[]string{"--tokens", "70000", src, dst}, []string{"--tokens 70000"}},
		{[]string{"--device", "cpu", "--precision", "fp8", src, dst}, []string{"--precision", "GPU runs"}},
		{[]string{"--bytes", "--tokens", "64", src, dst}, []string{"--tokens", "--bytes"}},
		{[]string{"--bytes", "--seed", "1", src, dst}, []string{"--seed", "--bytes"}},
		{[]string{"--bytes", "--golden", golden, src, dst}, []string{"--golden", "--bytes"}},
		{[]string{"--bytes", "--layers", "sample:1", src, dst}, []string{"--layers", "--bytes"}},
		{[]string{"--bytes", "--sample-experts", "4", src, dst}, []string{"--sample-experts", "--bytes"}},
		{[]string{"--bytes", "--precision", "f32", src, dst}, []string{"--precision", "--bytes"}},
		{[]string{"--bytes", "--cpu-check", "all", src, dst}, []string{"--cpu-check", "--bytes"}},
		{[]string{"--bytes", "--io-baseline", src, dst}, []string{"--io-baseline", "--bytes"}},
		{[]string{"--bytes", "--block-size", "16", src, dst}, []string{"--block-size", "--bytes"}},
		{[]string{"--bytes", "-j", "2", src, dst}, []string{"--jobs", "--bytes"}},
		{[]string{"--bytes", "--skip-bytes", src, dst}, []string{"--bytes", "--skip-bytes"}},
		{[]string{"--skip-bytes", dst, "--golden", golden}, []string{"--skip-bytes"}},
		{[]string{"--bytes=maybe", src, dst}, []string{"--bytes takes no value"}},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCLI(t, append([]string{"validate", "-q"}, tt.args...)...)
		if code != 2 || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q", tt.args, code, stdout)
		}
		assertCleanError(t, stderr, tt.name...)
		if strings.Contains(stderr, "strconv") {
			t.Errorf("%v: Go internals in %q", tt.args, stderr)
		}
	}

	// The byte proof alone on any device, clean: no CPU notice, no empty
	// table, no block size.
	for _, device := range []string{"cuda", "cpu", "auto"} {
		code, stdout, stderr := runCLI(t, "validate", "--no-progress", "--device", device, "--bytes", src, dst)
		if code != 0 {
			t.Fatalf("--device %s --bytes: exit %d: %s", device, code, stderr)
		}
		lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
		if stderr != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], "bytes: PASS: ") ||
			!strings.HasSuffix(lines[1], ": DST's bytes proven against SRC and the contract; no MoE layer was run") {
			t.Errorf("--device %s --bytes:\nstdout %q\nstderr %q", device, stdout, stderr)
		}
		for _, bad := range []string{"running on the CPU", "block size", "layer  check"} {
			if strings.Contains(stdout+stderr, bad) {
				t.Errorf("--device %s --bytes prints %q", device, bad)
			}
		}
	}
}

// A sampled run says what it left out: the table has a row for the layer
// not checked, the last line names it and the experts not exercised, and
// so does the JSON.
func TestValidateSampledSummary(t *testing.T) {
	src, dst := fusedFixture(t)
	code, stdout, stderr := runCLI(t, "validate", "-q", "--device", "cpu", "--tokens", "16", "--layers", "sample:1", "--sample-experts", "4", src, dst)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	last := lines[len(lines)-1]
	for _, s := range []string{"3/3 checks passed", "1 of 2 MoE layers (not checked: 2)", "sampled experts", "bytes proven"} {
		if !strings.Contains(last, s) {
			t.Errorf("last line lacks %q: %s", s, last)
		}
	}
	for _, s := range []string{"every expert", "all 2"} {
		if strings.Contains(last, s) {
			t.Errorf("last line claims %q: %s", s, last)
		}
	}
	if !slices.ContainsFunc(lines, func(l string) bool {
		return strings.HasPrefix(l, "2 ") && strings.Contains(l, "not checked") && strings.HasSuffix(l, "  left out")
	}) {
		t.Errorf("no table row for layer 2:\n%s", stdout)
	}
	if !slices.ContainsFunc(lines, func(l string) bool {
		return strings.HasPrefix(l, "  layer 1: ") && strings.Contains(l, "of 18 bank experts not exercised: ")
	}) {
		t.Errorf("no line naming layer 1's experts not exercised:\n%s", stdout)
	}

	// The whole run claims the whole model.
	code, stdout, _ = runCLI(t, "validate", "-q", "--device", "cpu", "--tokens", "16", src, dst)
	lines = strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	if last := lines[len(lines)-1]; code != 0 || !strings.Contains(last, "5/5 checks passed") ||
		!strings.HasSuffix(last, " (cpu): all 2 MoE layers; every expert; DST's bytes proven against SRC") {
		t.Errorf("full run: exit %d, last line %q", code, last)
	}
}

// Without -q the steps go to stderr, and the byte proof's one line per
// shard gives way to the byte progress (bytes, rate, ETA).
func TestValidateProgressLines(t *testing.T) {
	src, dst := fusedFixture(t)
	code, _, stderr := runCLI(t, "validate", "--device", "cpu", "--tokens", "8", src, dst)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, s := range []string{"validate: layer 1 (1 of 2)\n", "validate: layer 2: 8 tokens", "validate: --bytes: every DST file"} {
		if !strings.Contains(stderr, s) {
			t.Errorf("stderr lacks %q:\n%s", s, stderr)
		}
	}
	if strings.Contains(stderr, "validate --bytes: model") {
		t.Errorf("a line per shard beside the byte progress:\n%s", stderr)
	}
}

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

// TestWriteOutputMode: a written report is readable by others (0644), not
// the 0600 of the temporary file it was made in.
func TestWriteOutputMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "report.json")
	if err := writeOutput(path, func(w io.Writer) error { _, err := io.WriteString(w, "{}\n"); return err }); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Mode().Perm(); got != 0o644 {
		t.Errorf("mode %v, want -rw-r--r--", got)
	}
}
