package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/moeprep/moeprep/placement"
)

func newPlacementCmd() *cobra.Command {
	var (
		s              placement.Spec
		sglang, trtllm string
		report         reportFlags
	)
	cmd := &cobra.Command{
		Use:   "placement STATS --ep N --slots S",
		Short: "Place experts on expert-parallel ranks from recorded loads, with redundant replicas",
		Long: `placement reads recorded expert loads and places S = E + R physical
slots on N ranks (S/N each): the R redundant replicas go to the most loaded
experts, and replicas are packed so the busiest rank stays close to the mean.
Hierarchical (whole expert groups onto nodes first, for group-limited routing)
when --n-group divides among --nodes; global otherwise. A layer with no
recorded load keeps the contiguous placement. Prints, per layer, the imbalance
(max - mean) / mean of the ranks' loads under the contiguous ranges and under
the placement.

STATS is one of (told apart by what it is, not only by its name):
  - SGLang's expert-distribution dump as JSON: {"logical_count": [layers][E]},
    or [N][layers][E] (N forward passes, summed); layers numbered from 0.
  - The same dump as SGLang's recorder writes it, a torch.save .pt file
    (expert_distribution_recorder_*.pt, --expert-distribution-recorder-mode
    stat): a dict whose one tensor is logical_count, int32 or int64,
    [N][layers][E] summed or [layers][E]. Read without running its pickle;
    the per_token mode's dump (no logical_count) is refused.
    (python/sglang/srt/eplb/expert_distribution.py, sgl-project/sglang@02295fe5ac5c)
  - TensorRT-LLM's expert statistic directory, the EXPERT_STATISTIC_PATH a
    run with EXPERT_STATISTIC_ITER_RANGE writes: meta_info.json (num_experts)
    and rankR.safetensors per rank, one int [E] count per "<iteration>_<layer>".
    Every rank's counts are summed, then the iterations, as its
    examples/ep_load_balancer/generate_eplb_config.py does; the iterations
    must be contiguous and every layer recorded at each. Layers keep the
    engine's numbering. (tensorrt_llm/_torch/expert_statistic.py,
    NVIDIA/TensorRT-LLM@0fccc5b97dd7)
  - A plain JSON object {"layer": [counts...]}, keyed by layer index.
Every count must be a whole number of tokens from 0 to 2^53 and every layer
the same number of experts; files are read up to 256 MiB each. An error names
the file and the layer.`,
		Example: `  moeprep placement expert_distribution.json --ep 32 --slots 288
  moeprep placement loads.json --ep 64 --slots 448 --nodes 8 --n-group 8 --json
  moeprep placement loads.json --ep 36 --slots 288 --sglang init_expert_location.json
  moeprep placement loads.json --ep 36 --slots 288 --trtllm moe_load_balancer.yaml
  moeprep placement expert_distribution_recorder_1751234567.pt --ep 32 --slots 288
  moeprep placement ./expert_statistic --ep 36 --slots 288 --trtllm moe_load_balancer.yaml`,
		Args: exactArgs(1, "one statistics file or TensorRT-LLM statistics directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, f := range []struct{ flag, path string }{{"--sglang", sglang}, {"--trtllm", trtllm}} {
				if f.path == "" {
					continue
				}
				// These files carry no moeprep schema: never overwrite one.
				if _, err := os.Lstat(f.path); err == nil {
					return fmt.Errorf("%s %s: exists; moeprep writes a new file only", f.flag, f.path)
				}
			}
			if err := checkOutputPath(report.output); err != nil {
				return err
			}
			st, err := placement.ReadStats(args[0])
			if err != nil {
				return err
			}
			res, err := placement.Place(s, st)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if sglang != "" {
				if err := writeOutput(sglang, res.WriteSGLang); err != nil {
					return err
				}
			}
			if trtllm != "" {
				if err := writeOutput(trtllm, res.WriteTRTLLM); err != nil {
					return err
				}
			}
			return report.emit(cmd, res, func(w io.Writer) error { return writePlacementText(w, res) })
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&s.Ranks, "ep", 0, "expert-parallel ranks N (required)")
	fl.IntVar(&s.Slots, "slots", 0, "physical expert slots per layer S = E + redundant (required; a multiple of --ep)")
	fl.IntVar(&s.Nodes, "nodes", 1, "nodes the ranks are spread over")
	fl.IntVar(&s.Groups, "n-group", 1, "expert groups of group-limited routing (config.json n_group)")
	fl.StringVar(&sglang, "sglang", "", "also write SGLang's --init-expert-location JSON to `FILE`")
	fl.StringVar(&trtllm, "trtllm", "", "also write TensorRT-LLM's moe_load_balancer.yaml to `FILE`")
	_ = cmd.MarkFlagRequired("ep")
	_ = cmd.MarkFlagRequired("slots")
	report.register(cmd, "the placement")
	return cmd
}

func writePlacementText(w io.Writer, r *placement.Result) error {
	mode := "global"
	if r.Hierarchical {
		mode = fmt.Sprintf("hierarchical (%d groups on %d nodes)", r.Groups, r.Nodes)
	}
	fmt.Fprintf(w, "%d experts on %d slots, %d ranks of %d, %s\n", r.Experts, r.Slots, r.Ranks, r.Slots/r.Ranks, mode)
	fmt.Fprintf(w, "%-8s %12s %12s\n", "layer", "contiguous", "placed")
	for i, l := range r.Layers {
		fmt.Fprintf(w, "%-8d %12.4f %12.4f\n", l, r.ImbalanceContiguous[i], r.ImbalanceComputed[i])
	}
	_, err := fmt.Fprintf(w, "%-8s %12.4f %12.4f   imbalance (max - mean) / mean of the ranks' loads\n", "mean", r.MeanImbalanceContiguous, r.MeanImbalanceComputed)
	return err
}
