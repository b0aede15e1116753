package convert

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// PartialSuffix is appended to DST for the work directory.
const PartialSuffix = ".partial"

// Convert runs convert (o.FuseShared false) or fuse-shared. Everything is
// written under DST.partial, renamed to DST only once complete; on any error or
// cancellation DST.partial is left for --resume and DST is not touched.
// With Resume, a DST that is already complete, verified against its
// manifest and matching this run's plan, is a success with nothing to do
// (Summary.AlreadyComplete): reruns in retry loops are idempotent.
func Convert(ctx context.Context, o Options) (*Summary, error) {
	start := time.Now()
	w, err := prepare(&o)
	if err != nil {
		return nil, err
	}
	defer w.ck.Close()
	if o.Resume && !o.Force && exists(w.dst) && !exists(w.partial) {
		sum, err := w.verifyComplete(ctx)
		if err != nil {
			return nil, err
		}
		sum.Seconds, sum.Notices = time.Since(start).Seconds(), w.notices
		return sum, nil
	}
	if err := checkReplaceable(w.dst, o.Dst, o.Force); err != nil {
		return nil, err
	}
	defer func() { w.lock.unlock() }() // w.lock is set by preparePartial
	sum, err := w.execute(ctx)
	if err != nil {
		return nil, diskFull(w.partial, err)
	}
	sum.Seconds, sum.Notices = time.Since(start).Seconds(), w.notices
	if sum.Seconds > 0 {
		sum.GBPerSec = float64(sum.Bytes) / sum.Seconds / 1e9
	}
	return sum, nil
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// prepare checks the options and directories, opens SRC and plans every
// output shard: all Convert and DryRun do before writing anything. The
// caller closes w.ck.
func prepare(o *Options) (*run, error) {
	if err := o.norm(); err != nil {
		return nil, err
	}
	src, dst, err := resolveDirs(o.Src, o.Dst)
	if err != nil {
		return nil, err
	}
	ck, err := checkpoint.Open(src)
	if err != nil {
		return nil, err
	}
	w, err := planRun(o, ck, src, dst)
	if err != nil {
		ck.Close()
		return nil, err
	}
	return w, nil
}

func planRun(o *Options, ck *checkpoint.Checkpoint, src, dst string) (*run, error) {
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
	if o.Notice != nil {
		for _, n := range fp.Notices {
			o.Notice(n)
		}
	}
	if err := resolveTransformers(o, fp, src); err != nil {
		return nil, err
	}
	o.inTransformersForm = inTransformersForm(o, fp)
	op, err := buildPlan(ck, fp, o)
	if err != nil {
		return nil, err
	}
	others, err := ck.OtherFiles()
	if err != nil {
		return nil, err
	}
	if o.DType != "" {
		// ModelOpt's quantisation description: the output has no
		// quantised weights left for it to describe.
		others = slices.DeleteFunc(others, func(f string) bool { return filepath.ToSlash(f) == checkpoint.HFQuantConfigFileName })
	}
	others, excluded, err := applyExclude(o.Exclude, others, append(slices.Clone(ck.WeightFiles), checkpoint.ConfigFileName))
	if err != nil {
		return nil, err
	}
	// The contract records what was left out on purpose, file by file, so
	// that the byte proof tells it from a file lost by accident.
	op.contract.ExcludedFiles = excluded
	notices := fp.Notices
	for _, n := range weightFolderNotices(src, others, ck.TotalBytes()) {
		if o.Notice != nil {
			o.Notice(n)
		}
		notices = append(slices.Clone(notices), n)
	}
	if err := checkCollisions(src, others, op); err != nil {
		return nil, err
	}
	return &run{o: o, ck: ck, op: op, src: src, dst: dst, partial: dst + PartialSuffix, others: others, excluded: excluded, notices: notices}, nil
}

// diskFull makes a full disk say so in the one-line error.
func diskFull(dir string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%s: disk full (or quota exceeded) while writing: %w", dir, err)
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
	for _, n := range op.rankIndexNames() {
		ours[n] = true
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
	excluded []string // SRC's files --exclude left out, slash-separated
	notices  []string // family.Plan.Notices of SRC, and the copied folders that hold weights
	prog     *progressState
	lock     *partialDir // DST.partial, locked from preparePartial until the run returns
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
	if err := w.op.makeRankDirs(w.partial); err != nil {
		return nil, err
	}

	files := map[string]layout.FileInfo{}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(w.o.Jobs)
	for _, s := range w.op.shards {
		g.Go(func() error {
			fi, src, ok, err := w.prog.reuse(gctx, s, w.partial)
			if err != nil {
				return err
			}
			if ok {
				w.reused.Add(1)
				w.o.Progress.Add(s.size)
			} else if fi, src, err = w.writeShard(gctx, s); err != nil {
				return err
			}
			mu.Lock()
			files[s.name] = fi
			mu.Unlock()
			return w.prog.done(s.name, fi, src)
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
	sum := &Summary{Dst: w.dst, Copied: copiedFiles(w.src, w.others), Excluded: w.excluded, Layout: string(w.o.Layout), TransformersForm: w.o.inTransformersForm, Orientation: string(w.op.contract.Orientation), Files: len(files) + 1, Shards: len(w.op.shards),
		ReusedShards: int(w.reused.Load()), Ranks: w.op.contract.Ranks(), Folded: w.op.contract.RoutedScalingFactorFolded,
		FoldMaxRelChange: w.op.contract.FoldMaxRelChange, FusedShared: w.op.contract.NumFusedSharedExperts,
		SharedRequantized: requantizedInto(w.op.contract)}
	sum.DType, sum.DequantizedTensors = dequantSummary(w.op.contract)
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
		if s.rankFile() {
			continue // in its rank's index
		}
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
	rankIdx, err := w.op.writeRankIndexes(w.partial, files)
	if err != nil {
		return err
	}
	unsynced = append(unsynced, rankIdx...)

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
	return install(w.partial, w.dst, w.o.Dst, w.o.Force)
}

// refoldStats recomputes fold_max_rel_change by reading every folded source
// region once (used only after --resume reused folded shards).
func (w *run) refoldStats() (float64, error) {
	st := &foldStats{}
	buf := make([]byte, chunkSize)
	for _, t := range append(slices.Clone(w.op.tensors), w.op.rankTensors...) {
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
				st.note(weightfmt.FoldInPlace(p.dtype, b, p.factor))
			}
		}
	}
	return st.max(), nil
}
