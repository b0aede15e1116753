package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/human"
	"github.com/moeprep/moeprep/validate"
	"github.com/moeprep/moeprep/validate/rankproof"
)

// runRankProof runs the per-rank byte proof where DST is a per-rank
// output (convert --ep) or --rank asks for one rank: handled is false when
// neither applies and the usual validate runs.
func runRankProof(cmd *cobra.Command, f *validateFlags, src, dst string) (handled bool, err error) {
	rankSet := cmd.Flags().Changed("rank")
	perRank, perr := rankproof.IsPerRank(dst)
	if !rankSet && (perr != nil || !perRank || src == "") {
		return false, nil // validate reports what it finds
	}
	if src == "" {
		return true, fmt.Errorf("--rank: give SRC and DST: each slot is proven against SRC's expert")
	}
	if perr != nil {
		return true, perr
	}
	if !perRank {
		return true, fmt.Errorf("%s: --rank %d: not a per-rank output (its contract has no expert_parallel)", dst, f.rank)
	}
	if f.rank < 0 && rankSet {
		return true, fmt.Errorf("--rank %d: want a rank from 0", f.rank)
	}
	if src, err = sourceDir(cmd, "validate", src, f.revision); err != nil {
		return true, err
	}
	rank := -1
	if rankSet {
		rank = f.rank
	}
	// The layers and the device are resolved before anything is read: a
	// bad --layers or --device cuda without a GPU fails at once.
	ro, sel, err := rankLayerOptions(f, src, dst, rank < 0 && !f.bytesOnly)
	if err != nil {
		return true, err
	}
	res, err := rankproof.Check(cmd.Context(), src, dst, rank)
	if err != nil {
		return true, err
	}
	res.LayerSelection, res.Notes = sel.spec, sel.notes
	if res.Failure == "" && rank < 0 && !f.bytesOnly {
		// Every rank's files: the layers recomposed from them, on the GPU
		// (its CPU twin on --cpu-check's layers) or the CPU.
		res.Device = "cpu"
		if ro.GPU {
			res.Device = "cuda"
		}
		res.LayersRecomposed, res.LayersNotRecomposed = ro.Layers, sel.notRecomposed
		if res.Recomposed, err = rankproof.CheckRecomposed(cmd.Context(), src, dst, ro); err != nil {
			return true, err
		}
		for _, lc := range res.Recomposed {
			if !lc.Pass && res.Failure == "" {
				res.Failure = fmt.Sprintf("layer %s recomposed from the ranks on %s (replica %d of each expert): relative L2 %.3g against SRC, over %g", family.KeyLabel(lc.Layer), lc.Device, lc.Replica, lc.RelL2, lc.Tolerance)
			}
		}
	}
	if err := f.report.emit(cmd, res, func(w io.Writer) error { return writeRankProof(w, res) }); err != nil {
		return true, err
	}
	if res.Failure != "" {
		return true, exitcode.Check("validate: " + res.Failure)
	}
	return true, nil
}

// rankSelection is what --layers and --device chose for a per-rank
// output's recomposition, for its report.
type rankSelection struct {
	spec          string
	notRecomposed []int
	notes         []string
}

// rankLayerOptions resolves --layers, --device, --precision and
// --cpu-check for the recomposition of per-rank output dst as a
// whole-model run resolves them (validate's parser and device choice):
// --device auto takes the GPU when there is one and its kernels take the
// experts, --device cuda fails without. recompose is false where no
// recomposition runs (--rank, --bytes): the spec is still checked.
func rankLayerOptions(f *validateFlags, src, dst string, recompose bool) (rankproof.Options, rankSelection, error) {
	ro := rankproof.Options{Tokens: f.tokens, Seed: f.seed}
	sel := rankSelection{spec: strings.TrimSpace(f.layers)}
	all, recomposable, err := rankproof.Layers(src, dst)
	if err != nil {
		return ro, sel, err
	}
	chosen, err := validate.SelectLayers(f.layers, all)
	if err != nil {
		return ro, sel, err
	}
	if !recompose {
		return ro, sel, nil
	}
	ro.Layers = []int{} // none chosen is not all
	for _, l := range all {
		if slices.Contains(chosen, l) && slices.Contains(recomposable, l) {
			ro.Layers = append(ro.Layers, l)
		} else {
			sel.notRecomposed = append(sel.notRecomposed, l)
		}
	}
	if len(ro.Layers) == 0 {
		return ro, sel, fmt.Errorf("no layer to recompose (--layers %s; hash-routed layers are proven by their bytes alone)", sel.spec)
	}
	o := validate.Options{Src: src, Dst: dst, Layers: f.layers, Tokens: f.tokens, Seed: f.seed, Device: validate.Device(f.device),
		GPUPrecision: validate.Precision(f.precision), CPUCheck: validate.CPUCheckMode(f.cpuCheck), BlockSize: f.blockSize, Notice: func(string) {}}
	if sel.notes, err = o.Resolve(); err != nil {
		return ro, sel, err
	}
	if o.Device == validate.DeviceCUDA {
		why, err := rankproof.GPURefusal(src, dst, string(o.GPUPrecision))
		if err != nil {
			return ro, sel, err
		}
		if why != "" {
			note, err := o.GPURefused(f.device, why)
			if err != nil {
				return ro, sel, err
			}
			sel.notes = append(sel.notes, note)
		}
	}
	if o.Device == validate.DeviceCUDA {
		if f.ioBaseline {
			return ro, sel, fmt.Errorf("--io-baseline times a whole-model GPU run's uploads; a per-rank output's recomposition has none: drop it")
		}
		ro.GPU, ro.Precision = true, string(o.GPUPrecision)
		ro.CPUTwin = validate.CPUChecked(ro.Layers, o.CPUCheck)
	}
	return ro, sel, nil
}

func writeRankProof(w io.Writer, r *rankproof.Result) error {
	ranks := fmt.Sprint(r.Ranks)
	if len(r.Ranks) == 1 {
		ranks = fmt.Sprint("rank ", r.Ranks[0])
	} else {
		ranks = fmt.Sprintf("%d ranks", len(r.Ranks))
	}
	verdict := "PASS"
	if r.Failure != "" {
		verdict = "FAIL: " + r.Failure
	}
	var b strings.Builder
	fmt.Fprintf(&b, "per-rank output (%s): %s\n", ranks, verdict)
	fmt.Fprintf(&b, "  %s proven against SRC's experts, %s byte for byte\n", human.Count(r.Slots, "slot"), human.Count(r.SharedCopies, "shared tensor"))
	fmt.Fprintf(&b, "  read %s of DST (the shared files %s, the rank files %s) and %s of SRC\n",
		human.Bytes(r.DSTBytesRead), human.Bytes(r.SharedBytes), human.Bytes(r.RankBytes), human.Bytes(r.SRCBytesRead))
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	for _, lc := range r.Recomposed {
		v := "PASS"
		if !lc.Pass {
			v = "FAIL"
		}
		// against SRC's, the MoE-TP parts summed
		fmt.Fprintf(&b, "  layer %s routed experts from the ranks (%s, replica %d of each): rel L2 %.3g <= %g %s\n", family.KeyLabel(lc.Layer), lc.Device, lc.Replica, lc.RelL2, lc.Tolerance, v)
		if lc.Note != "" {
			fmt.Fprintf(&b, "    %s\n", lc.Note)
		}
	}
	if len(r.Recomposed) == 0 {
		b.WriteString("  layers not recomposed (one rank alone, or --bytes): the byte proof alone\n")
	} else if len(r.LayersNotRecomposed) > 0 {
		fmt.Fprintf(&b, "  layers not recomposed: %s (--layers %s, or hash-routed); their slots' bytes are proven\n", layerList(r.LayersNotRecomposed), r.LayerSelection)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// layerList is 1,2,5 as --layers takes it.
func layerList(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}
