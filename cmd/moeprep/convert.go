package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/progress"
	"github.com/moeprep/moeprep/layout"
)

func init() { extraCommands = append(extraCommands, newConvertCmd, newFuseSharedCmd) }

// convertFlags are the flags convert and fuse-shared share.
type convertFlags struct {
	layout, maxShard string
	digest           string
	jobs             int
	force, resume    bool
	bufferedIO       bool
	noProgress, json bool
}

func (f *convertFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.layout, "layout", "stacked", "expert layout: stacked (all_gate/all_up [E,I,H], all_down [E,H,I]), gate-up (gate_up_proj [E,2I,H], gate rows first) or up-gate (up rows first)")
	fl.StringVar(&f.maxShard, "max-shard-size", "5GB", "largest output shard, e.g. 5GB, 500MB, 2GiB")
	fl.IntVar(&f.jobs, "jobs", convert.DefaultJobs, "shards written at once; each holds up to 36 MiB of buffers (8 staged 4 MiB blocks and a 4 MiB read buffer)")
	fl.StringVar(&f.digest, "digest", layout.ShardBlockAlgo.String(), "how the manifest hashes each shard's 4 MiB blocks: xxh3 (XXH3-128, fast; catches corruption and torn writes), blake3 or sha256 (cryptographic, for a digest to pin; slower on few cores)")
	fl.BoolVar(&f.force, "force", false, "replace DST if it exists")
	fl.BoolVar(&f.resume, "resume", false, "continue an interrupted run from DST.partial, reusing finished shards whose checksum matches")
	fl.BoolVar(&f.bufferedIO, "buffered-io", false, "write shards through the page cache instead of with O_DIRECT (used anyway where the file system refuses O_DIRECT)")
	fl.BoolVar(&f.noProgress, "no-progress", false, "no progress reporting on stderr")
	fl.BoolVar(&f.json, "json", false, "print a JSON summary (files, bytes, seconds, GB/s) at the end")
}

func (f *convertFlags) options(src, dst string) (convert.Options, error) {
	l, err := layout.Parse(f.layout)
	if err != nil {
		return convert.Options{}, fmt.Errorf("--layout: %w", err)
	}
	size, err := convert.ParseSize(f.maxShard)
	if err != nil {
		return convert.Options{}, fmt.Errorf("--max-shard-size: %w", err)
	}
	if f.jobs < 1 {
		return convert.Options{}, fmt.Errorf("--jobs %d: must be at least 1", f.jobs)
	}
	digest, err := layout.ParseBlockAlgo(f.digest)
	if err != nil {
		return convert.Options{}, fmt.Errorf("--digest: %w", err)
	}
	return convert.Options{Src: src, Dst: dst, Layout: l, MaxShardSize: size, Jobs: f.jobs, Digest: digest,
		Force: f.force, Resume: f.resume, BufferedIO: f.bufferedIO, Tool: "moeprep " + versionString()}, nil
}

func runConvert(cmd *cobra.Command, f *convertFlags, o convert.Options) error {
	label := "convert"
	if o.FuseShared {
		label = "fuse-shared"
	}
	rep := progress.New(os.Stderr, label, f.noProgress)
	o.Progress = rep
	s, err := convert.Convert(cmd.Context(), o)
	rep.Done()
	if err != nil {
		return err
	}
	if f.json {
		return writeJSON(cmd.OutOrStdout(), s)
	}
	msg := fmt.Sprintf("wrote %s: layout %s, %d shards (%d reused), %d files, %.2f GB in %.1f s (%.2f GB/s)",
		s.Dst, s.Layout, s.Shards, s.ReusedShards, s.Files, float64(s.Bytes)/1e9, s.Seconds, s.GBPerSec)
	if o.FuseShared {
		msg += fmt.Sprintf("; %d fused shared experts", s.FusedShared)
		if s.Folded {
			msg += fmt.Sprintf(", routed_scaling_factor folded (max relative change %.3g)", s.FoldMaxRelChange)
		} else {
			msg += ", routed_scaling_factor not folded (slot weight 1/rsf, runtime multiply)"
		}
	}
	_, err = fmt.Fprintln(cmd.OutOrStdout(), msg)
	return err
}

func newConvertCmd() *cobra.Command {
	var f convertFlags
	cmd := &cobra.Command{
		Use:   "convert SRC DST",
		Short: "Stack each MoE layer's experts into contiguous tensors",
		Long: `convert re-lays every MoE layer's experts into contiguous stacked tensors and
copies everything else byte for byte. Slice e of a stack is source expert e:
bytes are copied, never converted (FP8 weight_scale_inv are stacked alongside).

The output is a hub-layout directory: sharded safetensors with
model.safetensors.index.json, config.json with a "moeprep" contract section
(see layout/CONTRACT.md), and every other file of SRC copied. A PyTorch .bin
source gives safetensors output. Work happens in DST.partial, renamed to DST
only when complete; --resume continues an interrupted run.`,
		Example: `  moeprep convert ./DeepSeek-V3 ./DeepSeek-V3-stacked
  moeprep convert --layout gate-up --max-shard-size 10GB ./Qwen3-30B-A3B ./qwen3-gate-up
  moeprep convert --resume ./DeepSeek-V3 ./DeepSeek-V3-stacked   # after an interruption`,
		Args: exactArgs(2, "SRC and DST directories"),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := f.options(args[0], args[1])
			if err != nil {
				return err
			}
			return runConvert(cmd, &f, o)
		},
	}
	f.register(cmd)
	return cmd
}

func newFuseSharedCmd() *cobra.Command {
	var (
		f            convertFlags
		tp, replicas int
		foldScaling  string
	)
	cmd := &cobra.Command{
		Use:   "fuse-shared SRC DST",
		Short: "Convert, appending the shared expert as extra experts and folding routed_scaling_factor",
		Long: `fuse-shared does what convert does and also appends the shared expert to each
MoE layer's expert bank as R replicas (default R = --tp) at ids E..E+R*S-1
(S = n_shared_experts: an S*I shared MLP is split exactly into S experts), so
a serving engine's top-k gains shared slots and never clones weights at load.

--fold-scaling decides where routed_scaling_factor (rsf) lives:
  auto  fold only where exact: FP8 block-scaled routed down scales times rsf
        (fp8 bytes untouched); other dtypes keep a runtime multiply (default)
  down  always fold; bf16/f16/f32 routed down weights times rsf, rounded to
        nearest even (reports the largest relative change); refuses UE8M0 scales
  none  never fold: the shared slot weight is 1/rsf and rsf stays a multiply
The contract in DST/config.json says which (see layout/CONTRACT.md).

DeepSeek-V2/V3/R1 and Kimi-K2 can be fused. Mixtral and Qwen3-MoE have no shared
expert, and Qwen2-MoE's is gated per token: fuse-shared refuses them.`,
		Example: `  moeprep fuse-shared --tp 8 ./DeepSeek-V3 ./DeepSeek-V3-fused
  moeprep fuse-shared --tp 8 --replicas 1 --fold-scaling none ./Kimi-K2 ./kimi-fused
  moeprep fuse-shared --tp 4 --layout gate-up --json ./DeepSeek-R1 ./r1-fused`,
		Args: exactArgs(2, "SRC and DST directories"),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := f.options(args[0], args[1])
			if err != nil {
				return err
			}
			if tp < 1 {
				return fmt.Errorf("--tp %d: must be at least 1", tp)
			}
			if cmd.Flags().Changed("replicas") && replicas < 1 {
				return fmt.Errorf("--replicas %d: must be at least 1", replicas)
			}
			o.FuseShared, o.TP, o.Replicas, o.FoldScaling = true, tp, replicas, foldScaling
			return runConvert(cmd, &f, o)
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&tp, "tp", 1, "tensor-parallel size the output is prepared for")
	cmd.Flags().IntVar(&replicas, "replicas", 0, "shared-expert replicas R (default: --tp)")
	cmd.Flags().StringVar(&foldScaling, "fold-scaling", "auto", "where routed_scaling_factor goes: auto, down or none")
	return cmd
}
