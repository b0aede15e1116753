package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/human"
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
	res, err := rankproof.Check(cmd.Context(), src, dst, rank)
	if err != nil {
		return true, err
	}
	if res.Failure == "" && rank < 0 && !f.bytesOnly {
		// Every rank's files: the layers recomposed from them, on the CPU.
		if res.Recomposed, err = rankproof.CheckRecomposed(cmd.Context(), src, dst, f.tokens, f.seed); err != nil {
			return true, err
		}
		for _, lc := range res.Recomposed {
			if !lc.Pass && res.Failure == "" {
				res.Failure = fmt.Sprintf("layer %s recomposed from the ranks (replica %d of each expert): relative L2 %.3g against SRC, over %g", family.KeyLabel(lc.Layer), lc.Replica, lc.RelL2, lc.Tolerance)
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
	for _, lc := range r.Recomposed {
		v := "PASS"
		if !lc.Pass {
			v = "FAIL"
		}
		fmt.Fprintf(&b, "  layer %s routed experts from the ranks (replica %d of each, parts summed) vs SRC: relative L2 %.3g <= %g %s\n", family.KeyLabel(lc.Layer), lc.Replica, lc.RelL2, lc.Tolerance, v)
	}
	if len(r.Recomposed) == 0 {
		b.WriteString("  layers not recomposed (one rank alone, or --bytes): the byte proof alone\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
