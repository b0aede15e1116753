package main

import (
	"strings"
	"testing"
)

// Every line of every command's --help fits 100 columns (the issue's
// terminal), examples included, and Usage comes before any long prose.
func TestHelpFitsTheTerminal(t *testing.T) {
	t.Setenv("COLUMNS", "100")
	for _, args := range [][]string{{"inspect"}, {"convert"}, {"fuse-shared"}, {"validate"}, {"placement"}, {"fixture", "synth"}, {"bench", "kernels"}, {"demo"}, {"fixture"}, {}} {
		code, out, _ := runCLI(t, append(args, "--help")...)
		if code != 0 {
			t.Fatalf("%v --help: exit %d", args, code)
		}
		lines := strings.Split(out, "\n")
		if len(args) > 0 && (lines[1] != "" || !strings.HasPrefix(lines[2], "Usage:")) { // moeprep's own: a paragraph
			t.Errorf("%v --help: Usage is not on the first screen after the summary:\n%s", args, strings.Join(lines[:min(5, len(lines))], "\n"))
		}
		for _, l := range lines {
			if len([]rune(l)) > 100 {
				t.Errorf("%v --help: a line of %d columns: %q", args, len([]rune(l)), l)
			}
		}
	}
}
