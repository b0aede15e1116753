package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/inspect"
	"github.com/moeprep/moeprep/internal/progress"
)

func newInspectCmd() *cobra.Command {
	var asJSON, readAll, noProgress bool
	cmd := &cobra.Command{
		Use:   "inspect DIR",
		Short: "Read a checkpoint, detect its model family and print its MoE plan",
		Long: `inspect reads a hub-layout checkpoint directory (config.json plus safetensors,
sharded or not, or PyTorch .bin zip files), detects the model family from
config.json, checks every MoE layer (all experts present, three projections,
identical shapes and dtypes, FP8 scales where quantised) and prints the plan.`,
		Example: `  moeprep inspect ./DeepSeek-V3
  moeprep inspect --json ./Qwen3-30B-A3B | jq .moe_layers
  moeprep inspect --read ./Kimi-K2   # also read every tensor byte once`,
		Args: exactArgs(1, "one checkpoint directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := checkpoint.Open(args[0])
			if err != nil {
				return err
			}
			defer c.Close()
			s, err := inspect.Summarize(c)
			if err != nil {
				return err
			}
			var stats *inspect.ReadStats
			if readAll {
				rep := progress.New(os.Stderr, "reading", noProgress)
				stats, err = inspect.ReadEveryTensor(cmd.Context(), c, rep)
				rep.Done()
				if err != nil {
					return err
				}
			}
			if asJSON {
				if stats != nil {
					return writeJSON(cmd.OutOrStdout(), struct {
						*inspect.Summary
						*inspect.ReadStats
					}{s, stats})
				}
				return writeJSON(cmd.OutOrStdout(), s)
			}
			if err := inspect.WriteText(cmd.OutOrStdout(), s); err != nil {
				return err
			}
			if stats != nil {
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%-16s %d tensors, %s in %.1f s (%.2f GB/s)\n", "read:", stats.Tensors, inspect.HumanBytes(stats.Bytes), stats.Seconds, stats.GBps)
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object instead of the table")
	cmd.Flags().BoolVar(&readAll, "read", false, "also read every tensor's bytes once (bounded memory), reporting throughput")
	cmd.Flags().BoolVar(&noProgress, "no-progress", false, "no progress reporting on stderr")
	return cmd
}
