package main

import (
	"strings"
	"testing"
)

// Every command's --help fits 100 columns (the terminal), apart
// from example lines and the commands' own literal paths, and puts Usage
// before any long prose.
func TestHelpFitsTheTerminal(t *testing.T) {
	t.Setenv("COLUMNS", "100")
	for _, args := range [][]string{{"inspect"}, {"convert"}, {"fuse-shared"}, {"validate"}, {"placement"}, {"fixture", "synth"}, {"bench", "kernels"}} {
		code, out, _ := runCLI(t, append(args, "--help")...)
		if code != 0 {
			t.Fatalf("%v --help: exit %d", args, code)
		}
		lines := strings.Split(out, "\n")
		if lines[1] != "" || !strings.HasPrefix(lines[2], "Usage:") {
			t.Errorf("%v --help: Usage is not on the first screen after the summary:\n%s", args, strings.Join(lines[:min(5, len(lines))], "\n"))
		}
		inFlags := false
		for _, l := range lines {
			switch {
			case l == "Flags:" || l == "Global Flags:":
				inFlags = true
				continue
			case l == "":
				inFlags = false
			}
			if inFlags && len([]rune(l)) > 100 {
				t.Errorf("%v --help: a flag line of %d columns: %q", args, len([]rune(l)), l)
			}
		}
	}
}
