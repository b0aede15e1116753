package convert

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/internal/safeio"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

// verifyComplete is --resume over a DST that is already there: a success
// when DST is what this run would have written, an error saying what
// differs otherwise. "What this run would write" is checked as far as it
// can be without rewriting it: config.json is SRC's with the contract this
// run plans (its tool and fold statistic aside, which a run measures), the
// manifest lists exactly the planned shards, index, config and copies, and
// every file hashes as the manifest says (every byte is read). Whether the
// shards' bytes are right for SRC is validate's proof, which the summary
// points to.
func (w *run) verifyComplete(ctx context.Context) (*Summary, error) {
	differs := func(what string) error {
		return fmt.Errorf("%s: already exists, but %s; --force replaces it, or choose another destination", w.o.Dst, what)
	}
	man, err := layout.ReadManifest(w.dst)
	if err != nil {
		return nil, differs(fmt.Sprintf("it is not a complete moeprep output (%v)", err))
	}
	cfgPath := filepath.Join(w.dst, checkpoint.ConfigFileName)
	cfg, err := safeio.ReadFile(cfgPath, 16<<20, "config.json")
	if err != nil {
		return nil, differs(err.Error())
	}
	var doc map[string]any
	if err := json.Unmarshal(cfg, &doc); err != nil {
		return nil, differs("its config.json is not JSON")
	}
	got, ok, err := layout.ReadContract(doc)
	if err != nil || !ok {
		return nil, differs("its config.json holds no moeprep contract")
	}
	want := *w.op.contract
	want.Tool, want.FoldMaxRelChange = got.Tool, got.FoldMaxRelChange
	wb, _ := json.Marshal(&want)
	gb, _ := json.Marshal(got)
	if !bytes.Equal(wb, gb) {
		return nil, differs("it was written with other options or from another source (its contract differs from this run's)")
	}
	if exp, err := configWithContract(w.ck.ConfigJSON, got); err != nil || !bytes.Equal(exp, cfg) {
		return nil, differs("its config.json is not SRC's config.json with the contract (SRC changed since?)")
	}
	names := []string{checkpoint.ConfigFileName, safetensors.IndexFileName}
	for _, s := range w.op.shards {
		names = append(names, s.name)
	}
	names = append(names, w.op.rankIndexNames()...)
	for _, f := range w.others {
		names = append(names, filepath.ToSlash(f))
	}
	listed := make([]string, 0, len(man.Files))
	var total int64
	for n, fi := range man.Files {
		listed = append(listed, n)
		total += fi.Size
	}
	slices.Sort(names)
	slices.Sort(listed)
	if !slices.Equal(names, listed) {
		return nil, differs("its files are not the ones this run would write")
	}
	w.o.Progress.Total(total)
	sum := &Summary{Dst: w.dst, Copied: copiedFiles(w.src, w.others), Excluded: w.excluded, Layout: string(w.o.Layout), TransformersForm: w.o.inTransformersForm, Orientation: string(w.op.contract.Orientation), Files: len(listed) + 1, Shards: len(w.op.shards),
		ReusedShards: len(w.op.shards), Ranks: got.Ranks(), Folded: got.RoutedScalingFactorFolded, FoldMaxRelChange: got.FoldMaxRelChange,
		FusedShared: got.NumFusedSharedExperts, SharedRequantized: requantizedInto(got), AlreadyComplete: true}
	sum.DType, sum.DequantizedTensors = dequantSummary(got)
	for _, n := range listed {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		fi := man.Files[n]
		h, err := layout.HashFileLike(filepath.Join(w.dst, filepath.FromSlash(n)), fi)
		if err != nil {
			return nil, differs(err.Error())
		}
		if h != fi {
			return nil, differs(fmt.Sprintf("%s does not match its manifest entry", n))
		}
		w.o.Progress.Add(fi.Size)
		sum.Bytes += fi.Size
	}
	return sum, nil
}
