// Package hfcache finds a model in the local Hugging Face hub cache the
// way hf users name it: "org/name" (resolved through HF_HUB_CACHE,
// HF_HOME/hub or ~/.cache/huggingface/hub), or the cache's own
// models--org--name folder. It reads refs/<revision> to pick the snapshot,
// as huggingface_hub does, and never downloads anything.
package hfcache

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// DefaultRevision is the ref a snapshot is taken from when none is given.
const DefaultRevision = "main"

// repoID is what the hub accepts as a model id: one "org/name", each part
// of letters, digits, '-', '_' and '.', not starting or ending with '.' or
// '-' (huggingface_hub's validator, in short).
var repoID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$`)

// revision is a branch, tag or commit name as refs/ holds it.
var revision = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_./-]{0,255}$`)

// Dir is the cache folder: HF_HUB_CACHE, else HF_HOME/hub, else
// ~/.cache/huggingface/hub (XDG_CACHE_HOME in place of ~/.cache when set).
func Dir() string {
	if d := os.Getenv("HF_HUB_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("HF_HOME"); d != "" {
		return filepath.Join(d, "hub")
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "huggingface", "hub")
}

// Resolution says where a name led.
type Resolution struct {
	Dir      string // the checkpoint folder to read
	Repo     string // "org/name" when the name was resolved through the cache
	Revision string
	Commit   string // the snapshot's folder name
}

// Note is the one line a command prints when it took a snapshot.
func (r Resolution) Note() string {
	if r.Repo == "" {
		return ""
	}
	return fmt.Sprintf("%s: the Hugging Face cache's snapshot %s (refs/%s): %s", r.Repo, r.Commit, r.Revision, r.Dir)
}

// Resolve maps what a user passed as a checkpoint to a folder. A path that
// exists is taken as it is, unless it is a cache's models--org--name
// folder (no config.json, a snapshots/ folder), which resolves to the
// revision's snapshot. A path that does not exist and reads as "org/name"
// is looked up in the cache. Anything else is returned unchanged, for the
// caller's own "no such file" error; rev "" is DefaultRevision.
func Resolve(arg, rev string) (Resolution, error) {
	if rev == "" {
		rev = DefaultRevision
	}
	if !revision.MatchString(rev) || strings.Contains(rev, "..") {
		return Resolution{}, fmt.Errorf("--revision %q is not a branch, tag or commit name", rev)
	}
	if fi, err := os.Stat(arg); err == nil {
		if fi.IsDir() && isRepoFolder(arg) {
			repo := strings.ReplaceAll(strings.TrimPrefix(filepath.Base(filepath.Clean(arg)), "models--"), "--", "/")
			return snapshot(arg, repo, rev)
		}
		return Resolution{Dir: arg}, nil
	}
	if !repoID.MatchString(arg) || strings.Contains(arg, "..") {
		return Resolution{Dir: arg}, nil
	}
	cache := Dir()
	folder := filepath.Join(cache, "models--"+strings.ReplaceAll(arg, "/", "--"))
	if _, err := os.Stat(folder); err != nil {
		return Resolution{}, fmt.Errorf("%s: no such directory, nor a model in the Hugging Face cache (%s); moeprep never downloads: run `hf download %s` first, or pass the model's folder", arg, cache, arg)
	}
	return snapshot(folder, arg, rev)
}

// isRepoFolder reports whether dir looks like a cache's models--org--name
// folder rather than a checkpoint.
func isRepoFolder(dir string) bool {
	if !strings.HasPrefix(filepath.Base(filepath.Clean(dir)), "models--") {
		return false
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err == nil {
		return false
	}
	fi, err := os.Stat(filepath.Join(dir, "snapshots"))
	return err == nil && fi.IsDir()
}

// snapshot picks the revision's snapshot of a repo folder: refs/<rev>
// names a commit; a revision that is itself a commit names its folder.
func snapshot(folder, repo, rev string) (Resolution, error) {
	commit := rev
	if b, err := readRef(filepath.Join(folder, "refs", filepath.FromSlash(rev))); err == nil {
		commit = strings.TrimSpace(string(b))
	} else if !errors.Is(err, os.ErrNotExist) {
		return Resolution{}, fmt.Errorf("%s: refs/%s: %w", folder, rev, err)
	}
	if len(commit) == 0 || len(commit) > 64 || strings.ContainsAny(commit, `/\.`) {
		return Resolution{}, fmt.Errorf("%s: refs/%s does not name a snapshot (%q)", folder, rev, commit)
	}
	dir := filepath.Join(folder, "snapshots", commit)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		have, _ := filepath.Glob(filepath.Join(folder, "snapshots", "*"))
		names := make([]string, 0, len(have))
		for _, h := range have {
			names = append(names, filepath.Base(h))
		}
		if len(names) > 5 {
			names = append(names[:5], fmt.Sprintf("and %d more", len(names)-5))
		}
		return Resolution{}, fmt.Errorf("%s: no snapshot for revision %q (snapshots: %s); moeprep never downloads: run `hf download %s --revision %s`",
			folder, rev, strings.Join(names, ", "), repo, rev)
	}
	return Resolution{Dir: dir, Repo: repo, Revision: rev, Commit: commit}, nil
}

// readRef reads a ref file, at most 256 bytes of it: a commit hash is 40,
// and a ref file of gigabytes must not be read whole.
func readRef(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 256))
}
