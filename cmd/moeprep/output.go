package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/internal/human"
	"github.com/moeprep/moeprep/internal/safeio"
	"github.com/moeprep/moeprep/validate"
)

// One meaning per flag, across every command:
//   --json          JSON on stdout instead of the human table or line
//   -o, --output F  the same JSON written to the file F (the human output
//                   still goes to stdout); refused where it could overwrite
//                   a checkpoint or anything that is not a moeprep report
//   -q, --quiet     no progress on stderr (--no-progress is the same flag)
//   -j, --jobs      how much work runs at once
//   -f, --force     replace what an earlier run of moeprep made

// schemaPrefix starts the "schema" value of every JSON document moeprep
// writes ("moeprep.validate/v1"): a report file is recognised by it, and a
// reader knows which fields to expect (SCHEMAS.md).
const schemaPrefix = "moeprep."

// reportFlags are --json and -o/--output.
type reportFlags struct {
	json   bool
	output string
}

func (r *reportFlags) register(cmd *cobra.Command, what string) {
	fl := cmd.Flags()
	fl.BoolVar(&r.json, "json", false, "print "+what+" as JSON on stdout instead of text (schema: SCHEMAS.md)")
	fl.StringVarP(&r.output, "output", "o", "", "also write "+what+" as JSON to `FILE`; never a file inside SRC or DST, nor an existing file that is not a moeprep report")
}

// quietFlag registers -q/--quiet and its other name --no-progress.
func quietFlag(cmd *cobra.Command, quiet *bool) {
	cmd.Flags().BoolVarP(quiet, "quiet", "q", false, "no progress on stderr")
	cmd.Flags().BoolVar(quiet, "no-progress", false, "the same as --quiet")
}

// noticer prints what a command's planning noticed (family.Plan.Notices)
// to stderr, one line each prefixed with the command's name, even with
// --quiet: it says what the run ignored.
func noticer(cmd *cobra.Command, label string) func(string) {
	return func(msg string) { fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s\n", label, msg) }
}

// checkOutputPath refuses an -o path that could destroy something: inside
// (or equal to) one of the checkpoint directories dirs, a directory, or an
// existing file that is not a JSON document with a moeprep schema.
func checkOutputPath(path string, dirs ...string) error {
	if path == "" {
		return nil
	}
	abs, err := resolvedPath(path)
	if err != nil {
		return fmt.Errorf("-o %s: %w", path, err)
	}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		dabs, err := resolvedPath(d)
		if err != nil {
			continue // an input that does not exist is reported by the command
		}
		if rel, err := filepath.Rel(dabs, abs); err == nil && (rel == "." || !strings.HasPrefix(rel, "..")) {
			return fmt.Errorf("-o %s: inside the checkpoint %s; write the report elsewhere", path, d)
		}
	}
	st, err := os.Stat(abs)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("-o %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("-o %s: exists and is %s; give a file name for the report", path, safeio.Kind(st.Mode()))
	}
	b, err := safeio.ReadFile(abs, 64<<20, "a moeprep report")
	if err == nil {
		var doc struct {
			Schema string `json:"schema"`
		}
		if json.Unmarshal(b, &doc) == nil && strings.HasPrefix(doc.Schema, schemaPrefix) {
			return nil
		}
	}
	return fmt.Errorf("-o %s: exists and is not a moeprep report; moeprep overwrites only its own reports, so remove it or choose another name", path)
}

// resolvedPath is path made absolute with its links resolved; a path that
// does not exist yet has its parent resolved.
func resolvedPath(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r, nil
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", err
	}
	return filepath.Join(parent, filepath.Base(abs)), nil
}

// writeOutput writes v as JSON to path through a temporary file in the same
// directory, renamed when complete.
func writeOutput(path string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("-o %s: %w", path, err)
	}
	// CreateTemp makes the file 0600; a report, JUnit file or engine
	// placement file is read by other tools and users, as a file made by
	// shell redirection would be.
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("-o %s: %w", path, err)
	}
	if err := write(tmp); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("-o %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("-o %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("-o %s: %w", path, err)
	}
	return nil
}

// emit prints doc as JSON on stdout (--json) or calls text, and also
// writes it to -o's file.
func (r *reportFlags) emit(cmd *cobra.Command, doc any, text func(io.Writer) error) error {
	if r.json {
		if err := writeJSON(cmd.OutOrStdout(), doc); err != nil {
			return err
		}
	} else if err := text(cmd.OutOrStdout()); err != nil {
		return err
	}
	if r.output != "" {
		return writeOutput(r.output, func(w io.Writer) error { return writeJSON(w, doc) })
	}
	return nil
}

// checkJUnitPath refuses a --junit path that could destroy something: one
// inside a checkpoint directory, a directory, or an existing file that is
// not a JUnit document moeprep wrote (its suite named validate.JUnitSuiteName).
func checkJUnitPath(path string, dirs ...string) error {
	if path == "" {
		return nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return checkOutputPath(path, dirs...) // nothing there yet: not inside a checkpoint
	}
	if st.IsDir() {
		return fmt.Errorf("--junit %s: a directory", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--junit %s: %w", path, err)
	}
	defer f.Close()
	head := make([]byte, 512)
	n, _ := io.ReadFull(f, head)
	if !strings.Contains(string(head[:n]), `<testsuites name="`+validate.JUnitSuiteName+`"`) {
		return fmt.Errorf("--junit %s: exists and is not a JUnit report moeprep wrote; moeprep does not overwrite it", path)
	}
	return nil
}

// lineWidth is the most columns a line of a command's text output takes
// (issue 46); a command line to copy, whose paths make it longer, is the
// one exception: it is never broken.
const lineWidth = 100

// withComment is a command line to copy with its "# why" after it, the
// comment left out where the line would not fit lineWidth.
func withComment(line, comment string) string {
	full := line + "   # " + comment
	if utf8.RuneCountInString(full) > lineWidth {
		return line
	}
	return full
}

// wrapAt breaks s into lines of at most width columns after a sep (kept
// at the end of the line, its trailing space dropped), each line after the
// first starting with indent; a piece longer than a line stays whole.
func wrapAt(s, sep string, width int, indent string) string {
	pieces := strings.SplitAfter(s, sep)
	var b strings.Builder
	line := ""
	for _, p := range pieces {
		if line != "" && utf8.RuneCountInString(line+strings.TrimRight(p, " ")) > width {
			b.WriteString(strings.TrimRight(line, " ") + "\n")
			line = indent
		}
		line += p
	}
	b.WriteString(line)
	return b.String()
}

// wrapWords breaks s at spaces into lines of at most lineWidth columns,
// keeping s's own leading spaces, each later line indented by them and
// indent more; a word longer than a line (a path) stays whole.
func wrapWords(s, indent string) string { return wrapWidth(s, lineWidth, indent) }

// wrapWidth is wrapWords to width columns.
func wrapWidth(s string, width int, indent string) string { return human.Wrap(s, width, indent) }
