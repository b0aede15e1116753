package main

import (
	"fmt"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

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

// synthDType is one value --dtype takes and what it writes.
type synthDType struct{ name, what string }

// synthDTypeTable is every value fixtures.SynthSpec.Normalize takes for
// DType, in the order --dtype's help and completion list them: the long
// help's table and the flag's line are both made from it, so neither can
// name fewer dtypes than synth writes.
var synthDTypeTable = []synthDType{
	{"bf16", "plain weights (the default)"},
	{"f16", "plain weights"},
	{"f32", "plain weights"},
	{"fp8", "FP8 E4M3 with 128x128 block scales (see --scale-fmt)"},
	{fixtures.DTypeFP8Channel, "FP8 E4M3, a BF16 scale per output row (compressed-tensors)"},
	{fixtures.DTypeFP8Tensor, "FP8 E4M3, one F32 scale per weight"},
	{fixtures.DTypeInt4Pack, "routed experts INT4, eight to an I32 word (compressed-tensors)"},
	{fixtures.DTypeNVFP4, "routed and shared experts NVFP4 (ModelOpt)"},
	{fixtures.DTypeNVFP4CT, "every Linear but the head and routers NVFP4 (compressed-tensors)"},
	{fixtures.DTypeNVFP4Mixed, "experts NVFP4, attention and dense MLPs FP8 per tensor (ModelOpt)"},
	{fixtures.DTypeMXFP4, "gpt_oss only: experts MXFP4, stacked as gpt-oss ships them"},
	{fixtures.DTypeMXFP4CT, "routed and shared experts MXFP4 (compressed-tensors)"},
	{fixtures.DTypeFP4Experts, "deepseek_v4 only: routed experts MXFP4, the rest FP8, as released"},
	{fixtures.DTypeMXFP8, "every Linear but the head and routers MXFP8 (ModelOpt: weight_scale)"},
	{fixtures.DTypeMXFP8MiniMax, "every Linear but the head and routers MXFP8 (quant_method mxfp8: weight_scale_inv)"},
	{fixtures.DTypeNVFP4MXFP8, "experts NVFP4, attention and dense MLPs MXFP8 (ModelOpt MIXED_PRECISION)"},
}

// synthDTypes are --dtype's values.
var synthDTypes = func() []string {
	out := make([]string, len(synthDTypeTable))
	for i, d := range synthDTypeTable {
		out[i] = d.name
	}
	return out
}()

// synthDTypeHelp is the long help's table of --dtype's values.
func synthDTypeHelp() string {
	var b strings.Builder
	for _, d := range synthDTypeTable {
		fmt.Fprintf(&b, "\n  %-12s %s", d.name, d.what)
	}
	return b.String()
}

// synthFlags are fixture synth's flags. Those bound to spec override the
// preset's fields only where given (options).
type synthFlags struct {
	preset, maxShard     string
	quiet, force, asJSON bool
	dryRun               bool
	spec                 fixtures.SynthSpec
}

func (f *synthFlags) register(cmd *cobra.Command) {
	s := &f.spec
	fl := cmd.Flags()
	fl.StringVar(&f.preset, "preset", "", "start from a preset (see above)")
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
	fl.IntVar(&s.FP8Block, "fp8-block", 0, "fp8: the edge of its square blocks, e.g. 32 for DeepSeek-V4.1's [32, 32] (default 128)")
	fl.StringVar(&s.Layout, "layout", "", "deepseek_v4: deepseek-official writes DeepSeek-V4's official repo layout (layers.L.ffn..., embed.weight, head.weight, hc_*, x.scale E8M0) instead of transformers' save")
	fl.StringVar(&s.SharedDType, "shared-dtype", "", "fp8-channel, fp8-tensor, mxfp8, mxfp8-minimax: bf16 leaves the shared expert unquantised, named in the ignore list (as int4-pack always does)")
	fl.StringVar(&s.BiasLike, "bias-like", "", "correction bias values: deepseek (offset + tiny spread, the default) or random")
	fl.Uint64Var(&s.Seed, "seed", 0, "random seed")
	fl.StringVar(&f.maxShard, "max-shard-size", "", "largest shard, e.g. 5GB, 500MB, 2GiB (default: one file)")
	fl.StringVar(&f.maxShard, "shard-size", "", "")
	quietFlag(cmd, &f.quiet)
	fl.BoolVarP(&f.force, "force", "f", false, "replace DIR if synth wrote it; anything else is refused")
	fl.BoolVar(&f.dryRun, "dry-run", false, "print what would be written (model, layers, experts, size) and write nothing")
	fl.BoolVar(&f.asJSON, "json", false, "print the summary as JSON on stdout (schema "+fixtures.SummarySchema+", as DIR/"+fixtures.SummaryFile+")")
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
}

// options is the spec the flags ask for: the preset's, with each field
// whose flag was given replaced by the flag's value, normalised.
func (f *synthFlags) options(fl *pflag.FlagSet) (fixtures.SynthSpec, error) {
	spec := fixtures.SynthSpec{}
	if f.preset != "" {
		p, err := fixtures.PresetSpec(f.preset)
		if err != nil {
			return spec, fmt.Errorf("--preset: %w", err)
		}
		spec = p
	}
	changed := func(names ...string) bool {
		for _, n := range names {
			if fl.Changed(n) {
				return true
			}
		}
		return false
	}
	s := &f.spec
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
	set(&spec.FP8Block, &s.FP8Block, "fp8-block")
	set(&spec.SharedDType, &s.SharedDType, "shared-dtype")
	set(&spec.Layout, &s.Layout, "layout")
	set(&spec.BiasLike, &s.BiasLike, "bias-like")
	set(&spec.RoutedScalingFactor, &s.RoutedScalingFactor, "rsf")
	set(&spec.Seed, &s.Seed, "seed")
	if changed("max-shard-size", "shard-size") {
		n, err := convert.ParseSize(f.maxShard)
		if err != nil {
			return spec, fmt.Errorf("--max-shard-size: %w", err)
		}
		spec.ShardSize = n
	}
	if spec.Family == "" {
		return spec, fmt.Errorf("give --preset or --family (one of %s)", strings.Join(fixtures.Families(), ", "))
	}
	return spec.Normalize()
}

func newFixtureSynthCmd() *cobra.Command {
	var f synthFlags
	cmd := &cobra.Command{
		Use:   "synth DIR (--preset NAME | --family MODEL_TYPE)",
		Short: "Write a deterministic synthetic hub-layout MoE checkpoint of any supported family",
		Long: `synth writes a synthetic checkpoint of any model type moeprep supports, at any
size: config.json, safetensors shards with their index, and random non-zero
weights drawn deterministically from --seed (the same flags always give
byte-identical files), with each family's own tensor names, stacked layouts,
biases, shared experts and hash-routing tables. Memory stays constant whatever
the size.

Weights (--dtype):` + synthDTypeHelp() + `

Model types (--family):
  ` + wrapList(fixtures.Families(), 78, "  ") + `

Experts stacked on disk (bf16, f16 or f32 only, as moeprep reads them; gpt_oss
also mxfp4):
  ` + wrapList(fixtures.StackedFamilies(), 78, "  ") + `

Start from a --preset and override any field with its flag. Presets, with the
tensor bytes each writes:
` + presetsPlaceholder + `

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
			spec, err := f.options(cmd.Flags())
			if err != nil {
				return err
			}
			total, err := spec.TotalBytes()
			if err != nil {
				return err
			}
			if f.dryRun {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), headLine("would write "+args[0]+":", synthSpecLine(spec, total)+" (dry run: nothing written)"))
				return err
			}
			if !f.quiet {
				// Said before the first byte: a preset's size is easy to
				// underestimate (deepseek-v3-shaped at 4 layers is 34 GB).
				fmt.Fprintf(cmd.ErrOrStderr(), "synth: writing %s to %s\n", human.Bytes(total), args[0])
			}
			rep := progress.New(os.Stderr, "synth", f.quiet)
			rep.Total(total)
			sum, err := fixtures.Write(cmd.Context(), args[0], spec, fixtures.Options{Force: f.force, Progress: rep.Add})
			rep.Done()
			if err != nil {
				return err
			}
			if f.asJSON {
				return writeJSON(cmd.OutOrStdout(), sum)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), synthLine(sum))
			return err
		},
	}
	f.register(cmd)
	// The presets' sizes are computed only when the help is shown: the
	// command is built on every run of moeprep.
	cmd.SetHelpFunc(func(c *cobra.Command, args []string) {
		c.Long = strings.Replace(c.Long, presetsPlaceholder, presetTable(), 1)
		c.Parent().HelpFunc()(c, args)
	})
	return cmd
}

// presetsPlaceholder stands in synth's long help for presetTable.
const presetsPlaceholder = "  {{presets}}"

// presetTable lists the presets two to a line, each with the bytes it
// writes, so a 34 GB one is not picked by accident.
func presetTable() string {
	names := fixtures.PresetNames()
	cells := make([]string, len(names))
	for i, n := range names {
		size := "?"
		if sp, err := fixtures.PresetSpec(n); err == nil {
			if b, err := sp.TotalBytes(); err == nil {
				size = human.Bytes(b)
			}
		}
		cells[i] = fmt.Sprintf("%-31s %9s", n, size)
	}
	var b strings.Builder
	for i := 0; i < len(cells); i += 2 {
		b.WriteString("  " + cells[i])
		if i+1 < len(cells) {
			b.WriteString("   " + cells[i+1])
		}
		if i+2 < len(cells) {
			b.WriteString("\n")
		}
	}
	return b.String()
}

// synthSpecLine says what a spec writes before it is written: the model
// type and weights, layers, experts and bytes.
func synthSpecLine(spec fixtures.SynthSpec, total int64) string {
	n, err := spec.Normalize()
	if err != nil {
		return human.Bytes(total)
	}
	dtype := n.DType
	if dtype == "" {
		dtype = "bf16"
	}
	experts := human.Count(n.Experts, "expert")
	if n.SharedExperts > 0 {
		experts += fmt.Sprintf(" + %d shared", n.SharedExperts)
	}
	layers := human.Count(n.Layers, "layer")
	if n.MTPLayers > 0 {
		layers += " + " + human.Count(n.MTPLayers, "MTP layer")
	}
	return fmt.Sprintf("%s %s, %s, %s, top-%d, %s", n.Family, dtype, layers, experts, n.TopK, human.Bytes(total))
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
	return headLine("wrote "+s.Dir+":", fmt.Sprintf("%s %s, %s, %s, top-%d, %s in %s", s.ModelType, s.DType,
		layers, experts, s.TopK, human.Bytes(s.Bytes), human.Count(len(s.Files)+1, "file")))
}

// headLine is "head rest" on one line where it fits lineWidth, else head
// (which names a directory, as long as its path) on a line of its own
// and rest indented below it.
func headLine(head, rest string) string {
	if utf8.RuneCountInString(head)+1+utf8.RuneCountInString(rest) <= lineWidth {
		return head + " " + rest
	}
	return head + "\n  " + rest
}

// writerFunc is an io.Writer resolved at each write: the command's stderr
// is set by the caller after the flags are made.
type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }
