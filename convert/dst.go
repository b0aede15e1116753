package convert

import (
	"errors"
	"fmt"
	"github.com/moeprep/moeprep/internal/dirlock"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/moeprep/moeprep/internal/safeio"
	"github.com/moeprep/moeprep/layout"
)

// What convert may write over, and how it keeps out of everything else.
//
// moeprep is pointed at directories that hold hundreds of GB of other
// people's work, so it never deletes or replaces anything it did not make:
//   - SRC and DST are compared after resolving symbolic links, so a link to
//     SRC, or a DST inside SRC reached through one, is refused.
//   - --force replaces DST only when DST is an empty directory or an earlier
//     moeprep output every file of which its manifest lists; anything else
//     is refused, naming what is there.
//   - DST.partial is locked (flock) for the whole run, so a second run on the
//     same DST fails at once instead of interleaving with the first, and
//     --force clears a DST.partial only when it holds moeprep's progress
//     record (or nothing).
//   - The old DST is moved aside before the new one takes its name, and
//     removed only after: an interruption in between leaves both, named.

// resolveDirs makes SRC and DST absolute with every symbolic link resolved
// (DST may not exist yet: its parent is resolved), and refuses overlaps.
func resolveDirs(srcIn, dstIn string) (src, dst string, err error) {
	abs, err := filepath.Abs(srcIn)
	if err != nil {
		return "", "", err
	}
	if src, err = filepath.EvalSymlinks(abs); err != nil {
		return "", "", fmt.Errorf("%s: %w", srcIn, safeio.Unwrap(err))
	}
	if dst, err = filepath.Abs(dstIn); err != nil {
		return "", "", err
	}
	if st, err := os.Lstat(dst); err == nil && st.Mode()&fs.ModeSymlink != 0 {
		return "", "", fmt.Errorf("%s: is a symbolic link; give the directory it points to, or a new path, as the destination", dstIn)
	}
	parent, err := resolveExisting(filepath.Dir(dst))
	if err != nil {
		return "", "", fmt.Errorf("%s: cannot create the output directory: %w", dstIn, safeio.Unwrap(err))
	}
	dst = filepath.Join(parent, filepath.Base(dst))
	if src == dst || within(dst, src) || within(src, dst) {
		what := "is the source"
		switch {
		case within(dst, src):
			what = "is inside the source"
		case within(src, dst):
			what = "contains the source"
		}
		return "", "", fmt.Errorf("%s: the destination %s %s (after resolving links: %s and %s); choose a destination outside it", dstIn, what, srcIn, dst, src)
	}
	return src, dst, nil
}

// resolveExisting resolves the links of dir's longest existing prefix and
// joins the rest, which the run creates (as rclone and hf download
// --local-dir do): a DST whose parents do not exist yet is fine. The prefix
// must be a directory.
func resolveExisting(dir string) (string, error) {
	var missing []string
	for p := dir; ; p = filepath.Dir(p) {
		r, err := filepath.EvalSymlinks(p)
		if err == nil {
			if st, err := os.Stat(r); err != nil || !st.IsDir() {
				return "", fmt.Errorf("%s: not a directory", p)
			}
			for i := len(missing) - 1; i >= 0; i-- {
				r = filepath.Join(r, missing[i])
			}
			return r, nil
		}
		if !errors.Is(err, fs.ErrNotExist) || filepath.Dir(p) == p || len(missing) > 64 {
			return "", err
		}
		missing = append(missing, filepath.Base(p))
	}
}

// emptyDir reports whether path is a directory holding nothing (a link is
// not one).
func emptyDir(path string) bool {
	st, err := os.Lstat(path)
	if err != nil || !st.IsDir() {
		return false
	}
	entries, err := os.ReadDir(path)
	return err == nil && len(entries) == 0
}

// checkReplaceable refuses an existing DST that --force may not replace:
// anything but an empty directory or a complete moeprep output.
func checkReplaceable(dst, dstIn string, force bool) error {
	st, err := os.Lstat(dst)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: cannot create the output directory: %w", dstIn, safeio.Unwrap(err))
	}
	if !force {
		if emptyDir(dst) {
			return nil // nothing in it to lose: an empty DST is taken, as rclone takes one
		}
		if _, err := os.Lstat(filepath.Join(dst, layout.ManifestFileName)); err == nil {
			// Most likely this very run, finished before: say how to check it.
			return fmt.Errorf("%s: already exists and is moeprep output; --resume checks it against this run's plan (exit 0 when it is complete), --force writes it again", dstIn)
		}
		return fmt.Errorf("%s: already exists; remove it, choose another destination, or use --force to replace an earlier moeprep output", dstIn)
	}
	if !st.IsDir() {
		return fmt.Errorf("%s: exists and is %s, not an earlier moeprep output; --force replaces only moeprep's own output directories", dstIn, safeio.Kind(st.Mode()))
	}
	return ownOutput(dst, dstIn)
}

// ownOutput checks that dir is empty, or moeprep output whose manifest lists
// every file in it (so nothing anyone added after is lost with it).
func ownOutput(dir, name string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("%s: %w", name, safeio.Unwrap(err))
	}
	if len(entries) == 0 {
		return nil
	}
	man, err := layout.ReadManifest(dir)
	if err != nil {
		if _, serr := os.Lstat(filepath.Join(dir, layout.ManifestFileName)); errors.Is(serr, fs.ErrNotExist) {
			return fmt.Errorf("%s: exists and is not an earlier moeprep output (no %s; it holds %s); --force replaces only moeprep's own output, so move it or choose another destination", name, layout.ManifestFileName, describeEntries(entries))
		}
		return fmt.Errorf("%s: --force would replace it, but its manifest cannot be read (%v); remove it yourself if it is yours to remove", name, err)
	}
	listed := map[string]bool{layout.ManifestFileName: true}
	dirs := map[string]bool{}
	for n := range man.Files {
		listed[n] = true
		for d := filepath.Dir(filepath.FromSlash(n)); d != "."; d = filepath.Dir(d) {
			dirs[filepath.ToSlash(d)] = true
		}
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		rel, _ := filepath.Rel(dir, path)
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() && dirs[rel] || d.Type().IsRegular() && listed[rel] {
			return nil
		}
		return fmt.Errorf("%s: an earlier moeprep output, but %s is not one of its files; --force replaces only what moeprep wrote, so move that away first", name, rel)
	})
}

// describeEntries names a directory's first few entries for an error.
func describeEntries(entries []fs.DirEntry) string {
	var names []string
	for i, e := range entries {
		if i == 3 {
			names = append(names, fmt.Sprintf("and %d more", len(entries)-3))
			break
		}
		n := e.Name()
		if e.IsDir() {
			n += "/"
		}
		names = append(names, n)
	}
	return strings.Join(names, ", ")
}

// partialDir is DST.partial, open and locked for this run.
type partialDir struct {
	path string
	f    *os.File
}

// errBusy is what a second run on the same DST gets.
func errBusy(path string) error {
	return fmt.Errorf("%s: another moeprep run is writing this output right now (it holds the lock); wait for it to finish, or stop it", path)
}

// lockPartial creates DST.partial, or opens the one there, and locks it.
// created says which. After the lock is taken the path is checked to still
// name the locked directory, since another run may have renamed or removed
// it in between.
func lockPartial(path string) (pd *partialDir, created bool, err error) {
	// DST's parents may not exist yet (resolveDirs allows it).
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, false, fmt.Errorf("cannot create the output directory's parent %s: %w", filepath.Dir(path), safeio.Unwrap(err))
	}
	for try := 0; try < 3; try++ {
		created = false
		err := os.Mkdir(path, 0o755)
		switch {
		case err == nil:
			created = true
		case errors.Is(err, fs.ErrExist):
			st, lerr := os.Lstat(path)
			if lerr != nil {
				continue // gone again: try once more
			}
			if !st.IsDir() {
				return nil, false, fmt.Errorf("%s: exists and is %s, not moeprep's work directory; move it away", path, safeio.Kind(st.Mode()))
			}
		default:
			return nil, false, fmt.Errorf("cannot create the output directory %s: %w", path, safeio.Unwrap(err))
		}
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		busy, err := dirlock.Lock(f)
		if err != nil {
			f.Close()
			return nil, false, fmt.Errorf("%s: cannot lock it: %w", path, err)
		}
		if busy {
			f.Close()
			return nil, false, errBusy(path)
		}
		if same, _ := samePath(f, path); !same {
			f.Close()
			continue
		}
		return &partialDir{path: path, f: f}, created, nil
	}
	return nil, false, errBusy(path)
}

// samePath reports whether path still names the open file f.
func samePath(f *os.File, path string) (bool, error) {
	a, err := f.Stat()
	if err != nil {
		return false, err
	}
	b, err := os.Lstat(path)
	if err != nil {
		return false, err
	}
	return os.SameFile(a, b), nil
}

func (p *partialDir) unlock() {
	if p != nil && p.f != nil {
		p.f.Close() // closing the last descriptor drops the flock
		p.f = nil
	}
}

// clear empties a DST.partial of an earlier run for --force. It must be
// moeprep's: it holds the progress record, or nothing.
func (p *partialDir) clear() error {
	entries, err := os.ReadDir(p.path)
	if err != nil {
		return fmt.Errorf("%s: %w", p.path, safeio.Unwrap(err))
	}
	if len(entries) == 0 {
		return nil
	}
	if st, err := os.Lstat(filepath.Join(p.path, progressFileName)); err != nil || !st.Mode().IsRegular() {
		return fmt.Errorf("%s: exists but holds no %s, so it is not an interrupted moeprep run (it holds %s); --force clears only moeprep's own work directory, so move it away", p.path, progressFileName, describeEntries(entries))
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(p.path, e.Name())); err != nil {
			return fmt.Errorf("%s: clearing the interrupted run: %w", p.path, safeio.Unwrap(err))
		}
	}
	return nil
}

// install moves the finished DST.partial to DST. An existing DST (which
// --force was allowed to replace, checked again now: it may have appeared
// since the run started) is moved aside first and removed after, so no
// moment leaves neither.
func install(partial, dst, dstIn string, force bool) error {
	var old string
	if emptyDir(dst) {
		// Remove refuses a directory that is no longer empty: nothing
		// written there since the check is lost.
		if err := os.Remove(dst); err != nil {
			return fmt.Errorf("%s: was empty, now cannot be replaced: %w", dstIn, safeio.Unwrap(err))
		}
	}
	if _, err := os.Lstat(dst); err == nil {
		if err := checkReplaceable(dst, dstIn, force); err != nil {
			return err
		}
		old = dst + ".moeprep-old"
		if _, err := os.Lstat(old); err == nil {
			return fmt.Errorf("%s: exists (left by an interrupted replacement?); remove it, then rerun with --resume", old)
		}
		if err := os.Rename(dst, old); err != nil {
			return fmt.Errorf("moving the old output %s aside: %w", dst, safeio.Unwrap(err))
		}
	}
	if err := os.Rename(partial, dst); err != nil {
		return fmt.Errorf("moving %s to %s: %w", partial, dst, safeio.Unwrap(err))
	}
	if err := syncDir(filepath.Dir(dst)); err != nil {
		return err
	}
	if old != "" {
		if err := os.RemoveAll(old); err != nil {
			return fmt.Errorf("%s: the new output is in place, but removing the old one failed: %w", old, safeio.Unwrap(err))
		}
	}
	return nil
}
