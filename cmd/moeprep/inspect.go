package main

import (
	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/inspect"
)

func newInspectCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect DIR",
		Short: "Read a checkpoint, detect its model family and print its MoE plan",
		Long: `inspect reads a hub-layout checkpoint directory (config.json plus safetensors,
sharded or not, or PyTorch .bin zip files), detects the model family from
config.json, checks every MoE layer (all experts present, three projections,
identical shapes and dtypes, FP8 scales where quantised) and prints the plan.`,
		Example: `  moeprep inspect ./DeepSeek-V3
  moeprep inspect --json ./Qwen3-30B-A3B | jq .moe_layers`,
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
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), s)
			}
			return inspect.WriteText(cmd.OutOrStdout(), s)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object instead of the table")
	return cmd
}
