package main

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/moeprep/moeprep/fixtures"
)

// Issue 46's smaller frictions, each as the user meets it: the error line
// says the one thing to do, once.
func TestNewcomerErrors(t *testing.T) {
	fixture, err := filepath.Abs(filepath.Join(fixturesDir, "mixtral"))
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "out")
	synthDir := filepath.Join(t.TempDir(), "synth")
	tests := []struct {
		name string
		args []string
		want string // the whole error line
	}{
		{"an unknown flag of moeprep itself names moeprep once", []string{"--bogus"},
			"moeprep: unknown flag: --bogus (see 'moeprep --help')"},
		{"reversed arguments: convert", []string{"convert", missing, fixture},
			"moeprep: " + missing + ": no such file or directory, and " + fixture + " holds a checkpoint: the source comes first (moeprep convert SRC DST)"},
		{"reversed arguments: fuse-shared", []string{"fuse-shared", "--tp", "2", missing, fixture},
			"moeprep: " + missing + ": no such file or directory, and " + fixture + " holds a checkpoint: the source comes first (moeprep fuse-shared SRC DST)"},
		{"one argument, not 1 argument(s)", []string{"validate", fixture},
			"moeprep: validate takes SRC DST, or DST with --golden DIR; got 1 argument (see 'moeprep validate --help')"},
		{"an unknown preset: a suggestion and a count, not every name", []string{"fixture", "synth", "--preset", "tiny-llama4", synthDir},
			"moeprep: --preset: unknown preset \"tiny-llama4\"; did you mean tiny-llama4-text? (`moeprep fixture synth --help` lists all " + strconv.Itoa(len(fixtures.PresetNames())) + ")"},
		{"a wrapper family: the fixture transformers wrote", []string{"fixture", "synth", "--family", "qwen3_vl_moe", synthDir},
			"moeprep: family \"qwen3_vl_moe\" is a multimodal wrapper, which synth does not write; use the one transformers wrote: fixtures/hf/qwen3-vl-moe (in moeprep's repository)"},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCLI(t, tt.args...)
		if code != 2 || stdout != "" || stderr != tt.want+"\n" {
			t.Errorf("%s: exit %d, stdout %q\n got %q\nwant %q", tt.name, code, stdout, stderr, tt.want+"\n")
		}
	}
}

var estimateLine = regexp.MustCompile(`^validate: estimate: (under a second|about [0-9.]+ ?[a-z0-9]+) for [0-9.]+ [kMGT]?B \((an assumed|assumed|byte proof at an assumed) [^)]+\)$`)

// validate says how long it expects to take before it starts, on stderr;
// -q leaves it out and --json's report on stdout never holds it.
func TestValidateEstimateLine(t *testing.T) {
	src, dst := fusedFixture(t)
	for _, tc := range []struct {
		name     string
		args     []string
		estimate bool
	}{
		{"table", []string{"validate", "--device", "cpu", src, dst}, true},
		{"json", []string{"validate", "--json", "--device", "cpu", src, dst}, true},
		{"quiet", []string{"validate", "-q", "--device", "cpu", src, dst}, false},
		{"bytes", []string{"validate", "--bytes", src, dst}, true},
	} {
		code, stdout, stderr := runCLI(t, tc.args...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.name, code, stderr)
		}
		var line string
		for _, l := range strings.Split(stderr, "\n") {
			if strings.HasPrefix(l, "validate: estimate: ") {
				line = l
			}
		}
		// "validate: estimate: under a second for 1.40 MB (an assumed 1.00
		// GB/s read, 30 GFLOP/s a core, 2 cores)": how long, for what, on
		// what basis.
		said := estimateLine.MatchString(line)
		switch {
		case tc.estimate && !said:
			t.Errorf("%s: no estimate line in\n%s", tc.name, stderr)
		case !tc.estimate && line != "":
			t.Errorf("%s: estimate %q", tc.name, line)
		case strings.Contains(stdout, "estimate"):
			t.Errorf("%s: the estimate is in the report:\n%s", tc.name, stdout)
		}
		if strings.HasPrefix(stdout, "{") && !json.Valid([]byte(stdout)) {
			t.Errorf("%s: stdout is not one JSON document", tc.name)
		}
	}
}

// Every line the walk from the README prints fits 100 columns (issue 46),
// but a command to copy, whose paths make it as long as they are.
func TestNewcomerOutputFits(t *testing.T) {
	fixturesAbs, err := filepath.Abs(fixturesDir) // before the test changes directory
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	abs := func(dir string) string { return filepath.Join(fixturesAbs, dir) }
	ds, qwen, gptoss := abs("deepseek-v3-fp8"), abs("qwen3-moe"), abs("gpt-oss")
	runs := [][]string{
		{"demo"},
		{"inspect", ds}, {"inspect", gptoss},
		{"convert", "--dry-run", qwen, "q"},
		{"fuse-shared", "--dry-run", "--tp", "2", ds, "f"},
		{"convert", "-q", "--layout", "gate-up", qwen, "q"},
		{"fuse-shared", "-q", "--tp", "2", ds, "f"},
		{"convert", "-q", gptoss, "g"},
		{"validate", "-q", "--device", "cpu", qwen, "q"},
		{"validate", "-q", "--device", "cpu", "--layers", "sample:1", "--sample-experts", "2", ds, "f"},
		{"validate", "-q", "--device", "cpu", "--golden", filepath.Join(ds, "reference"), ds, "f"},
		{"validate", "-q", "--bytes", gptoss, "g"},
	}
	for _, args := range runs {
		code, stdout, stderr := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		for _, l := range strings.Split(stdout, "\n") {
			if utf8.RuneCountInString(l) > 100 && !isCommandLine(l) {
				t.Errorf("%v: a line of %d columns:\n%s", args, utf8.RuneCountInString(l), l)
			}
		}
	}
}

// isCommandLine is a line that holds a command to copy.
func isCommandLine(l string) bool {
	for _, p := range []string{"next: moeprep ", "then: python3 ", "next:            moeprep ", "demo: working in "} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return false
}

// headLine keeps a summary on one line where it fits, else puts the
// directory on a line of its own.
func TestHeadLine(t *testing.T) {
	rest := "mixtral bf16, 2 layers, 8 experts, top-2, 281 kB (dry run: nothing written)"
	long := "/a/directory/" + strings.Repeat("x", 30)
	for _, tc := range []struct{ head, want string }{
		{"would write m:", "would write m: " + rest},
		{"would write " + long + ":", "would write " + long + ":\n  " + rest},
	} {
		if got := headLine(tc.head, rest); got != tc.want {
			t.Errorf("headLine(%q):\n got %q\nwant %q", tc.head, got, tc.want)
		}
	}
}
