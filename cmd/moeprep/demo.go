package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/human"
	"github.com/moeprep/moeprep/layout"
)

func newDemoCmd() *cobra.Command {
	var (
		tp     int
		keep   bool
		models []string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Fuse and validate the bundled HF DeepSeek-V3 checkpoints end to end",
		Long: `demo shows the main job on tiny DeepSeek-V3 checkpoints that HF transformers
wrote (bundled in the binary, bf16 and FP8): fuse-shared --tp 8 into a
temporary directory, then validate the result against the unfused source and
against the golden MoE-layer outputs HF exported. Needs nothing but moeprep.`,
		Example: `  go run ./cmd/moeprep demo
  moeprep demo --tp 4 --keep`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			work, err := os.MkdirTemp("", "moeprep-demo-")
			if err != nil {
				return err
			}
			if !keep {
				defer os.RemoveAll(work)
			}
			out := cmd.OutOrStdout()
			// The commands name the checkpoints relative to the work
			// directory, so that each fits a line (issue 46).
			fmt.Fprintf(out, "demo: working in %s\n\n", work)
			var failed error
			for _, name := range models {
				src := filepath.Join(work, name)
				dst := src + "-fused"
				if err := fixtures.ExtractBundled(name, src); err != nil {
					return err
				}
				fmt.Fprintf(out, "== moeprep fuse-shared --tp %d %s %s-fused\n", tp, name, name)
				s, err := convert.Convert(cmd.Context(), convert.Options{Src: src, Dst: dst, Layout: layout.Stacked,
					FuseShared: true, TP: tp, FoldScaling: layout.FoldAuto, Tool: "moeprep " + versionString()})
				if err != nil {
					return err
				}
				fold := "rsf kept as a runtime multiply (bf16 cannot hold it exactly)"
				if s.Folded {
					fold = fmt.Sprintf("rsf folded into FP8 down scales (max change %.2g)", s.FoldMaxRelChange)
				}
				fmt.Fprintf(out, "   %s; %d shared replicas a layer; %s\n", human.Count(s.Shards, "shard"), s.FusedShared, fold)
				fmt.Fprintf(out, "== moeprep validate %s %s-fused --golden %s\n", name, name, filepath.Join(name, "reference"))
				f := validateFlags{layers: "all", golden: filepath.Join(src, "reference"), device: "cpu", quiet: true}
				if err := runValidate(cmd, &f, src, dst, io.Discard); err != nil {
					failed = err
				}
				fmt.Fprintln(out)
			}
			if keep {
				fmt.Fprintln(out, "kept", work)
			}
			return failed
		},
	}
	cmd.Flags().IntVar(&tp, "tp", 8, "tensor-parallel size (shared replicas) for fuse-shared")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the temporary checkpoints and print where")
	cmd.Flags().StringSliceVar(&models, "models", fixtures.BundledNames(), "bundled checkpoints to run")
	return cmd
}
