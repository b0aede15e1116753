package convert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/moeprep/moeprep/internal/safeio"
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
	Options     map[string]string          `json:"options,omitempty"`       // the flags that change output bytes, to name the ones a resume changed
	Config      string                     `json:"config_sha256,omitempty"` // SRC config.json's bytes, to say so when they changed
	Shards      map[string]layout.FileInfo `json:"shards"`
	// Sources is each finished shard's source digest (srcdigest.go): a
	// shard without one is never reused.
	Sources map[string]string `json:"source_xxh3,omitempty"`
}

// maxProgressBytes bounds the progress record read back: it holds a line or
// two per shard, some 300 bytes each; a checkpoint of 100,000 shards would
// need 30 MB.
const maxProgressBytes = 64 << 20

// byteOptions are the run's flags that change output bytes, by flag name.
func (o *Options) byteOptions() map[string]string {
	m := map[string]string{
		"--layout":         string(o.Layout),
		"--orientation":    string(o.Orientation),
		"fuse-shared":      fmt.Sprint(o.FuseShared),
		"--tp":             fmt.Sprint(o.TP),
		"--replicas":       fmt.Sprint(o.Replicas),
		"--fold-scaling":   o.FoldScaling,
		"--max-shard-size": fmt.Sprint(o.MaxShardSize),
		"--digest":         o.Digest.String(),
	}
	if o.RequantizeShared { // recorded where set, so that earlier records still compare
		m["--requantize-shared"] = "true"
	}
	if o.DType != "" {
		m["--dtype"] = string(o.DType)
	}
	if o.EP > 0 {
		m["--ep"], m["--moe-tp"], m["--slots"] = fmt.Sprint(o.EP), fmt.Sprint(o.MoETP), fmt.Sprint(o.Slots)
		m["--placement"], m["--placement-map"], m["--nodes"] = o.PlacementStats, o.PlacementMap, fmt.Sprint(o.Nodes)
	}
	return m
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
	cands map[string]candidate // finished shards of the interrupted run, not yet checked
}

// candidate is a shard the interrupted run finished: its manifest entry and
// source digest.
type candidate struct {
	fi  layout.FileInfo
	src string
}

// fingerprint identifies the run: source files (name, size, mtime) and
// config.json's bytes, the options that change output bytes, and every
// planned shard header. The source's tensor bytes are checked shard by
// shard (reuse), not here.
func (w *run) fingerprint() string {
	h := sha256.New()
	fmt.Fprintf(h, "moeprep progress v%d\nsrc %s\n", layout.ContractVersion, w.src)
	fmt.Fprintf(h, "config %s\n", configDigest(w.ck.ConfigJSON))
	for _, f := range w.ck.WeightFiles {
		if st, err := os.Stat(filepath.Join(w.src, f)); err == nil {
			fmt.Fprintf(h, "file %s %d %d\n", f, st.Size(), st.ModTime().UnixNano())
		}
	}
	o := w.o
	fmt.Fprintf(h, "layout %s fuse %v tp %d replicas %d fold %s max %d\n", o.Layout, o.FuseShared, o.TP, o.Replicas, o.FoldScaling, o.MaxShardSize)
	if o.RequantizeShared {
		fmt.Fprintf(h, "requantize-shared\n")
	}
	if o.Orientation == layout.InOut {
		// Only when in-out: out-in runs keep the fingerprints they had.
		fmt.Fprintf(h, "orientation %s\n", o.Orientation)
	}
	if o.Digest != layout.BLAKE3Blocks {
		// BLAKE3 was the only shard digest when fingerprints were introduced:
		// leaving it out keeps those partial outputs resumable.
		fmt.Fprintf(h, "digest %s\n", o.Digest)
	}
	if o.DType != "" {
		fmt.Fprintf(h, "dtype %s\n", o.DType)
	}
	fmt.Fprint(h, o.rankFingerprint(w.op)) // "" without --ep
	for _, s := range w.op.shards {
		fmt.Fprintf(h, "shard %s %d ", s.name, s.size)
		h.Write(s.header)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func configDigest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// preparePartial creates and locks DST.partial, or locks the one there and,
// with --resume, loads its progress record (the finished shards are checked
// as the run reaches them: reuse), or with --force clears it.
func (w *run) preparePartial() error {
	fpr := w.fingerprint()
	w.prog = &progressState{path: filepath.Join(w.partial, progressFileName),
		rec: progressRecord{Version: layout.ContractVersion, Fingerprint: fpr, Options: w.o.byteOptions(),
			Config: configDigest(w.ck.ConfigJSON), Shards: map[string]layout.FileInfo{}, Sources: map[string]string{}}}
	pd, created, err := lockPartial(w.partial)
	if err != nil {
		return err
	}
	w.lock = pd
	if !created {
		switch {
		case w.o.Resume:
			if err := w.loadProgress(fpr); err != nil {
				return err
			}
		case w.o.Force:
			if err := pd.clear(); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s exists (an interrupted run?): use --resume to continue it or --force to start over", w.partial)
		}
	}
	// Fail early and clearly on an unwritable destination.
	return w.prog.save()
}

func (w *run) loadProgress(fpr string) error {
	b, err := safeio.ReadFile(w.prog.path, maxProgressBytes, "a progress record")
	if err != nil {
		return fmt.Errorf("cannot resume: %w; remove %s or use --force to start over", err, w.partial)
	}
	var rec progressRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.Shards == nil {
		return fmt.Errorf("%s: cannot resume: unreadable progress record; remove %s or use --force to start over", w.prog.path, w.partial)
	}
	if rec.Fingerprint != fpr {
		what := "it was started from a different source or with different options"
		if rec.Config != "" && rec.Config != w.prog.rec.Config {
			what = "SRC's config.json has changed since it was started"
		} else if ch := optionChanges(rec.Options, w.o.byteOptions()); ch != "" {
			what = "it was started with " + ch
		} else if rec.Options == nil && w.o.Digest != layout.BLAKE3Blocks && blake3Shards(rec.Shards) {
			// Written before XXH3 became the default (and before options were recorded).
			what = "it was started by an earlier moeprep, which hashed shards with BLAKE3 (resume with --digest blake3), or with different options"
		}
		return fmt.Errorf("%s: cannot resume: %s; rerun with the same ones, or use --force to start over", w.partial, what)
	}
	w.prog.cands = map[string]candidate{}
	for name, want := range rec.Shards {
		if name != filepath.Base(name) || !strings.HasSuffix(name, ".safetensors") {
			continue
		}
		if src, ok := rec.Sources[name]; ok {
			w.prog.cands[name] = candidate{want, src}
			// Kept in the record until checked, so that another interruption
			// loses no work; a check that fails replaces the entry.
			w.prog.rec.Shards[name], w.prog.rec.Sources[name] = want, src
		} else if err := os.Remove(filepath.Join(w.partial, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			// Finished by a moeprep that kept no source digest: redone.
			return fmt.Errorf("%s: %w", filepath.Join(w.partial, name), err)
		}
	}
	return nil
}

// reuse decides whether shard s, finished by the interrupted run, can stay:
// its file must still hash as recorded, and its source bytes must still
// hash as they did when it was written (srcdigest.go). A shard that fails
// either is removed and written again. ok false with no error means write it.
func (p *progressState) reuse(ctx context.Context, s *shardPlan, dir string) (fi layout.FileInfo, src string, ok bool, err error) {
	p.mu.Lock()
	c, found := p.cands[s.name]
	p.mu.Unlock()
	if !found {
		return layout.FileInfo{}, "", false, nil
	}
	path := filepath.Join(dir, s.name)
	got, herr := layout.HashFileLike(path, c.fi)
	if herr == nil && got == c.fi {
		now, err := s.sourceDigest(ctx)
		if err != nil {
			return layout.FileInfo{}, "", false, err
		}
		if now == c.src {
			return c.fi, c.src, true, nil
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return layout.FileInfo{}, "", false, fmt.Errorf("%s: %w", path, err)
	}
	return layout.FileInfo{}, "", false, nil
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

// done records a finished shard and its source digest.
func (p *progressState) done(name string, fi layout.FileInfo, src string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rec.Shards[name] = fi
	p.rec.Sources[name] = src
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
