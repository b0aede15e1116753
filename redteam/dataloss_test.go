package redteam

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// throughLink is the setup of a case on a copy of src, dir/src, and a
// link to it, dir/srclink: args is the command line, given both; the copy
// must survive the run unchanged.
func throughLink(src string, args func(own, link string) []string) func(t *testing.T, dir string) ([]string, []string) {
	return func(t *testing.T, dir string) ([]string, []string) {
		t.Helper()
		own, link := filepath.Join(dir, "src"), filepath.Join(dir, "srclink")
		testkit.CopyDir(t, src, own)
		if err := os.Symlink(own, link); err != nil {
			t.Fatal(err)
		}
		return args(own, link), []string{own}
	}
}

// TestDataLoss: --force and symbolic links must never delete or overwrite
// what moeprep did not write (issue 26, cases 1-3).
func TestDataLoss(t *testing.T) {
	src := tinySrc(t)
	cases := []struct {
		name string
		// setup prepares the case in dir and returns the command line and
		// the directories whose content must survive the run unchanged.
		setup func(t *testing.T, dir string) (args []string, keep []string)
		want  expect
		// absent: paths that must not exist afterwards (relative to dir).
		absent []string
		// after checks the result of a run that must succeed.
		after func(t *testing.T, dir string)
	}{
		{
			// A user points --force at a folder that holds other work.
			name: "force onto a folder of other checkpoints",
			setup: func(t *testing.T, dir string) ([]string, []string) {
				out := filepath.Join(dir, "models")
				testkit.CopyDir(t, src, filepath.Join(out, "ckpt-a"))
				testkit.CopyDir(t, src, filepath.Join(out, "ckpt-b"))
				testkit.WriteFile(t, filepath.Join(out, "notes.txt"), []byte("which of these is the good one?\n"))
				return []string{"convert", "--no-progress", "--force", src, out}, []string{out}
			},
			// Exit 2, naming the folder and what is in it.
			want:   code(2, names("models"), `ckpt-a|ckpt-b|notes\.txt`),
			absent: []string{"models.partial"},
		},
		{
			name: "force onto a folder with one unrelated file",
			setup: func(t *testing.T, dir string) ([]string, []string) {
				out := filepath.Join(dir, "work")
				testkit.WriteFile(t, filepath.Join(out, "thesis.tex"), []byte("\\documentclass{article}\n"))
				return []string{"convert", "--no-progress", "--force", src, out}, []string{out}
			},
			want:   code(2, names("work"), `thesis\.tex`),
			absent: []string{"work.partial"},
		},
		{
			// What --force is for: replacing an earlier output.
			name: "force onto an earlier moeprep output",
			setup: func(t *testing.T, dir string) ([]string, []string) {
				out := filepath.Join(dir, "out")
				mustRun(t, "convert", "--no-progress", "--layout", "gate-up", src, out)
				return []string{"convert", "--no-progress", "--force", src, out}, nil
			},
			want:   code(0, nil, ""),
			absent: []string{"out.partial"},
			after: func(t *testing.T, dir string) {
				out := filepath.Join(dir, "out")
				if !strings.Contains(string(testkit.ReadFile(t, filepath.Join(out, "config.json"))), `"layout": "stacked"`) {
					t.Errorf("%s was not replaced: its contract is not the stacked layout of the second run", out)
				}
				check(t, runMoeprep(t, caseTimeout, "validate", "--bytes", "--no-progress", src, out), code(0, nil, ""))
			},
		},
		{
			name: "force onto an empty folder",
			setup: func(t *testing.T, dir string) ([]string, []string) {
				out := filepath.Join(dir, "empty")
				if err := os.Mkdir(out, 0o755); err != nil {
					t.Fatal(err)
				}
				return []string{"convert", "--no-progress", "--force", src, out}, nil
			},
			want:   code(0, nil, ""),
			absent: []string{"empty.partial"},
			after: func(t *testing.T, dir string) {
				check(t, runMoeprep(t, caseTimeout, "validate", "--bytes", "--no-progress", src, filepath.Join(dir, "empty")), code(0, nil, ""))
			},
		},
		{
			// DST is the source itself, reached through a link.
			name: "force onto the source through a link to it",
			setup: throughLink(src, func(own, link string) []string {
				return []string{"convert", "--no-progress", "--force", link, own}
			}),
			want:   code(2, names("src", "srclink"), ""),
			absent: []string{"src.partial"},
		},
		{
			// The mirror image: SRC is a link to DST. Not listed in the
			// issue, but the same mistake typed the other way round.
			name: "force onto a link to the source",
			setup: throughLink(src, func(own, link string) []string {
				return []string{"convert", "--no-progress", "--force", own, link}
			}),
			want:   code(2, names("src", "srclink"), ""),
			absent: []string{"srclink.partial"},
		},
		{
			// DST inside SRC, through a link: nothing may be written in SRC.
			name: "destination inside the source through a link",
			setup: throughLink(src, func(own, link string) []string {
				return []string{"convert", "--no-progress", own, filepath.Join(link, "out")}
			}),
			want: code(2, names("out", "src", "srclink"), ""),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			args, keep := c.setup(t, dir)
			before := make([]tree, len(keep))
			for i, k := range keep {
				before[i] = snapshot(t, k)
			}
			check(t, runMoeprep(t, caseTimeout, args...), c.want)
			for i, k := range keep {
				assertUnchanged(t, k, before[i])
			}
			for _, a := range c.absent {
				assertAbsent(t, filepath.Join(dir, a))
			}
			if c.after != nil && !t.Failed() {
				c.after(t, dir)
			}
		})
	}
}
