package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/internal/hfcache"
)

// revisionFlag registers --revision for a command that reads a source
// checkpoint, which may be named the way hf users name it.
func revisionFlag(cmd *cobra.Command, rev *string) {
	cmd.Flags().StringVar(rev, "revision", "", "with a Hugging Face id (org/name) or cache folder (models--org--name): the branch, tag or commit of the cached snapshot to read (default main)")
}

// sourceDir resolves a source checkpoint argument: a folder as it is, or
// "org/name" and a cache's models--org--name folder to the cached
// snapshot, saying on stderr (even with --quiet) which one it took.
func sourceDir(cmd *cobra.Command, label, arg, rev string) (string, error) {
	dir, _, err := sourceArg(cmd, label, arg, rev)
	return dir, err
}

// sourceArg is sourceDir's folder, and the source as a next: line names
// it: as the user typed it (with its --revision) when it resolved through
// the Hugging Face cache, so the step reads as they wrote it and resolves
// to the same snapshot; "" when it is a folder (the caller quotes that).
func sourceArg(cmd *cobra.Command, label, arg, rev string) (dir, shown string, err error) {
	r, err := hfcache.Resolve(arg, rev)
	if err != nil {
		return "", "", err
	}
	if rev != "" && r.Repo == "" {
		return "", "", fmt.Errorf("--revision %s: %s is a checkpoint folder, not a Hugging Face id or cache folder", rev, arg)
	}
	if n := r.Note(); n != "" {
		noticer(cmd, label)("reading " + n)
	}
	if r.Repo != "" {
		shown = shellQuote(arg)
		if rev != "" {
			shown = "--revision " + shellQuote(rev) + " " + shown
		}
	}
	return r.Dir, shown, nil
}

// swappedArgs refuses a SRC that does not exist beside a DST that holds
// a checkpoint, naming the likely cause: the arguments the other way round
// (DST is the one expected not to exist yet).
func swappedArgs(cmd *cobra.Command, src, dst string) error {
	_, err := os.Stat(src)
	if !errors.Is(err, fs.ErrNotExist) {
		return nil // the run reports anything else
	}
	if _, e := os.Stat(filepath.Join(dst, "config.json")); e != nil {
		return nil
	}
	return fmt.Errorf("%s: no such file or directory, and %s holds a checkpoint: the source comes first (%s SRC DST)", src, dst, cmd.CommandPath())
}
