package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/bench"
	"github.com/moeprep/moeprep/kernels"
)

// schemaBench is bench kernels' JSON document (SCHEMAS.md).
const schemaBench = schemaPrefix + "bench-kernels/v1"

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Time moeprep's GPU kernels against the HBM floor",
		Args:  exactArgs(0, "a subcommand (kernels)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	cmd.AddCommand(newBenchKernelsCmd())
	return cmd
}

// benchFlags are the flags of bench kernels.
type benchFlags struct {
	tokens, dtype, path string
	precision           string
	dtypeSet            bool // --dtype was given
	iters, blockSize    int
	bankCopies          int
	budget              time.Duration
	noGraph, quiet      bool
	report              reportFlags
}

func (f *benchFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.tokens, "tokens", "1,16,128,1024,4096", "comma-separated token counts")
	fl.StringVar(&f.dtype, "dtype", "bf16", "expert weight type: bf16 (rsf unfolded) or fp8 (e4m3 with 128x128 scales, rsf folded)")
	fl.IntVar(&f.iters, "iters", bench.DefaultIters, "most timed runs per measurement (the median is reported)")
	fl.DurationVar(&f.budget, "budget", bench.DefaultBudget, "device time per measurement; fewer runs (at least 5) when iters would exceed it")
	fl.StringVar(&f.precision, "precision", "default", "activation numerics of the grouped GEMM: default (bf16 activations) or fp8 (w8a8: "+
		"activations quantised to e4m3 per token per 128 channels, e4m3 x e4m3 wgmma; fp8 weights, compute capability 9.0; implies --dtype fp8)")
	fl.StringVar(&f.path, "gemm-path", "auto", "grouped GEMM kernels: auto (what validate uses), simt, mma, mma2, tall, wgmma (compute capability 9.0, bf16 weights) or mma3 (bf16 weights)")
	fl.IntVar(&f.blockSize, "block-size", bench.DefaultBlockSize, "moe_align_block_size block size (a multiple of 16)")
	fl.IntVar(&f.bankCopies, "bank-copies", 0, "expert-bank copies to rotate (0: as many as fit, at most 2)")
	fl.BoolVar(&f.noGraph, "no-graph", false, "do not capture the layer as a CUDA graph")
}

// config turns the flags into a bench.Config.
func (f *benchFlags) config() (bench.Config, error) {
	cfg := bench.DefaultConfig()
	var err error
	if cfg.Tokens, err = bench.ParseTokens(f.tokens); err != nil {
		return cfg, err
	}
	if cfg.DType, err = bench.ParseDType(f.dtype); err != nil {
		return cfg, err
	}
	switch f.precision {
	case "", "default":
	case "fp8":
		cfg.W8A8 = true
		if !f.dtypeSet {
			cfg.DType = bench.FP8
		}
	default:
		return cfg, fmt.Errorf("--precision %q: want default or fp8", f.precision)
	}
	if cfg.Path, err = kernels.ParseGEMMPath(f.path); err != nil {
		return cfg, fmt.Errorf("--gemm-path: %w", err)
	}
	if f.budget <= 0 {
		return cfg, fmt.Errorf("--budget %v: want a positive duration", f.budget)
	}
	cfg.Iters, cfg.Budget, cfg.BlockSize, cfg.BankCopies = f.iters, f.budget, f.blockSize, f.bankCopies
	cfg.Graph = !f.noGraph
	return cfg, cfg.Check()
}

func newBenchKernelsCmd() *cobra.Command {
	f := &benchFlags{}
	cmd := &cobra.Command{
		Use:   "kernels",
		Short: "Time each kernel and the whole fused layer at DeepSeek-V3 shapes",
		Long: `Times, on CUDA device 0, each of moeprep's kernels (router GEMM, gate, align,
grouped GEMM gate-up and down, finalize) and the whole fused MoE layer (router
GEMM to finalize, on a stream and replayed as one CUDA graph) at DeepSeek-V3
shapes: H 7168, I 2048, 256 routed + 8 fused shared experts, top-8 plus the
shared slot, 8 groups keep 4, sigmoid + correction bias.

` + wrapWidth(bench.Method, 80, "") + `

Needs an NVIDIA GPU with enough memory for the expert bank (23 GB bf16,
11.6 GB fp8); exits 2 without a CUDA driver.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.dtypeSet = cmd.Flags().Changed("dtype")
			cfg, err := f.config()
			if err != nil {
				return err
			}
			if !f.quiet {
				cfg.Log = os.Stderr
			}
			res, err := bench.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			doc := struct {
				Schema string `json:"schema"`
				*bench.Result
			}{schemaBench, res}
			return f.report.emit(cmd, doc, func(w io.Writer) error { return bench.WriteTable(w, res) })
		},
	}
	f.register(cmd)
	quietFlag(cmd, &f.quiet)
	f.report.register(cmd, "the timings")
	return cmd
}
