package convert

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

// PartialSuffix is appended to DST for the work directory.
const PartialSuffix = ".partial"

// Convert runs convert (o.FuseShared false) or fuse-shared. Everything is
// written under DST.partial, renamed to DST only once complete; on any error or
// cancellation DST.partial is left for --resume and DST is not touched.
func Convert(ctx context.Context, o Options) (*Summary, error) {
	start := time.Now()
	if err := o.norm(); err != nil {
		return nil, err
	}
	src, dst, err := checkDirs(o.Src, o.Dst, o.Force)
	if err != nil {
		return nil, err
	}
	ck, err := checkpoint.Open(src)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	if c, ok, _ := layout.ReadContract(ck.Config); ok {
		what := "it"
		if c != nil {
			what = fmt.Sprintf("its %s layout", c.Layout)
		}
		return nil, fmt.Errorf("%s: already moeprep output (config.json has a %q contract); convert the original checkpoint instead of %s", src, layout.ContractKey, what)
	} else if _, has := ck.Config[layout.ContractKey]; has {
		return nil, fmt.Errorf("%s: already moeprep output (config.json has a %q object); convert the original checkpoint instead", src, layout.ContractKey)
	}
	fp, err := ck.Plan()
	if err != nil {
		return nil, err
	}
	op, err := buildPlan(ck, fp, &o)
	if err != nil {
		return nil, err
	}
	others, err := ck.OtherFiles()
	if err != nil {
		return nil, err
	}
	if err := checkCollisions(src, others, op); err != nil {
		return nil, err
	}
	w := &run{o: &o, ck: ck, op: op, src: src, dst: dst, partial: dst + PartialSuffix, others: others}
	sum, err := w.execute(ctx)
	if err != nil {
		return nil, diskFull(w.partial, err)
	}
	sum.Seconds = time.Since(start).Seconds()
	if sum.Seconds > 0 {
		sum.GBPerSec = float64(sum.Bytes) / sum.Seconds / 1e9
	}
	return sum, nil
}

// diskFull makes a full disk say so in the one-line error.
func diskFull(dir string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%s: disk full (or quota exceeded) while writing: %w", dir, err)
	}
	return err
}

// checkDirs resolves SRC and DST and refuses overlapping or existing outputs.
func checkDirs(srcIn, dstIn string, force bool) (string, string, error) {
	src, err := filepath.Abs(srcIn)
	if err != nil {
		return "", "", err
	}
	dst, err := filepath.Abs(dstIn)
	if err != nil {
		return "", "", err
	}
	if src == dst || within(dst, src) || within(src, dst) {
		return "", "", fmt.Errorf("%s: the destination must be outside the source %s and not contain it", dstIn, srcIn)
	}
	if _, err := os.Lstat(dst); err == nil {
		if !force {
			return "", "", fmt.Errorf("%s: already exists; remove it or use --force to replace it", dstIn)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", "", fmt.Errorf("%s: cannot create the output directory: %w", dstIn, unwrapPath(err))
	}
	return src, dst, nil
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != "." && !strings.HasPrefix(rel, "..")
}

// Names of the files moeprep itself writes besides the shards.
const progressFileName = "moeprep-progress.json"

func checkCollisions(src string, others []string, op *outPlan) error {
	ours := map[string]bool{checkpoint.ConfigFileName: true, safetensors.IndexFileName: true,
		layout.ManifestFileName: true, progressFileName: true}
	for _, s := range op.shards {
		ours[s.name] = true
	}
	for _, f := range others {
		if ours[filepath.ToSlash(f)] {
			return fmt.Errorf("%s: file %s would be overwritten by moeprep's own output of that name; move it away", src, f)
		}
	}
	return nil
}

// run is one conversion in progress.
type run struct {
	o        *Options
	ck       *checkpoint.Checkpoint
	op       *outPlan
	src, dst string
	partial  string
	others   []string
	prog     *progressState
	reused   atomic.Int64
}

func (w *run) execute(ctx context.Context) (*Summary, error) {
	if err := w.preparePartial(); err != nil {
		return nil, err
	}
	total := int64(0)
	for _, s := range w.op.shards {
		total += s.size
	}
	for _, f := range w.others {
		if st, err := os.Stat(filepath.Join(w.src, f)); err == nil {
			total += st.Size()
		}
	}
	w.o.Progress.Total(total)

	files := map[string]layout.FileInfo{}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(w.o.Jobs)
	for _, s := range w.op.shards {
		if fi, ok := w.prog.reusable(s.name); ok {
			files[s.name] = fi
			w.reused.Add(1)
			w.o.Progress.Add(s.size)
			continue
		}
		g.Go(func() error {
			fi, err := w.writeShard(gctx, s)
			if err != nil {
				return err
			}
			mu.Lock()
			files[s.name] = fi
			mu.Unlock()
			return w.prog.done(s.name, fi)
		})
	}
	if err := g.Wait(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: stopped; rerun with --resume to finish: %w", w.partial, ctx.Err())
		}
		return nil, err
	}
	var unsynced []string // small files, synced together by finish
	for _, f := range w.others {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("%s: stopped; rerun with --resume to finish: %w", w.partial, err)
		}
		dst := filepath.Join(w.partial, f)
		fi, err := copyFile(filepath.Join(w.src, f), dst)
		if err != nil {
			return nil, err
		}
		unsynced = append(unsynced, dst)
		w.o.Progress.Add(fi.Size)
		files[filepath.ToSlash(f)] = fi
	}
	if err := w.finish(files, unsynced); err != nil {
		return nil, err
	}
	sum := &Summary{Dst: w.dst, Layout: string(w.o.Layout), Files: len(files) + 1, Shards: len(w.op.shards),
		ReusedShards: int(w.reused.Load()), Folded: w.op.contract.RoutedScalingFactorFolded,
		FoldMaxRelChange: w.op.contract.FoldMaxRelChange, FusedShared: w.op.contract.NumFusedSharedExperts}
	for _, fi := range files {
		sum.Bytes += fi.Size
	}
	return sum, nil
}

// finish writes the index, config.json and the manifest, syncs them with the
// unsynced files copied before, then moves DST.partial to DST.
func (w *run) finish(files map[string]layout.FileInfo, unsynced []string) error {
	idx := &safetensors.Index{Metadata: map[string]any{"total_size": w.op.dataBytes}, WeightMap: map[string]string{}}
	for _, s := range w.op.shards {
		for _, t := range s.tensors {
			idx.WeightMap[t.name] = s.name
		}
	}
	idxPath := filepath.Join(w.partial, safetensors.IndexFileName)
	ib, err := safetensors.EncodeIndex(idx)
	if err != nil {
		return fmt.Errorf("%s: %w", idxPath, err)
	}
	fi, err := writeFile(idxPath, ib)
	if err != nil {
		return err
	}
	files[safetensors.IndexFileName] = fi

	c := w.op.contract
	c.FoldMaxRelChange = w.op.stats.max()
	if w.reused.Load() > 0 && c.RoutedScalingFactorFolded {
		// Reused shards were folded by the interrupted run, whose changes this
		// run did not see: recompute the statistic from the source alone.
		m, err := w.refoldStats()
		if err != nil {
			return err
		}
		c.FoldMaxRelChange = m
	}
	cfg, err := configWithContract(w.ck.ConfigJSON, c)
	if err != nil {
		return fmt.Errorf("%s/config.json: %w", w.src, err)
	}
	cfgPath := filepath.Join(w.partial, checkpoint.ConfigFileName)
	if fi, err = writeFile(cfgPath, cfg); err != nil {
		return err
	}
	files[checkpoint.ConfigFileName] = fi
	man, err := manifestJSON(files)
	if err != nil {
		return err
	}
	manPath := filepath.Join(w.partial, layout.ManifestFileName)
	if _, err := writeFile(manPath, man); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(w.partial, progressFileName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// The small files and their directories' entries, in one commit.
	if err := syncFiles(append(unsynced, idxPath, cfgPath, manPath)); err != nil {
		return err
	}
	if w.o.Force {
		if err := os.RemoveAll(w.dst); err != nil {
			return fmt.Errorf("%s: removing the old output: %w", w.dst, err)
		}
	}
	if err := os.Rename(w.partial, w.dst); err != nil {
		return fmt.Errorf("moving %s to %s: %w", w.partial, w.dst, err)
	}
	return syncDir(filepath.Dir(w.dst))
}

// refoldStats recomputes fold_max_rel_change by reading every folded source
// region once (used only after --resume reused folded shards).
func (w *run) refoldStats() (float64, error) {
	st := &foldStats{}
	buf := make([]byte, chunkSize)
	for _, t := range w.op.tensors {
		for _, p := range t.parts {
			if !p.fold {
				continue
			}
			step := chunkSize / int64(p.dtype.Size()) * int64(p.dtype.Size())
			for pos := int64(0); pos < p.size(); pos += step {
				b := buf[:min(step, p.size()-pos)]
				if err := p.readAt(b, pos); err != nil {
					return 0, err
				}
				st.note(foldInPlace(b, p.dtype, p.factor))
			}
		}
	}
	return st.max(), nil
}
