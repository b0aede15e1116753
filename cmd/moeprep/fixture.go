package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/progress"
)

func init() { extraCommands = append(extraCommands, newFixtureCmd) }

func newFixtureCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fixture",
		Short: "Write test checkpoints",
	}
	cmd.AddCommand(newFixtureSynthCmd())
	return cmd
}

func newFixtureSynthCmd() *cobra.Command {
	var (
		preset, shardSize string
		noProgress        bool
		s                 fixtures.SynthSpec
	)
	cmd := &cobra.Command{
		Use:   "synth DIR",
		Short: "Write a deterministic synthetic hub-layout MoE checkpoint",
		Long: `synth writes a synthetic checkpoint of any supported family and size: config.json,
safetensors shards with index, random non-zero weights drawn deterministically
from --seed (the same flags always give byte-identical files), bf16, f16, f32 or
FP8 E4M3 with 128x128 block scales. Memory stays constant whatever the size.

Start from a --preset and override any field with its flag. Presets: ` + strings.Join(fixtures.PresetNames(), ", ") + `.`,
		Example: `  moeprep fixture synth --preset tiny-deepseek-v3 /tmp/ds
  moeprep fixture synth --preset deepseek-v3-shaped --dtype bf16 --layers 3 /data/ds-synth
  moeprep fixture synth --family mixtral --experts 8 --hidden 256 --intermediate 512 /tmp/mx`,
		Args: exactArgs(1, "one output directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec := fixtures.SynthSpec{}
			if preset != "" {
				p, err := fixtures.Preset(preset)
				if err != nil {
					return err
				}
				spec = p
			}
			f := cmd.Flags()
			setInt := func(name string, dst *int, v int) {
				if f.Changed(name) {
					*dst = v
				}
			}
			setStr := func(name string, dst *string, v string) {
				if f.Changed(name) {
					*dst = v
				}
			}
			setStr("family", &spec.Family, s.Family)
			setInt("layers", &spec.Layers, s.Layers)
			setInt("dense-layers", &spec.DenseLayers, s.DenseLayers)
			setInt("mtp-layers", &spec.MTPLayers, s.MTPLayers)
			setInt("hidden", &spec.Hidden, s.Hidden)
			setInt("intermediate", &spec.Intermediate, s.Intermediate)
			setInt("experts", &spec.Experts, s.Experts)
			setInt("shared-experts", &spec.SharedExperts, s.SharedExperts)
			setInt("top-k", &spec.TopK, s.TopK)
			setInt("n-group", &spec.NGroup, s.NGroup)
			setInt("topk-group", &spec.TopKGroup, s.TopKGroup)
			setInt("vocab", &spec.Vocab, s.Vocab)
			setStr("dtype", &spec.DType, s.DType)
			setStr("scale-fmt", &spec.ScaleFmt, s.ScaleFmt)
			setStr("bias-like", &spec.BiasLike, s.BiasLike)
			if f.Changed("rsf") {
				spec.RoutedScalingFactor = s.RoutedScalingFactor
			}
			if f.Changed("seed") {
				spec.Seed = s.Seed
			}
			if f.Changed("shard-size") {
				n, err := convert.ParseSize(shardSize)
				if err != nil {
					return fmt.Errorf("--shard-size: %w", err)
				}
				spec.ShardSize = n
			}
			if spec.Family == "" {
				return fmt.Errorf("give --preset or --family (one of %s)", strings.Join(fixtures.Families, ", "))
			}
			spec, err := spec.Normalize()
			if err != nil {
				return err
			}
			total, err := spec.TotalBytes()
			if err != nil {
				return err
			}
			rep := progress.New(os.Stderr, "synth", noProgress)
			rep.Total(total)
			err = fixtures.Synth(cmd.Context(), args[0], spec, rep.Add)
			rep.Done()
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s %s, %d layers, %d experts, %.2f GB\n", args[0], spec.Family, spec.DType, spec.Layers, spec.Experts, float64(total)/1e9)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&preset, "preset", "", "start from a preset ("+strings.Join(fixtures.PresetNames(), ", ")+")")
	fl.StringVar(&s.Family, "family", "", "model_type to write ("+strings.Join(fixtures.Families, ", ")+")")
	fl.IntVar(&s.Layers, "layers", 0, "num_hidden_layers")
	fl.IntVar(&s.DenseLayers, "dense-layers", 0, "leading dense layers (first_k_dense_replace / mlp_only_layers)")
	fl.IntVar(&s.MTPLayers, "mtp-layers", 0, "DeepSeek MTP layers after the last decoder layer, with experts")
	fl.IntVar(&s.Hidden, "hidden", 0, "hidden_size")
	fl.IntVar(&s.Intermediate, "intermediate", 0, "moe_intermediate_size of one routed expert")
	fl.IntVar(&s.Experts, "experts", 0, "routed experts")
	fl.IntVar(&s.SharedExperts, "shared-experts", 0, "DeepSeek n_shared_experts")
	fl.IntVar(&s.TopK, "top-k", 0, "num_experts_per_tok")
	fl.IntVar(&s.NGroup, "n-group", 0, "DeepSeek n_group")
	fl.IntVar(&s.TopKGroup, "topk-group", 0, "DeepSeek topk_group")
	fl.IntVar(&s.Vocab, "vocab", 0, "vocab_size")
	fl.Float64Var(&s.RoutedScalingFactor, "rsf", 0, "routed_scaling_factor")
	fl.StringVar(&s.DType, "dtype", "", "bf16, f16, f32 or fp8")
	fl.StringVar(&s.ScaleFmt, "scale-fmt", "", `FP8 scale format: "" or ue8m0 (power-of-two scales)`)
	fl.StringVar(&s.BiasLike, "bias-like", "", "e_score_correction_bias values: deepseek (offset + small spread) or random")
	fl.Uint64Var(&s.Seed, "seed", 0, "random seed")
	fl.StringVar(&shardSize, "shard-size", "", "maximum shard size, e.g. 5GB (default: one file)")
	fl.BoolVar(&noProgress, "no-progress", false, "no progress reporting on stderr")
	return cmd
}
