package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/human"
	"github.com/moeprep/moeprep/internal/progress"
	"github.com/moeprep/moeprep/internal/termsafe"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

// convertFlags are the flags convert and fuse-shared share.
type convertFlags struct {
	layout, maxShard string
	orientation      string
	digest           string
	dtype            string
	jobs             int
	force, resume    bool
	dryRun           bool
	bufferedIO       bool
	quiet            bool
	revision         string
	// srcShown is SRC as next: lines name it ("": the folder, quoted).
	srcShown string
	exclude  []string
	report   reportFlags
	// per rank (--ep): convert.Options' fields of the same names
	ep, moeTP, slots, nodes  int
	placementStats, placeMap string
}

// Schemas of convert's JSON documents (SCHEMAS.md).
const (
	schemaConvert     = schemaPrefix + "convert/v1"
	schemaConvertPlan = schemaPrefix + "convert-plan/v1"
)

func (f *convertFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	revisionFlag(cmd, &f.revision)
	fl.StringArrayVar(&f.exclude, "exclude", nil, "leave out SRC's files or folders matching `GLOB` (repeatable): 'original', 'metal/*', '*.gguf'; never the weights or config.json; the contract records each file left out")
	fl.StringVar(&f.layout, "layout", "stacked", "expert layout: stacked (all_gate/all_up [E,I,H], all_down [E,H,I]), gate-up (gate_up_proj [E,2I,H], gate rows first), up-gate (up rows first), or transformers (the form transformers 5 holds the family's experts in, so it loads the output as the original: gate-up for most, in-out for Llama 4, the experts as stored for aria, DBRX, gpt-oss, LongCat-Flash, Nemotron-H); ungated experts (Nemotron-H) are stacked only, all_up and all_down")
	fl.StringVar(&f.orientation, "orientation", "", "each expert matrix in the stacks: out-in (the default; with --layout transformers, the family's form; [out,in] as nn.Linear holds it: all_gate [E,I,H]) or in-out (its transpose, for x @ W: all_gate [E,H,I], all_down [E,I,H], gate_up_proj [E,H,2I]; FP8 scale grids transposed with them; not for formats packed along a row: INT4, NVFP4, MXFP4)")
	fl.StringVar(&f.maxShard, "max-shard-size", "5GB", "largest output shard, e.g. 5GB, 500MB, 2GiB (GB = 10^9 bytes, GiB = 2^30)")
	fl.IntVarP(&f.jobs, "jobs", "j", convert.DefaultJobs, "shards written at once; each holds up to 36 MiB of buffers (8 staged 4 MiB blocks and a 4 MiB read buffer)")
	fl.StringVar(&f.digest, "digest", layout.ShardBlockAlgo.String(), fmt.Sprintf("how the manifest hashes each shard's %d MiB blocks: xxh3 (XXH3-128, fast; catches corruption and torn writes), blake3 or sha256 (cryptographic, for a digest to pin; slower on few cores)", layout.ShardBlockSize>>20))
	fl.BoolVarP(&f.force, "force", "f", false, "replace DST if it is an earlier moeprep output (every file listed in its manifest) or empty; anything else is refused")
	fl.BoolVar(&f.resume, "resume", false, "continue an interrupted run from DST.partial, reusing finished shards whose file and source bytes still hash as recorded; on a complete DST, verify it and exit 0")
	fl.BoolVar(&f.dryRun, "dry-run", false, "print the plan (shards, bytes to read and write, free space, time at SRC's measured read speed) and write nothing")
	fl.StringVar(&f.dtype, "dtype", "", "dequantise every quantised weight (experts, attention, dense MLPs; FP8, INT4, NVFP4, MXFP4) into bf16, f16 or f32: the dtype the dequantised tensors get, each value the exact float32 dequantisation rounded once to nearest even (f32: exact); their scale tensors and input_scale are dropped, config.json loses quantization_config; every other tensor stays byte for byte")
	fl.BoolVar(&f.bufferedIO, "buffered-io", false, "write shards through the page cache instead of with O_DIRECT (used anyway where the file system refuses O_DIRECT)")
	fl.IntVar(&f.ep, "ep", 0, "write the routed experts per rank for `N` expert-parallel ranks (rank-0000r-of-0000N/, a per-rank index; everything else in shared files); N must divide E, or --slots")
	fl.IntVar(&f.moeTP, "moe-tp", 1, "with --ep: cut each expert's intermediate dimension `M` ways, N*M ranks (gate and up rows, down columns, on scale block boundaries)")
	fl.IntVar(&f.slots, "slots", 0, "with --ep: physical expert slots per MoE layer `S` = E + redundant (default E; a multiple of --ep)")
	fl.StringVar(&f.placementStats, "placement", "", "with --ep: place the slots from recorded expert loads in `STATS` (SGLang's expert-distribution dump, .json or .pt; TensorRT-LLM's expert statistic directory; or {\"layer\": [counts...]}: see moeprep placement --help), as moeprep placement does")
	fl.IntVar(&f.nodes, "nodes", 0, "with --placement: the ranks are on `K` nodes; the placement is hierarchical (whole expert groups onto nodes) where n_group divides among them")
	fl.StringVar(&f.placeMap, "placement-map", "", "with --ep: take each MoE layer's slots from `FILE`: moeprep placement --json, or SGLang's init_expert_location JSON")
	quietFlag(cmd, &f.quiet)
	f.report.register(cmd, "the summary")
	_ = cmd.RegisterFlagCompletionFunc("layout", fixedCompletion(layout.Stacked, layout.GateUp, layout.UpGate, layout.Transformers))
	_ = cmd.RegisterFlagCompletionFunc("orientation", fixedCompletion(layout.OutIn, layout.InOut))
	_ = cmd.RegisterFlagCompletionFunc("digest", fixedCompletion("xxh3", "blake3", "sha256"))
	_ = cmd.RegisterFlagCompletionFunc("dtype", fixedCompletion("bf16", "f16", "f32"))
}

// fixedCompletion completes a flag's value from a fixed list.
func fixedCompletion[T ~string](values ...T) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		out := make([]string, len(values))
		for i, v := range values {
			out[i] = string(v)
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// argsOptions resolves SRC (args[0]: a directory or a Hugging Face repo at
// --revision) and gives convert's options for it and DST (args[1]): what
// convert and fuse-shared both start from.
func (f *convertFlags) argsOptions(cmd *cobra.Command, args []string) (convert.Options, error) {
	src, shown, err := sourceArg(cmd, cmd.Name(), args[0], f.revision)
	if err != nil {
		return convert.Options{}, err
	}
	f.srcShown = shown
	if err := swappedArgs(cmd, src, args[1]); err != nil {
		return convert.Options{}, err
	}
	return f.options(src, args[1])
}

// source is SRC as a next: line names it: as the user typed a Hugging Face
// id, else the folder.
func (f *convertFlags) source(dir string) string {
	if f.srcShown != "" {
		return f.srcShown
	}
	return shellQuote(dir)
}

func (f *convertFlags) options(src, dst string) (convert.Options, error) {
	l, err := layout.Parse(f.layout)
	if err != nil {
		return convert.Options{}, fmt.Errorf("--layout: %w", err)
	}
	var orient layout.Orientation // "": the default, or the family's form with --layout transformers
	if f.orientation != "" {
		if orient, err = layout.ParseOrientation(f.orientation); err != nil {
			return convert.Options{}, fmt.Errorf("--orientation: %w", err)
		}
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
	dtype, err := parseDequantDType(f.dtype)
	if err != nil {
		return convert.Options{}, err
	}
	if f.force && f.resume {
		return convert.Options{}, fmt.Errorf("--force and --resume contradict each other: --resume keeps DST.partial's finished shards, --force starts over")
	}
	if err := checkOutputPath(f.report.output, src, dst); err != nil {
		return convert.Options{}, err
	}
	if f.ep == 0 && f.moeTP != 1 {
		return convert.Options{}, fmt.Errorf("--moe-tp %d needs --ep", f.moeTP)
	}
	if f.ep < 0 || f.moeTP < 1 {
		return convert.Options{}, fmt.Errorf("--ep %d, --moe-tp %d: want positive numbers", f.ep, f.moeTP)
	}
	moeTP := f.moeTP
	if f.ep == 0 {
		moeTP = 0
	}
	return convert.Options{Src: src, Dst: dst, Layout: l, Orientation: orient, MaxShardSize: size, Jobs: f.jobs, Digest: digest, Exclude: f.exclude,
		Force: f.force, Resume: f.resume, BufferedIO: f.bufferedIO, DType: dtype, Tool: "moeprep " + versionString(),
		EP: f.ep, MoETP: moeTP, Slots: f.slots, PlacementStats: f.placementStats, PlacementMap: f.placeMap, Nodes: f.nodes}, nil
}

// parseDequantDType reads --dtype: "" (keep quantised weights), bf16, f16
// or f32 (any case; bfloat16, float16, float32 too).
func parseDequantDType(s string) (safetensors.DType, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "":
		return "", nil
	case "bf16", "bfloat16":
		return safetensors.BF16, nil
	case "f16", "fp16", "float16":
		return safetensors.F16, nil
	case "f32", "fp32", "float32":
		return safetensors.F32, nil
	}
	return "", fmt.Errorf("--dtype %q: want bf16, f16 or f32 (the dtype dequantised weights get)", s)
}

func runConvert(cmd *cobra.Command, f *convertFlags, o convert.Options) error {
	label := "convert"
	if o.FuseShared {
		label = "fuse-shared"
	}
	o.Notice = noticer(cmd, label)
	if f.dryRun {
		p, err := convert.DryRun(cmd.Context(), o)
		if err != nil {
			return err
		}
		doc := struct {
			Schema string `json:"schema"`
			*convert.Plan
		}{schemaConvertPlan, p}
		return f.report.emit(cmd, doc, func(w io.Writer) error { return printPlan(w, label, p) })
	}
	rep := progress.New(os.Stderr, label, f.quiet)
	o.Progress = rep
	s, err := convert.Convert(cmd.Context(), o)
	rep.Done()
	if err != nil {
		return err
	}
	doc := struct {
		Schema string `json:"schema"`
		*convert.Summary
	}{schemaConvert, s}
	return f.report.emit(cmd, doc, func(w io.Writer) error {
		if s.AlreadyComplete {
			_, err := fmt.Fprintf(w, "%s is already complete: %s and %s, %s, every one matching its manifest and this run's plan; nothing to do\n",
				s.Dst, human.Count(s.Shards, "shard"), human.Count(s.Files-s.Shards, "other file"), human.Bytes(s.Bytes))
			if err == nil {
				_, err = fmt.Fprintln(w, withComment(fmt.Sprintf("next: moeprep validate %s %s", f.source(o.Src), shellQuote(o.Dst)), "prove it against the source"))
			}
			return err
		}
		shards := human.Count(s.Shards, "shard")
		if s.ReusedShards > 0 {
			shards += fmt.Sprintf(" (%d reused from the interrupted run)", s.ReusedShards)
		}
		msg := fmt.Sprintf("wrote %s: layout %s%s, %s, %s, %s in %s (%s)",
			s.Dst, s.Layout, orientationNote(s.Orientation), shards, human.Count(s.Files, "file"),
			human.Bytes(s.Bytes), human.Duration(time.Duration(s.Seconds*float64(time.Second))),
			human.Rate(s.Bytes, time.Duration(s.Seconds*float64(time.Second))))
		// What the run changed besides stacking, on a line of its own, so
		// that each fits a terminal (issue 46); --json has every figure.
		var detail []string
		if s.DType != "" {
			detail = append(detail, fmt.Sprintf("%s dequantised to %s", human.Count(s.DequantizedTensors, "quantised weight"), s.DType))
		}
		if s.Ranks > 0 {
			msg += fmt.Sprintf("; experts per rank for %s (rank-*/)", human.Count(s.Ranks, "rank"))
		}
		if o.FuseShared {
			fused := human.Count(s.FusedShared, "fused shared expert")
			if s.SharedRequantized != "" {
				fused += fmt.Sprintf(" (requantised to %s: validate reports the error it adds)", s.SharedRequantized)
			}
			detail = append(detail, fused)
			if s.Folded {
				detail = append(detail, fmt.Sprintf("routed_scaling_factor folded (max relative change %.3g)", s.FoldMaxRelChange))
			} else {
				detail = append(detail, "routed_scaling_factor not folded (slot weight 1/rsf, runtime multiply)")
			}
		}
		if utf8.RuneCountInString(msg) > lineWidth {
			// A long DST path: it stands on a line of its own.
			if head, rest, ok := strings.Cut(msg, ": layout "); ok {
				msg = head + ":\n  layout " + rest
			}
		}
		if len(detail) > 0 {
			msg += "\n" + wrapAt("  "+strings.Join(detail, "; "), "; ", lineWidth, "  ")
		}
		if _, err := fmt.Fprintln(w, msg); err != nil {
			return err
		}
		if l := copiedLine(s.Copied, s.Excluded, ""); l != "" {
			if _, err := fmt.Fprintln(w, l); err != nil {
				return err
			}
		}
		_, err := fmt.Fprintln(w, withComment(fmt.Sprintf("next: moeprep validate %s %s", f.source(o.Src), shellQuote(o.Dst)), "prove it computes what the source does"))
		if err == nil {
			_, err = fmt.Fprintln(w, loadStep(s, o))
		}
		return err
	})
}

// loadStep is the line after next: how to load what was written, where a
// library loads it as it is, else where to read what an engine must do.
func loadStep(s *convert.Summary, o convert.Options) string {
	mt, arch := sourceModel(o.Src)
	if s.TransformersForm && layout.LoadsInTransformers(mt) {
		// The form transformers 5 holds this family's experts in, checked
		// with identical logits by scripts/gpu-transformers-load.sh. A
		// wrapper loads with its own class (AutoModelForCausalLM may pick
		// the text model alone).
		cls := "AutoModelForCausalLM"
		if arch != "" && !strings.HasSuffix(arch, "ForCausalLM") {
			cls = arch
		}
		return withComment(fmt.Sprintf("then: python3 -c \"import transformers as t; t.%s.from_pretrained(%s)\"", cls, pyQuote(o.Dst)), "transformers 5 loads it as it is")
	}
	return fmt.Sprintf("then: README \"Using the output\": who loads layout %s, and what a loader must do", s.Layout)
}

// pyQuote is s as a Python string literal.
func pyQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`, `"`, `\"`).Replace(s) + "'"
}

// printPlan prints a --dry-run plan for people.
func printPlan(w io.Writer, label string, p *convert.Plan) error {
	var b strings.Builder
	b.WriteString(wrapWords(fmt.Sprintf("plan: %s %s -> %s (layout %s%s)", label, p.Src, p.Dst, p.Layout, orientationNote(p.Orientation)), "  ") + "\n")
	what := fmt.Sprintf("%s stacked", human.Count(p.MoELayers, "MoE layer"))
	if p.FusedShared > 0 {
		what += fmt.Sprintf(", %s fused per layer", human.Count(p.FusedShared, "shared expert slot"))
	}
	if p.SharedRequantized != "" {
		what += ", the shared expert requantised to " + p.SharedRequantized
	}
	if p.Folded {
		what += ", routed_scaling_factor folded"
	}
	if p.DType != "" {
		what += fmt.Sprintf(", %s dequantised to %s", human.Count(p.DequantizedTensors, "quantised weight"), p.DType)
	}
	b.WriteString(wrapWords(fmt.Sprintf("  %s, %s (%s)", human.Count(len(p.Shards), "shard"), human.Count(p.Tensors, "tensor"), what), "  ") + "\n")
	const listed = 12
	for i, s := range p.Shards {
		if i == listed {
			fmt.Fprintf(&b, "    ... and %s more (--json lists all)\n", human.Count(len(p.Shards)-listed, "shard"))
			break
		}
		fmt.Fprintf(&b, "    %-36s %10s  %s\n", s.Name, human.Bytes(s.Bytes), human.Count(s.Tensors, "tensor"))
	}
	for r, n := range p.RankBytes {
		if r == listed {
			fmt.Fprintf(&b, "    ... and %s more (--json lists all)\n", human.Count(len(p.RankBytes)-listed, "rank"))
			break
		}
		fmt.Fprintf(&b, "    rank %-31d %10s  its experts, beside the shared files\n", r, human.Bytes(n))
	}
	fmt.Fprintf(&b, "  read %s from SRC, write %s to DST (%s copied as they are)\n", human.Bytes(p.ReadBytes), human.Bytes(p.WriteBytes), human.Count(p.CopiedFiles, "other file"))
	if l := copiedLine(p.Copied, p.Excluded, "  "); l != "" {
		b.WriteString(l + "\n")
	}
	switch {
	case p.FreeBytes < 0:
		fmt.Fprintf(&b, "  disk: %s needed; the free space of DST's file system could not be read\n", human.Bytes(p.WriteBytes))
	case p.Fits:
		fmt.Fprintf(&b, "  disk: %s needed, %s free: fits\n", human.Bytes(p.WriteBytes), human.Bytes(p.FreeBytes))
	default:
		fmt.Fprintf(&b, "  disk: %s needed, only %s free: does NOT fit\n", human.Bytes(p.WriteBytes), human.Bytes(p.FreeBytes))
	}
	if p.ReadRate > 0 {
		how := "through the page cache, which may flatter it"
		if p.RateDirect {
			how = "with O_DIRECT"
		}
		fmt.Fprintf(&b, "  time: about %s at %s, SRC's read speed over a %.1f s sample read %s\n",
			human.Duration(time.Duration(p.EstimatedSeconds*float64(time.Second))),
			human.Bytes(int64(p.ReadRate))+"/s", p.RateSampleSeconds, how)
	}
	b.WriteString("nothing was written (--dry-run)\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// orientationNote is ", in-out" for transposed stacks, "" for the default.
func orientationNote(o string) string {
	if o == "" {
		return ""
	}
	return ", " + o
}

// shellQuote quotes a path for a command line a person can paste.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+=:,@", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func newConvertCmd() *cobra.Command {
	var f convertFlags
	cmd := &cobra.Command{
		Use:   "convert SRC DST",
		Short: "Stack each MoE layer's experts into contiguous tensors",
		Long: `convert re-lays every MoE layer's experts into contiguous stacked tensors and
copies everything else byte for byte. Slice e of a stack is source expert e:
bytes are copied, never converted (FP8 weight_scale_inv are stacked alongside),
unless --dtype asks for the quantised weights dequantised: then every quantised
weight (experts and others) becomes bf16, f16 or f32, each value rounded once,
under the names an unquantised checkpoint of the family has; --dtype names the
dtype the dequantised tensors get, and every tensor that was not quantised is
still copied byte for byte.

The output is a hub-layout directory: sharded safetensors with
model.safetensors.index.json, config.json with a "moeprep" contract section
(see layout/CONTRACT.md), and every other file of SRC copied. A PyTorch .bin
source gives safetensors output. Work happens in DST.partial, renamed to DST
only when complete; --resume continues an interrupted run.`,
		Example: `  moeprep convert ./DeepSeek-V3 ./DeepSeek-V3-stacked
  moeprep convert --layout gate-up --max-shard-size 10GB ./Qwen3-30B-A3B ./qwen3-gate-up
  moeprep convert --layout transformers ./gpt-oss-20b ./gpt-oss-tf   # loads in transformers 5
  moeprep convert --resume ./DeepSeek-V3 ./DeepSeek-V3-stacked   # after an interruption
  moeprep convert --dtype bf16 ./DeepSeek-V3 ./DeepSeek-V3-bf16   # for GPUs without FP8
  moeprep convert --ep 8 ./DeepSeek-V3 ./ds3-ep8   # experts per rank: rank-0000r-of-00008/
  moeprep convert --ep 32 --placement-map p.json ./DeepSeek-V3 ./ds3-ep32   # from moeprep placement

  moeprep convert --orientation in-out ./DeepSeek-V3 ./DeepSeek-V3-kmajor   # all_gate [E,H,I]`,
		Args: exactArgs(2, "SRC and DST directories"),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := f.argsOptions(cmd, args)
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
		requantize   bool
	)
	cmd := &cobra.Command{
		Use:   "fuse-shared SRC DST",
		Short: "Convert, appending the shared expert as extra experts, routed_scaling_factor folded",
		Long: `fuse-shared does what convert does and also appends the shared expert to each
MoE layer's expert bank as R replicas (default R = --tp; with --ep N, R = N and
each rank holds its own replica and no other) at ids E..E+R*S-1
(S = n_shared_experts: an S*I shared MLP is split exactly into S experts), so
a serving engine's top-k gains shared slots and never clones weights at load.

--fold-scaling decides where routed_scaling_factor (rsf) lives:
  auto  fold only where exact: FP8 block-scaled routed down scales times rsf
        (fp8 bytes untouched); other dtypes keep a runtime multiply (default)
  down  always fold; bf16/f16/f32 routed down weights times rsf, rounded to
        nearest even (reports the largest relative change); refuses UE8M0 scales
  none  never fold: the shared slot weight is 1/rsf and rsf stays a multiply
With --dtype the weights are dequantised and plain: auto folds nothing and
down is refused (a fold would have to be inside the one rounding).
The contract in DST/config.json says which (see layout/CONTRACT.md).

Where the shared expert is stored unlike the routed experts (Kimi-K2-Thinking:
INT4 routed experts, a BF16 shared expert), fusing it means quantising it,
which fuse-shared refuses unless --requantize-shared asks for it: the shared
expert is then quantised once, from its BF16 values, by the routed format's
own rule (INT4: scale = amax/7.5 per group in the scale dtype, codes rounded
to nearest even in [-8, 7], as compressed-tensors does; FP8: scale = amax/448,
E4M3 codes rounded to nearest even), its slices and replicas stored like the
routed experts. The contract records it (shared_requantized), and validate
reports the error it adds against the model with the BF16 shared expert.
NVFP4 and MXFP4 routed experts are refused: no requantisation rule is built.

Model types whose shared expert can be fused (where the checkpoint has one):
  ` + wrapList(family.FuseSharedModelTypes(), 66, "  ") + `.
The others have no shared expert, or one gated or weighted per token, or
routed experts whose input the routing weight scales: fuse-shared refuses
them with the reason, and convert is the command for them. A checkpoint of a
listed type is still refused, with the reason, when its shared expert has
biases the routed experts lack, is split into S experts across FP8 128x128
blocks, or is stored unlike the routed experts without --requantize-shared.`,
		Example: `  moeprep fuse-shared --tp 8 ./DeepSeek-V3 ./DeepSeek-V3-fused
  moeprep fuse-shared --tp 8 --replicas 1 --fold-scaling none ./Kimi-K2 ./kimi-fused
  moeprep fuse-shared --tp 4 --layout gate-up --json ./DeepSeek-R1 ./r1-fused
  moeprep fuse-shared --tp 8 --requantize-shared ./Kimi-K2-Thinking ./kimi-thinking-fused
  moeprep fuse-shared --tp 8 --orientation in-out ./DeepSeek-V3 ./DeepSeek-V3-fused-kmajor
  moeprep fuse-shared --tp 8 --ep 8 ./DeepSeek-V3 ./ds3-ep8   # a shared replica per rank`,
		Args: exactArgs(2, "SRC and DST directories"),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := f.argsOptions(cmd, args)
			if err != nil {
				return err
			}
			if tp < 1 {
				return fmt.Errorf("--tp %d: must be at least 1", tp)
			}
			if cmd.Flags().Changed("replicas") && replicas < 1 {
				return fmt.Errorf("--replicas %d: must be at least 1", replicas)
			}
			o.FuseShared, o.TP, o.Replicas, o.FoldScaling, o.RequantizeShared = true, tp, replicas, foldScaling, requantize
			return runConvert(cmd, &f, o)
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&tp, "tp", 1, "tensor-parallel size the output is prepared for")
	cmd.Flags().IntVar(&replicas, "replicas", 0, "shared-expert replicas R (default: --tp)")
	cmd.Flags().StringVar(&foldScaling, "fold-scaling", "auto", "where routed_scaling_factor goes: auto, down or none")
	cmd.Flags().BoolVar(&requantize, "requantize-shared", false, "where the shared expert is stored unlike the routed experts (Kimi-K2: BF16 beside INT4), quantise it into their format by that format's own rule (INT4 group or channel, FP8 blocks, channel or tensor); refused otherwise")
	return cmd
}

// copiedLine names the files copied as they are, largest first (the first
// few; --json lists all), and what --exclude left out: so nothing large
// rides along unnoticed. The line starts with indent, and wraps to fit a
// terminal.
func copiedLine(copied []convert.CopiedFile, excluded []string, indent string) string {
	const shown = 4
	var parts []string
	var total int64
	for _, c := range copied {
		total += c.Bytes
	}
	if len(copied) > 0 {
		names := make([]string, 0, shown)
		for i, c := range copied {
			if i == shown {
				names = append(names, fmt.Sprintf("%d more", len(copied)-shown))
				break
			}
			names = append(names, fmt.Sprintf("%s %s", termsafe.Escape(c.Path), human.Bytes(c.Bytes)))
		}
		parts = append(parts, fmt.Sprintf("copied %s, %s: %s", human.Count(len(copied), "file"), human.Bytes(total), strings.Join(names, ", ")))
	}
	if len(excluded) > 0 {
		names := excluded
		more := ""
		if len(names) > shown {
			names, more = names[:shown], fmt.Sprintf(", %d more", len(excluded)-shown)
		}
		esc := make([]string, len(names))
		for i, n := range names {
			esc[i] = termsafe.Escape(n)
		}
		parts = append(parts, fmt.Sprintf("excluded %s: %s%s", human.Count(len(excluded), "file"), strings.Join(esc, ", "), more))
	}
	for i, p := range parts {
		parts[i] = wrapAt(indent+p, ", ", lineWidth, indent+"  ")
	}
	return strings.Join(parts, "\n")
}

// sourceModel is SRC's config.json model_type and its one architecture
// class, "" where it cannot be read (the run read it already; this only
// picks the next-step line) or is not a plain identifier.
func sourceModel(src string) (modelType, arch string) {
	b, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil || len(b) > 16<<20 {
		return "", ""
	}
	var c struct {
		ModelType     string   `json:"model_type"`
		Architectures []string `json:"architectures"`
	}
	if json.Unmarshal(b, &c) != nil {
		return "", ""
	}
	if len(c.Architectures) == 1 && layout.PlainName(c.Architectures[0]) {
		arch = c.Architectures[0]
	}
	return c.ModelType, arch
}
