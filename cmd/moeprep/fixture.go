package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/human"
	"github.com/moeprep/moeprep/internal/progress"
)

func newFixtureCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fixture",
		Short: "Write test checkpoints",
	}
	cmd.AddCommand(newFixtureSynthCmd())
	return cmd
}

// synthDTypes are --dtype's values.
var synthDTypes = []string{"bf16", "f16", "f32", "fp8", fixtures.DTypeFP8Channel, fixtures.DTypeFP8Tensor, fixtures.DTypeInt4Pack, fixtures.DTypeNVFP4, fixtures.DTypeNVFP4CT, fixtures.DTypeNVFP4Mixed, fixtures.DTypeMXFP4, fixtures.DTypeMXFP4CT, fixtures.DTypeFP4Experts}

func newFixtureSynthCmd() *cobra.Command {
	var (
		preset, maxShard     string
		quiet, force, asJSON bool
		s                    fixtures.SynthSpec
	)
	cmd := &cobra.Command{
		Use:   "synth DIR (--preset NAME | --family MODEL_TYPE)",
		Short: "Write a deterministic synthetic hub-layout MoE checkpoint of any supported family",
		Long: `synth writes a synthetic checkpoint of any model type moeprep supports, at any
size: config.json, safetensors shards with their index, and random non-zero
weights drawn deterministically from --seed (the same flags always give
byte-identical files) in bf16, f16, f32 or FP8 E4M3 with 128x128 block scales,
with each family's own tensor names, stacked layouts, biases, shared experts and
hash-routing tables. Memory stays constant whatever the size.

Model types (--family):
  ` + wrapList(fixtures.Families(), 78, "  ") + `

Experts stacked on disk (bf16, f16 or f32 only, as moeprep reads them):
  ` + wrapList(fixtures.StackedFamilies(), 78, "  ") + `

Start from a --preset and override any field with its flag. Presets:
  ` + wrapList(fixtures.PresetNames(), 78, "  ") + `

--dense-layers N makes the first N layers dense; for Jamba and Llama 4 every
(N+1)-th layer from layer N is MoE instead (N = 1: every other layer).

The checkpoint is written in DIR.partial and renamed to DIR when complete: an
interrupted run leaves nothing at DIR, and a rerun replaces a DIR.partial that
synth left. DIR may be new or empty; --force replaces a DIR that synth wrote
(its ` + fixtures.SummaryFile + ` lists every file, and records the spec). A DIR
holding anything else is refused and never deleted.`,
		Example: `  moeprep fixture synth --preset tiny-deepseek-v3 /tmp/ds
  moeprep fixture synth --preset glm4-moe-shaped --num-layers 4 /data/glm-synth
  moeprep fixture synth --preset gpt-oss-shaped --max-shard-size 2GB /data/gpt-oss-synth
  moeprep fixture synth --family deepseek_v4 --hash-layers 1 --experts 32 --top-k 4 /tmp/v4
  moeprep fixture synth --family mixtral --experts 8 --hidden 256 --intermediate 512 --json /tmp/mx`,
		Args: exactArgs(1, "one output directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec := fixtures.SynthSpec{}
			if preset != "" {
				p, err := fixtures.PresetSpec(preset)
				if err != nil {
					return fmt.Errorf("--preset: %w", err)
				}
				spec = p
			}
			f := cmd.Flags()
			changed := func(names ...string) bool {
				for _, n := range names {
					if f.Changed(n) {
						return true
					}
				}
				return false
			}
			// The flags bound to s override the preset only where given.
			set := func(dst, src any, names ...string) {
				if !changed(names...) {
					return
				}
				switch d := dst.(type) {
				case *int:
					*d = *src.(*int)
				case *string:
					*d = *src.(*string)
				case *float64:
					*d = *src.(*float64)
				case *uint64:
					*d = *src.(*uint64)
				}
			}
			set(&spec.Family, &s.Family, "family")
			set(&spec.Layers, &s.Layers, "num-layers", "layers")
			set(&spec.DenseLayers, &s.DenseLayers, "dense-layers")
			set(&spec.MTPLayers, &s.MTPLayers, "mtp-layers")
			set(&spec.HashLayers, &s.HashLayers, "hash-layers")
			set(&spec.Hidden, &s.Hidden, "hidden")
			set(&spec.Intermediate, &s.Intermediate, "intermediate")
			set(&spec.DenseIntermediate, &s.DenseIntermediate, "dense-intermediate")
			set(&spec.SharedIntermediate, &s.SharedIntermediate, "shared-intermediate")
			set(&spec.Experts, &s.Experts, "experts")
			set(&spec.SharedExperts, &s.SharedExperts, "shared-experts")
			set(&spec.TopK, &s.TopK, "top-k")
			set(&spec.NGroup, &s.NGroup, "n-group")
			set(&spec.TopKGroup, &s.TopKGroup, "topk-group")
			set(&spec.Vocab, &s.Vocab, "vocab")
			set(&spec.DType, &s.DType, "dtype")
			set(&spec.ScaleFmt, &s.ScaleFmt, "scale-fmt")
			set(&spec.SharedDType, &s.SharedDType, "shared-dtype")
			set(&spec.Layout, &s.Layout, "layout")
			set(&spec.BiasLike, &s.BiasLike, "bias-like")
			set(&spec.RoutedScalingFactor, &s.RoutedScalingFactor, "rsf")
			set(&spec.Seed, &s.Seed, "seed")
			if changed("max-shard-size", "shard-size") {
				n, err := convert.ParseSize(maxShard)
				if err != nil {
					return fmt.Errorf("--max-shard-size: %w", err)
				}
				spec.ShardSize = n
			}
			if spec.Family == "" {
				return fmt.Errorf("give --preset or --family (one of %s)", strings.Join(fixtures.Families(), ", "))
			}
			spec, err := spec.Normalize()
			if err != nil {
				return err
			}
			total, err := spec.TotalBytes()
			if err != nil {
				return err
			}
			rep := progress.New(os.Stderr, "synth", quiet)
			rep.Total(total)
			sum, err := fixtures.Write(cmd.Context(), args[0], spec, fixtures.Options{Force: force, Progress: rep.Add})
			rep.Done()
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), sum)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), synthLine(sum))
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&preset, "preset", "", "start from a preset (see above)")
	fl.StringVar(&s.Family, "family", "", "config.json model_type to write (see above)")
	fl.IntVar(&s.Layers, "num-layers", 0, "how many decoder layers: num_hidden_layers (default 2; MTP layers come on top)")
	fl.IntVar(&s.Layers, "layers", 0, "")
	fl.IntVar(&s.DenseLayers, "dense-layers", 0, "leading dense layers (Jamba, Llama 4: MoE every N+1 layers from N)")
	fl.IntVar(&s.MTPLayers, "mtp-layers", 0, "multi-token-prediction layers with experts after the last layer (DeepSeek-style families and GLM)")
	fl.IntVar(&s.HashLayers, "hash-layers", 0, "DeepSeek-V4: leading layers routed by a token-id table (hash_moe)")
	fl.IntVar(&s.Hidden, "hidden", 0, "hidden_size (default 64)")
	fl.IntVar(&s.Intermediate, "intermediate", 0, "width of one routed expert (default 32)")
	fl.IntVar(&s.DenseIntermediate, "dense-intermediate", 0, "MLP width of dense layers (default 3x --intermediate, or the expert width where config.json has one key for both)")
	fl.IntVar(&s.SharedIntermediate, "shared-intermediate", 0, "shared MLP width where the family has its own key (Qwen2-MoE, Qwen3-Next, Granite)")
	fl.IntVar(&s.Experts, "experts", 0, "routed experts (default 8)")
	fl.IntVar(&s.SharedExperts, "shared-experts", 0, "shared experts, each --intermediate wide (default: the family's)")
	fl.IntVar(&s.TopK, "top-k", 0, "experts per token: num_experts_per_tok (default: the family's, else 2)")
	fl.IntVar(&s.NGroup, "n-group", 0, "expert groups of group-limited routing (DeepSeek, GLM, EXAONE)")
	fl.IntVar(&s.TopKGroup, "topk-group", 0, "groups kept by group-limited routing")
	fl.IntVar(&s.Vocab, "vocab", 0, "vocab_size (default 128)")
	fl.Float64Var(&s.RoutedScalingFactor, "rsf", 0, "the routed scaling factor, where the family has one (default: the family's)")
	fl.StringVar(&s.DType, "dtype", "", "weights: "+strings.Join(synthDTypes, ", ")+" (default bf16)")
	fl.StringVar(&s.ScaleFmt, "scale-fmt", "", "FP8 scale format: ue8m0 for power-of-two scales (default: any F32)")
	fl.StringVar(&s.Layout, "layout", "", "deepseek_v4: deepseek-official writes DeepSeek-V4's official repo layout (layers.L.ffn..., embed.weight, head.weight, hc_*, x.scale E8M0) instead of transformers' save")
	fl.StringVar(&s.SharedDType, "shared-dtype", "", "fp8-channel, fp8-tensor: bf16 leaves the shared expert unquantised, named in the ignore list (as int4-pack always does)")
	fl.StringVar(&s.BiasLike, "bias-like", "", "correction bias values: deepseek (offset + tiny spread, the default) or random")
	fl.Uint64Var(&s.Seed, "seed", 0, "random seed")
	fl.StringVar(&maxShard, "max-shard-size", "", "largest shard, e.g. 5GB, 500MB, 2GiB (default: one file)")
	fl.StringVar(&maxShard, "shard-size", "", "")
	quietFlag(cmd, &quiet)
	fl.BoolVarP(&force, "force", "f", false, "replace DIR if synth wrote it; anything else is refused")
	fl.BoolVar(&asJSON, "json", false, "print the summary as JSON on stdout (schema "+fixtures.SummarySchema+", as DIR/"+fixtures.SummaryFile+")")
	// The old names keep working, and say so.
	_ = fl.MarkDeprecated("layers", "use --num-layers (--layers picks which layers elsewhere, as in validate)")
	_ = fl.MarkDeprecated("shard-size", "use --max-shard-size")
	// pflag writes that notice to the flag set's output, which cobra sends
	// to stdout; stdout carries the summary (--json), so it goes to stderr.
	fl.SetOutput(writerFunc(func(p []byte) (int, error) { return cmd.ErrOrStderr().Write(p) }))

	complete := func(values func() []string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return func(_ *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
			var out []string
			for _, v := range values() {
				if strings.HasPrefix(v, prefix) {
					out = append(out, v)
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		}
	}
	_ = cmd.RegisterFlagCompletionFunc("family", complete(fixtures.Families))
	_ = cmd.RegisterFlagCompletionFunc("preset", complete(fixtures.PresetNames))
	_ = cmd.RegisterFlagCompletionFunc("dtype", complete(func() []string { return synthDTypes }))
	_ = cmd.RegisterFlagCompletionFunc("scale-fmt", complete(func() []string { return []string{"ue8m0"} }))
	_ = cmd.RegisterFlagCompletionFunc("bias-like", complete(func() []string { return []string{"deepseek", "random"} }))
	return cmd
}

// synthLine is the human summary: "wrote DIR: glm4_moe bf16, 3 layers
// (2 MoE) + 1 MTP layer, 16 experts + 1 shared, top-4, 1.19 MB in 5 files".
func synthLine(s *fixtures.Summary) string {
	moe := fmt.Sprintf("%d MoE", len(s.MoELayers)-s.MTPLayers)
	if len(s.HashLayers) > 0 {
		moe += fmt.Sprintf(", %d hash-routed", len(s.HashLayers))
	}
	layers := fmt.Sprintf("%s (%s)", human.Count(s.Layers, "layer"), moe)
	if s.MTPLayers > 0 {
		layers += " + " + human.Count(s.MTPLayers, "MTP layer")
	}
	experts := human.Count(s.Experts, "expert")
	if s.SharedExperts > 0 {
		experts += fmt.Sprintf(" + %d shared", s.SharedExperts)
	}
	return fmt.Sprintf("wrote %s: %s %s, %s, %s, top-%d, %s in %s", s.Dir, s.ModelType, s.DType,
		layers, experts, s.TopK, human.Bytes(s.Bytes), human.Count(len(s.Files)+1, "file"))
}

// writerFunc is an io.Writer resolved at each write: the command's stderr
// is set by the caller after the flags are made.
type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }
