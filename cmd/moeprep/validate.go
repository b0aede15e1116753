package main

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/internal/progress"
	"github.com/moeprep/moeprep/validate"
)

type validateFlags struct {
	layers, golden, device     string
	precision, cpuCheck        string
	tokens, blockSize, workers int
	rank                       int
	sampleExperts              int
	revision                   string
	junit                      string
	seed                       uint64
	quiet, ioBaseline          bool
	bytesOnly, skipBytes       bool
	report                     reportFlags
}

func (f *validateFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	revisionFlag(cmd, &f.revision)
	fl.StringVar(&f.junit, "junit", "", "also write the checks as JUnit XML to `FILE` (one test case per check and layer), for CI systems; never over a file that is not moeprep's JUnit")
	fl.StringVar(&f.layers, "layers", "all", "layers to check: all, a list like 1,2,5, or sample:N (the report names the layers left out)")
	fl.IntVar(&f.tokens, "tokens", validate.DefaultTokens, "token vectors per layer, 1..65536 (when no golden provides them)")
	fl.Uint64Var(&f.seed, "seed", 0, "seed of the token vectors")
	fl.StringVar(&f.device, "device", "auto", "auto (CUDA when a GPU and driver are present, else the CPU), cpu or cuda")
	fl.StringVar(&f.precision, "precision", string(validate.PrecisionBF16), "GPU runs: activations bf16 (as serving engines run), f32, or fp8 (w8a8: e4m3 per token per 128 channels, "+
		"fp8 weights, compute capability 9.0; the CPU reference quantises the same way)")
	fl.StringVar(&f.cpuCheck, "cpu-check", string(validate.CPUCheckAuto), "GPU runs: layers the CPU reference also checks: auto (first and last, or all when <= 4), none (GPU only, at I/O speed) or all")
	fl.BoolVar(&f.ioBaseline, "io-baseline", false, "GPU runs: afterwards, time reading and uploading each layer's bytes without compute, and report layer time / that")
	fl.StringVar(&f.golden, "golden", "", "directory of HF golden outputs (moe-layer-L.safetensors) to check against")
	fl.IntVar(&f.blockSize, "block-size", validate.DefaultBlockSize, "moe_align_block_size block size of the fused path")
	fl.IntVarP(&f.workers, "jobs", "j", 0, "experts computed at once, capped at one per core and at what memory holds (the report notes a cap; default 0: one per core, up to 4)")
	// --workers was the name before every command's parallelism became
	// -j/--jobs; scripts that pass it keep working, with a warning.
	fl.IntVar(&f.workers, "workers", 0, "the old name of --jobs")
	_ = fl.MarkDeprecated("workers", "use -j/--jobs")
	fl.IntVar(&f.sampleExperts, "sample-experts", 0, "exercise only N routed experts per layer on forced tokens, and accept layers with experts unexercised (the report names them; default 0: every expert, a layer with any unexercised expert fails)")
	fl.BoolVar(&f.bytesOnly, "bytes", false, "only the structural proof: every DST tensor byte-identical to SRC per the contract (folded values within one rounding), the manifest's sizes and hashes; no GPU needed, one streamed pass")
	fl.IntVar(&f.rank, "rank", -1, "a per-rank output (convert --ep): prove rank `R`'s files alone, with the shared files, against SRC (what a node checks before it serves); without it every rank is proven")
	fl.BoolVar(&f.skipBytes, "skip-bytes", false, "skip the structural proof that a SRC DST run does after the layer checks")
	f.report.register(cmd, "the report")
	quietFlag(cmd, &f.quiet)
	_ = cmd.RegisterFlagCompletionFunc("device", fixedCompletion("auto", "cpu", "cuda"))
	_ = cmd.RegisterFlagCompletionFunc("precision", fixedCompletion(validate.PrecisionBF16, "f32", "fp8"))
	_ = cmd.RegisterFlagCompletionFunc("cpu-check", fixedCompletion(string(validate.CPUCheckAuto), string(validate.CPUCheckNone), string(validate.CPUCheckAll)))
}

// layerOnlyFlags are the flags only the layer checks read: with --bytes,
// which runs the byte proof alone, each would be silently ignored.
var layerOnlyFlags = []string{"golden", "layers", "tokens", "seed", "sample-experts", "block-size", "precision", "cpu-check", "io-baseline", "jobs", "workers"}

// gpuOnlyFlags are the flags only a GPU run reads.
var gpuOnlyFlags = []string{"precision", "cpu-check", "io-baseline"}

// check refuses flag combinations that cannot apply, before anything is
// read or written: a flag that would silently do nothing misleads whoever
// reads the report.
func (f *validateFlags) check(cmd *cobra.Command, args []string) error {
	fl := cmd.Flags()
	changed := func(name string) bool { return fl.Lookup(name) != nil && fl.Changed(name) }
	if changed("jobs") && changed("workers") {
		return fmt.Errorf("--workers is the old name of --jobs; give -j/--jobs alone")
	}
	if f.workers < 0 {
		return fmt.Errorf("--jobs %d: want 1 or more experts at once (0, the default: one per core, up to 4)", f.workers)
	}
	if f.bytesOnly && f.skipBytes {
		return fmt.Errorf("--bytes and --skip-bytes contradict each other")
	}
	if f.bytesOnly {
		for _, name := range layerOnlyFlags {
			if changed(name) {
				return fmt.Errorf("--%s applies to the layer checks, and --bytes runs the byte proof alone; drop --%s or --bytes", name, name)
			}
		}
	}
	if changed("tokens") && f.tokens <= 0 {
		return fmt.Errorf("--tokens %d: want 1..65536 token vectors per layer (default %d)", f.tokens, validate.DefaultTokens)
	}
	if strings.EqualFold(strings.TrimSpace(f.device), string(validate.DeviceCPU)) {
		for _, name := range gpuOnlyFlags {
			if !changed(name) || (name == "precision" && strings.EqualFold(f.precision, string(validate.PrecisionBF16))) {
				continue // bf16 is what the CPU comparison assumes anyway
			}
			return fmt.Errorf("--%s applies to GPU runs, and this run is --device cpu; drop it, or use --device cuda (or auto on a machine with a GPU)", name)
		}
	}
	if f.skipBytes && len(args) < 2 {
		return fmt.Errorf("--skip-bytes: there is no byte proof to skip, it runs only with SRC and DST")
	}
	if f.report.json {
		// The old form was --json FILE: its FILE is now an argument.
		for _, a := range args {
			if st, err := os.Stat(a); (err == nil && !st.IsDir()) || (err != nil && strings.HasSuffix(a, ".json")) {
				return fmt.Errorf("%s is not a checkpoint directory; --json takes no file now (it prints the report as JSON on stdout): to write the report to a file, use -o %s", a, a)
			}
		}
	}
	src, dst := validateSides(args)
	// Before the run, not after it: a report path that would overwrite a
	// checkpoint or a file that is not a report fails at once.
	if err := checkOutputPath(f.report.output, src, dst, f.golden); err != nil {
		return err
	}
	return checkJUnitPath(f.junit, src, dst, f.golden)
}

// validateSides are SRC and DST of validate's arguments (SRC "" for DST
// with --golden).
func validateSides(args []string) (src, dst string) {
	if len(args) == 0 {
		return "", ""
	}
	if len(args) == 2 {
		src = args[0]
	}
	return src, args[len(args)-1]
}

// runValidate runs validate and prints the report; the error maps to exit 1
// when a check failed and 2 when the input could not be checked. Step lines
// and notices go to msgs.
func runValidate(cmd *cobra.Command, f *validateFlags, src, dst string, msgs io.Writer) error {
	if src != "" {
		var err error
		if src, err = sourceDir(cmd, "validate", src, f.revision); err != nil {
			return err
		}
	}
	if handled, err := runRankProof(cmd, f, src, dst); handled {
		return err
	}
	o := validate.Options{Src: src, Dst: dst, Golden: f.golden, Layers: f.layers, Tokens: f.tokens,
		Seed: f.seed, Device: validate.Device(f.device), BlockSize: f.blockSize, Workers: f.workers, GPUPrecision: validate.Precision(f.precision),
		CPUCheck: validate.CPUCheckMode(f.cpuCheck), IOBaseline: f.ioBaseline, SampleExperts: f.sampleExperts}
	switch {
	case f.bytesOnly && f.skipBytes:
		return fmt.Errorf("--bytes and --skip-bytes contradict each other")
	case f.bytesOnly:
		o.Bytes = validate.BytesOnly
	case f.skipBytes:
		o.Bytes = validate.BytesOff
	}
	// The CPU-fallback notice changes what was certified, and the report
	// says so in a note: the table prints it, --json carries it in notes.
	// Beside the text table a line on stderr would say it twice; with
	// --json (and not --quiet) stderr is where a person watching sees it.
	// What config.json says and moeprep ignores is shown even with --quiet.
	notice := func(msg string) { fmt.Fprintln(msgs, msg) }
	var st *progress.Status
	if !f.quiet {
		st = progress.NewStatusFor(os.Stderr, msgs, "validate")
		notice, o.Progress, o.ByteProgress = st.Println, st.Println, st
	}
	o.Notice = func(msg string) {
		// validate's two fallback notices end so (device.go, run.go).
		if strings.HasSuffix(msg, "; running on the CPU") && (!f.report.json || f.quiet) {
			return
		}
		notice(msg)
	}
	rep, err := validate.Run(cmd.Context(), o)
	if st != nil {
		st.Done()
	}
	if err != nil {
		return err
	}
	rep.Tool = "moeprep " + versionString()
	if err := f.report.emit(cmd, rep, rep.WriteTable); err != nil {
		return err
	}
	if f.junit != "" {
		if err := writeOutput(f.junit, rep.WriteJUnit); err != nil {
			return err
		}
	}
	if os.Getenv("GITHUB_ACTIONS") == "true" {
		// Workflow commands on stderr: stdout may be --json's document.
		if err := rep.WriteGitHubAnnotations(cmd.ErrOrStderr()); err != nil {
			return err
		}
	}
	return rep.Err()
}

// flagValueError matches pflag's error for a value that does not parse,
// which quotes Go's strconv; users get what the flag wanted instead.
var flagValueError = regexp.MustCompile(`^invalid argument "(.*)" for "(?:-\w, )?(--[\w-]+)" flag: strconv\.Parse(Bool|Int|Uint)`)

func newValidateCmd() *cobra.Command {
	var f validateFlags
	cmd := &cobra.Command{
		Use:   "validate SRC DST | validate DST --golden DIR",
		Short: "Prove a converted checkpoint computes the same MoE function as its source",
		Long: `validate runs each MoE layer both ways on the same seeded token vectors and
compares them: the unfused reference on SRC (router in fp32, every selected
expert's SwiGLU, weighted sum, shared expert) and the fused path serving engines
run on DST, driven by DST's moeprep contract (gate with shared slots,
moe_align_block_size, grouped GEMM over blocks, finalize). With --golden it
also checks against golden outputs exported from HF transformers.

Every expert is exercised, whatever the router picks: besides the routed
tokens, each layer runs forced tokens whose slots name every routed expert
(twice, in different company) and every shared replica, through the same
align, grouped GEMM and finalize code; each forced token must match on its
own, and the report names the expert(s) whose every token failed. A layer
with an unexercised expert fails unless --sample-experts N asks for less.

Then (SRC DST runs; --bytes for this alone, --skip-bytes to skip it) the
structural proof: every DST tensor is predicted from SRC and the contract
(stacked slices, shared replicas and splits, folded values within one
rounding, every other tensor as it is) and compared byte for byte in one
streamed pass that also checks the manifest's sizes and hashes. It names
the first differing tensor, layer, expert and byte offset.

A NaN or Inf in any weight, scale or bias validate reads fails its layer.

Per layer it reports relative L2 error, max abs error, cosine similarity and
tie-robust top-k agreement, with a verdict against a documented tolerance.
The last line sums up what was checked: the MoE layers (naming any that
--layers left out), the experts (naming, per layer, any a sample left out)
and the byte proof. --json prints the report as JSON on stdout instead
(schema moeprep.validate/v1, validate/SCHEMA.md); -o FILE also writes it to
FILE. Progress goes to stderr: bytes read of the total, rate, ETA, the
layer and what is being read.

On the GPU (--device cuda) both paths run on the GPU, and the CPU reference
checks some layers too (--cpu-check); per layer it reports the bytes read and
uploaded, I/O, compute and wall seconds, and with --io-baseline the layer's
time against only reading and uploading the same bytes.
Exit 0 when every check passes, 1 when any fails, 2 when the input is
unusable or flags cannot apply together.`,
		Example: `  moeprep validate ./DeepSeek-V3 ./DeepSeek-V3-fused
  moeprep validate --layers sample:4 --tokens 64 -o report.json ./DeepSeek-V3 ./DeepSeek-V3-fused
  moeprep validate --json ./DeepSeek-V3 ./DeepSeek-V3-fused | jq .summary
  moeprep validate ./DeepSeek-V3-fused --golden ./goldens
  moeprep validate ./src ./dst --golden ./src/reference   # both paths against HF
  moeprep validate --bytes ./DeepSeek-V3 ./DeepSeek-V3-fused   # structural proof only, at I/O speed
  moeprep validate --sample-experts 32 --layers sample:4 -j 4 ./src ./dst   # a quick partial check
  moeprep validate --device cuda --cpu-check none --io-baseline ./DeepSeek-V3 ./DeepSeek-V3-fused`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 2 || (len(args) == 1 && f.golden != "") {
				return nil
			}
			hint := ""
			if f.report.json && len(args) > 2 {
				hint = "; --json takes no file now (it prints the report as JSON on stdout): -o FILE writes it to a file"
			}
			return fmt.Errorf("%s takes SRC DST, or DST with --golden DIR; got %s%s (see '%s --help')", commandName(cmd), argCount(len(args)), hint, cmd.CommandPath())
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.check(cmd, args); err != nil {
				return err
			}
			if cmd.Flags().Changed("workers") {
				// pflag's own deprecation notice goes to a buffer cobra
				// never prints; scripts should learn the new name.
				fmt.Fprintln(cmd.ErrOrStderr(), "validate: --workers is deprecated: use -j/--jobs (the same setting)")
			}
			src, dst := validateSides(args)
			return runValidate(cmd, &f, src, dst, cmd.ErrOrStderr()) // escaped by run
		},
	}
	f.register(cmd)
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		if m := flagValueError.FindStringSubmatch(err.Error()); m != nil {
			value, name := m[1], m[2]
			switch {
			case name == "--json":
				err = fmt.Errorf("--json takes no value (it prints the report as JSON on stdout); to write the report to a file, use -o %s", value)
			case m[3] == "Bool":
				err = fmt.Errorf("%s takes no value, got %q", name, value)
			default:
				err = fmt.Errorf("%s %q: want a whole number", name, value)
			}
		}
		return c.Root().FlagErrorFunc()(c, err)
	})
	return cmd
}
