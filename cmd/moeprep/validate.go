package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/validate"
)

func init() { extraCommands = append(extraCommands, newValidateCmd) }

type validateFlags struct {
	layers, golden, device, jsonFile string
	precision, cpuCheck              string
	tokens, blockSize, workers       int
	sampleExperts                    int
	seed                             uint64
	quiet, ioBaseline                bool
	bytesOnly, skipBytes             bool
}

func (f *validateFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.layers, "layers", "all", "layers to check: all, a list like 1,2,5, or sample:N")
	fl.IntVar(&f.tokens, "tokens", validate.DefaultTokens, "token vectors per layer (when no golden provides them)")
	fl.Uint64Var(&f.seed, "seed", 0, "seed of the token vectors")
	fl.StringVar(&f.device, "device", "auto", "auto (CUDA when a GPU and driver are present, else the CPU), cpu or cuda")
	fl.StringVar(&f.precision, "precision", "bf16", "GPU activations: bf16 (as serving engines run), f32, or fp8 (w8a8: e4m3 per token per 128 channels, "+
		"fp8 weights, compute capability 9.0; the CPU reference quantises the same way)")
	fl.StringVar(&f.cpuCheck, "cpu-check", validate.CPUCheckAuto, "GPU runs: layers the CPU reference also checks: auto (first and last, or all when <= 4), none (GPU only, at I/O speed) or all")
	fl.BoolVar(&f.ioBaseline, "io-baseline", false, "GPU runs: afterwards, time reading and uploading each layer's bytes without compute, and report layer time / that")
	fl.StringVar(&f.golden, "golden", "", "directory of HF golden outputs (moe-layer-L.safetensors) to check against")
	fl.IntVar(&f.blockSize, "block-size", validate.DefaultBlockSize, "moe_align_block_size block size of the fused path")
	fl.IntVar(&f.workers, "workers", 0, "experts computed at once (default: up to 4, one per core)")
	fl.IntVar(&f.sampleExperts, "sample-experts", 0, "exercise only N routed experts per layer on forced tokens, and accept layers with experts unexercised (default 0: every expert, a layer with any unexercised expert fails)")
	fl.BoolVar(&f.bytesOnly, "bytes", false, "only the structural proof: every DST tensor byte-identical to SRC per the contract (folded values within one rounding), the manifest's sizes and sha256; no GPU needed, one streamed pass")
	fl.BoolVar(&f.skipBytes, "skip-bytes", false, "skip the structural proof that a SRC DST run does after the layer checks")
	fl.StringVar(&f.jsonFile, "json", "", "also write the report as JSON to FILE (- for stdout instead of the table)")
	fl.BoolVar(&f.quiet, "no-progress", false, "no progress lines on stderr (as every command takes it)")
	fl.BoolVar(&f.quiet, "quiet", false, "the same as --no-progress")
}

// runValidate runs validate and prints the report; the error maps to exit 1
// when a check failed and 2 when the input could not be checked.
func runValidate(cmd *cobra.Command, f *validateFlags, src, dst string, progress io.Writer) error {
	o := validate.Options{Src: src, Dst: dst, Golden: f.golden, Layers: f.layers, Tokens: f.tokens,
		Seed: f.seed, Device: f.device, BlockSize: f.blockSize, Workers: f.workers, GPUPrecision: f.precision,
		CPUCheck: f.cpuCheck, IOBaseline: f.ioBaseline, SampleExperts: f.sampleExperts,
		// The CPU-fallback notice is shown even with --quiet: it changes what was certified.
		Notice: func(msg string) { fmt.Fprintln(progress, msg) }}
	if !f.quiet {
		o.Progress = func(msg string) { fmt.Fprintln(progress, msg) }
	}
	switch {
	case f.bytesOnly && f.skipBytes:
		return fmt.Errorf("--bytes and --skip-bytes contradict each other")
	case f.bytesOnly:
		o.Bytes = validate.BytesOnly
	case f.skipBytes:
		o.Bytes = validate.BytesOff
	}
	rep, err := validate.Run(cmd.Context(), o)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	switch f.jsonFile {
	case "-":
		if err := rep.WriteJSON(out); err != nil {
			return err
		}
	case "":
		if err := rep.WriteTable(out); err != nil {
			return err
		}
	default:
		if err := rep.WriteTable(out); err != nil {
			return err
		}
		if err := writeFileAtomic(f.jsonFile, rep.WriteJSON); err != nil {
			return err
		}
	}
	return rep.Err()
}

// writeFileAtomic writes through a temporary name and renames when complete.
func writeFileAtomic(path string, write func(io.Writer) error) error {
	tmp := path + ".tmp"
	fh, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := write(fh); err != nil {
		fh.Close()
		os.Remove(tmp)
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := fh.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.Rename(tmp, path)
}

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
streamed pass that also checks the manifest's sizes and sha256. It names
the first differing tensor, layer, expert and byte offset.

A NaN or Inf in any weight, scale or bias validate reads fails its layer.

Per layer it reports relative L2 error, max abs error, cosine similarity and
tie-robust top-k agreement, with a verdict against a documented tolerance.
On the GPU (--device cuda) both paths run on the GPU, and the CPU reference
checks some layers too (--cpu-check); per layer it reports the bytes read and
uploaded, I/O, compute and wall seconds, and with --io-baseline the layer's
time against only reading and uploading the same bytes.
Exit 0 when every layer passes, 1 when any fails, 2 when the input is unusable.`,
		Example: `  moeprep validate ./DeepSeek-V3 ./DeepSeek-V3-fused
  moeprep validate --layers sample:4 --tokens 64 --json report.json ./DeepSeek-V3 ./DeepSeek-V3-fused
  moeprep validate ./DeepSeek-V3-fused --golden ./goldens
  moeprep validate ./src ./dst --golden ./src/reference   # both paths against HF
  moeprep validate --bytes ./DeepSeek-V3 ./DeepSeek-V3-fused   # structural proof only, at I/O speed
  moeprep validate --sample-experts 32 --layers sample:4 ./src ./dst   # a quick partial check
  moeprep validate --device cuda --cpu-check none --io-baseline ./DeepSeek-V3 ./DeepSeek-V3-fused`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 2 || (len(args) == 1 && f.golden != "") {
				return nil
			}
			return fmt.Errorf("%s takes SRC DST, or DST with --golden DIR (see '%s --help')", cmd.CommandPath(), cmd.CommandPath())
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := "", args[len(args)-1]
			if len(args) == 2 {
				src = args[0]
			}
			return runValidate(cmd, &f, src, dst, cmd.ErrOrStderr()) // escaped by run
		},
	}
	f.register(cmd)
	return cmd
}
