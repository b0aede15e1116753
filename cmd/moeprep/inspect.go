package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/inspect"
	"github.com/moeprep/moeprep/internal/human"
	"github.com/moeprep/moeprep/internal/progress"
)

// schemaInspect is inspect's JSON document (SCHEMAS.md).
const schemaInspect = schemaPrefix + "inspect/v1"

func newInspectCmd() *cobra.Command {
	var (
		readAll, quiet bool
		revision       string
		report         reportFlags
	)
	cmd := &cobra.Command{
		Use:   "inspect DIR",
		Short: "Read a checkpoint, detect its model family and print its MoE plan",
		Long: `inspect reads a hub-layout checkpoint directory (config.json plus safetensors,
sharded or not, or PyTorch .bin zip files), detects the model family from
config.json, checks every MoE layer (all experts present, three projections,
identical shapes and dtypes, FP8 scales where quantised) and prints the plan.`,
		Example: `  moeprep inspect ./DeepSeek-V3
  moeprep inspect deepseek-ai/DeepSeek-V3   # the Hugging Face cache's snapshot (never downloads)
  moeprep inspect --json ./Qwen3-30B-A3B | jq .moe_layers
  moeprep inspect --read ./Kimi-K2   # also read every tensor byte once`,
		Args: exactArgs(1, "one checkpoint directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, shown, err := sourceArg(cmd, "inspect", args[0], revision)
			if err != nil {
				return err
			}
			if err := checkOutputPath(report.output, dir); err != nil {
				return err
			}
			c, err := checkpoint.Open(dir)
			if err != nil {
				return err
			}
			defer c.Close()
			s, err := inspect.Summarize(c)
			if err != nil {
				return err
			}
			s.Shown = shown
			for _, n := range s.Notices {
				noticer(cmd, "inspect")(n)
			}
			var stats *inspect.ReadStats
			if readAll {
				rep := progress.New(os.Stderr, "reading", quiet)
				stats, err = inspect.ReadEveryTensor(cmd.Context(), c, rep)
				rep.Done()
				if err != nil {
					return err
				}
			}
			doc := struct {
				Schema string `json:"schema"`
				*inspect.Summary
				*inspect.ReadStats
			}{schemaInspect, s, stats}
			return report.emit(cmd, doc, func(w io.Writer) error {
				if err := inspect.WriteText(w, s); err != nil {
					return err
				}
				if stats != nil {
					_, err = fmt.Fprintf(w, "%-16s %s, %s in %s (%s)\n", "read:", human.Count(stats.Tensors, "tensor"), human.Bytes(stats.Bytes),
						human.Duration(time.Duration(stats.Seconds*float64(time.Second))), human.Rate(stats.Bytes, time.Duration(stats.Seconds*float64(time.Second))))
				}
				return err
			})
		},
	}
	revisionFlag(cmd, &revision)
	cmd.Flags().BoolVar(&readAll, "read", false, "also read every tensor's bytes once (bounded memory), reporting throughput")
	quietFlag(cmd, &quiet)
	report.register(cmd, "the plan")
	return cmd
}
