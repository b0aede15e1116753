package convert

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/moeprep/moeprep/layout"
)

// progressRecord is DST.partial/moeprep-progress.json: what the run was
// (fingerprint) and which shards are finished, with their checksums.
type progressRecord struct {
	Version     int                        `json:"version"`
	Fingerprint string                     `json:"fingerprint"`
	Options     map[string]string          `json:"options,omitempty"` // the flags that change output bytes, to name the ones a resume changed
	Shards      map[string]layout.FileInfo `json:"shards"`
}

// byteOptions are the run's flags that change output bytes, by flag name.
func (o *Options) byteOptions() map[string]string {
	return map[string]string{
		"--layout":         string(o.Layout),
		"fuse-shared":      fmt.Sprint(o.FuseShared),
		"--tp":             fmt.Sprint(o.TP),
		"--replicas":       fmt.Sprint(o.Replicas),
		"--fold-scaling":   o.FoldScaling,
		"--max-shard-size": fmt.Sprint(o.MaxShardSize),
		"--digest":         o.Digest.String(),
	}
}

// optionChanges names the flags whose values differ from the recorded run's,
// "--digest blake3, now xxh3"; empty when none differ or none were recorded.
func optionChanges(was, now map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(now)) {
		if v, ok := was[k]; ok && v != now[k] {
			out = append(out, fmt.Sprintf("%s %s, now %s", k, v, now[k]))
		}
	}
	return strings.Join(out, "; ")
}

type progressState struct {
	mu    sync.Mutex
	path  string
	rec   progressRecord
	reuse map[string]layout.FileInfo
}

// fingerprint identifies the run: source files (name, size, mtime), the
// options that change output bytes, and every planned shard header.
func (w *run) fingerprint() string {
	h := sha256.New()
	fmt.Fprintf(h, "moeprep progress v%d\nsrc %s\n", layout.ContractVersion, w.src)
	for _, f := range w.ck.WeightFiles {
		if st, err := os.Stat(filepath.Join(w.src, f)); err == nil {
			fmt.Fprintf(h, "file %s %d %d\n", f, st.Size(), st.ModTime().UnixNano())
		}
	}
	o := w.o
	fmt.Fprintf(h, "layout %s fuse %v tp %d replicas %d fold %s max %d\n", o.Layout, o.FuseShared, o.TP, o.Replicas, o.FoldScaling, o.MaxShardSize)
	if o.Digest != layout.BLAKE3Blocks {
		// BLAKE3 was the only shard digest when fingerprints were introduced:
		// leaving it out keeps those partial outputs resumable.
		fmt.Fprintf(h, "digest %s\n", o.Digest)
	}
	for _, s := range w.op.shards {
		fmt.Fprintf(h, "shard %s %d ", s.name, s.size)
		h.Write(s.header)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// preparePartial creates DST.partial, or with --resume checks the one there
// and keeps the finished shards whose checksums still match.
func (w *run) preparePartial() error {
	fpr := w.fingerprint()
	w.prog = &progressState{path: filepath.Join(w.partial, progressFileName),
		rec: progressRecord{Version: layout.ContractVersion, Fingerprint: fpr, Options: w.o.byteOptions(), Shards: map[string]layout.FileInfo{}}}
	_, err := os.Lstat(w.partial)
	exists := err == nil
	switch {
	case exists && w.o.Resume:
		if err := w.loadProgress(fpr); err != nil {
			return err
		}
	case exists && w.o.Force:
		if err := os.RemoveAll(w.partial); err != nil {
			return fmt.Errorf("%s: removing the interrupted run: %w", w.partial, err)
		}
	case exists:
		return fmt.Errorf("%s exists (an interrupted run?): use --resume to continue it or --force to start over", w.partial)
	}
	if err := os.MkdirAll(w.partial, 0o755); err != nil {
		return fmt.Errorf("cannot create the output directory: %w", err)
	}
	// Fail early and clearly on an unwritable destination.
	return w.prog.save()
}

func (w *run) loadProgress(fpr string) error {
	b, err := os.ReadFile(w.prog.path)
	if err != nil {
		return fmt.Errorf("%s: cannot resume: %w; remove %s or use --force to start over", w.prog.path, err, w.partial)
	}
	var rec progressRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.Shards == nil {
		return fmt.Errorf("%s: cannot resume: unreadable progress record; remove %s or use --force to start over", w.prog.path, w.partial)
	}
	if rec.Fingerprint != fpr {
		what := "it was started from a different source or with different options"
		if ch := optionChanges(rec.Options, w.o.byteOptions()); ch != "" {
			what = "it was started with " + ch
		} else if rec.Options == nil && w.o.Digest != layout.BLAKE3Blocks && blake3Shards(rec.Shards) {
			// Written before XXH3 became the default (and before options were recorded).
			what = "it was started by an earlier moeprep, which hashed shards with BLAKE3 (resume with --digest blake3), or with different options"
		}
		return fmt.Errorf("%s: cannot resume: %s; rerun with the same ones, or use --force to start over", w.partial, what)
	}
	w.prog.reuse = map[string]layout.FileInfo{}
	for name, want := range rec.Shards {
		if name != filepath.Base(name) || !strings.HasSuffix(name, ".safetensors") {
			continue
		}
		path := filepath.Join(w.partial, name)
		got, err := layout.HashFileLike(path, want)
		if err == nil && got == want {
			w.prog.reuse[name] = got
			w.prog.rec.Shards[name] = got
		} else if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			return fmt.Errorf("%s: %w", path, rmErr)
		}
	}
	return nil
}

// blake3Shards reports whether any recorded shard has a BLAKE3 block digest.
func blake3Shards(shards map[string]layout.FileInfo) bool {
	for _, fi := range shards {
		if fi.B3Blocks.BlockSize > 0 {
			return true
		}
	}
	return false
}

func (p *progressState) reusable(name string) (layout.FileInfo, bool) {
	fi, ok := p.reuse[name]
	return fi, ok
}

// done records a finished shard.
func (p *progressState) done(name string, fi layout.FileInfo) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rec.Shards[name] = fi
	return p.saveLocked()
}

func (p *progressState) save() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.saveLocked()
}

// saveLocked replaces the record (temporary name and rename, so a killed run
// leaves the old record or the new one). It is not fsynced: the record only
// saves work, every shard it names was fsynced before it was added, and
// after a power failure a lost record means redoing shards, while an fsync
// per shard costs a journal commit on the path of every run.
func (p *progressState) saveLocked() error {
	b, err := json.MarshalIndent(p.rec, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(p.path, b)
}
