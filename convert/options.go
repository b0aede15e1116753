// Package convert implements `moeprep convert` and `moeprep fuse-shared`: it
// plans every output shard first, then streams tensor bytes from the source's
// section readers to the output through bounded buffers, stacking each MoE
// layer's experts, optionally appending the shared expert as extra experts and
// folding routed_scaling_factor into the routed down projections.
package convert

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// Reporter receives byte progress. Workers call Add concurrently; it must be
// safe for that. internal/progress.Reporter satisfies it.
type Reporter interface {
	Total(n int64)
	Add(n int64)
}

// DefaultMaxShardSize is --max-shard-size's default, as transformers writes.
const DefaultMaxShardSize = 5_000_000_000

// DefaultJobs is how many shards are written at once by default.
const DefaultJobs = 4

// Options are one convert or fuse-shared run.
type Options struct {
	Src, Dst string
	Layout   layout.Layout // "" means stacked
	// Orientation of each expert matrix in the stacks ("" means out-in).
	Orientation layout.Orientation
	// orientationSet: Orientation was given, not defaulted (--layout
	// transformers refuses one the family's form contradicts).
	orientationSet bool
	// inTransformersForm: what is written is the form transformers 5
	// holds the family's experts in (Summary.TransformersForm).
	inTransformersForm bool
	// expertsModule: where --layout transformers puts the stacks
	// (family.TransformersForm.Module, Contract.ExpertsModule).
	expertsModule string

	FuseShared  bool   // fuse-shared: append the shared expert as extra experts
	TP          int    // tensor-parallel size the output is prepared for (0 means 1)
	Replicas    int    // R, shared replicas (0 means TP)
	FoldScaling string // auto, down or none; "" means auto for fuse-shared, none for convert
	// RequantizeShared (fuse-shared): where the shared expert is stored
	// unlike the routed experts (Kimi-K2: BF16 beside INT4), quantise it
	// into their format by the format's own rule (weightfmt/requant.go), so
	// that its fused slots are stored like the rest of the stack.
	RequantizeShared bool
	// DType ("" keeps quantised weights as they are): dequantise every
	// quantised weight of the source into BF16, F16 or F32 (dequant.go).
	DType safetensors.DType
	// Exclude are path.Match patterns of SRC's files (or folders) not to
	// copy: "original", "metal/*", "*.gguf". The weights and config.json
	// cannot be excluded; a pattern that names nothing is refused.
	Exclude []string

	// EP (0: one bank, no ranks): write the routed experts per rank for
	// EP expert-parallel groups, each expert's intermediate dimension cut
	// MoETP ways (0 means 1), ranks.go. The placement of each MoE layer's
	// slots is contiguous (Slots, 0 meaning E, slot p expert p mod E),
	// balanced from recorded loads (PlacementStats, with Slots), or read
	// from a placement file (PlacementMap).
	EP             int
	MoETP          int
	Slots          int
	PlacementStats string
	PlacementMap   string
	// Nodes (with PlacementStats; 0 means 1): the ranks are spread over
	// this many nodes, and the placement is hierarchical (whole expert
	// groups onto nodes) where the routing's n_group divides among them.
	Nodes int

	MaxShardSize int64            // 0 means DefaultMaxShardSize
	Jobs         int              // 0 means DefaultJobs
	Digest       layout.BlockAlgo // how shards are hashed in the manifest; 0 means layout.ShardBlockAlgo
	Force        bool             // replace an existing DST (and a stale DST.partial)
	Resume       bool             // continue from DST.partial
	BufferedIO   bool             // write shards through the page cache, not with O_DIRECT (directwrite.go)
	Progress     Reporter
	Tool         string // recorded in the contract, e.g. "moeprep v0.1.0"
	// Notice receives, once the source is planned, each remark on what
	// its config.json says and moeprep ignores (family.Plan.Notices);
	// nil: none is sent (Summary and Plan still carry them).
	Notice func(msg string)
}

// Summary is what a finished run reports (--json prints it).
type Summary struct {
	Dst string `json:"dst"`
	// Copied are SRC's files copied as they are, largest first; Excluded
	// those --exclude left out (both as Plan's).
	Copied   []CopiedFile `json:"copied"`
	Excluded []string     `json:"excluded_files,omitempty"`
	Layout   string       `json:"layout"`
	// TransformersForm: the experts are written in the form transformers 5
	// holds them in for this family (--layout transformers, or the layout
	// and orientation that form resolves to), with nothing fused, folded,
	// dequantised or split per rank: transformers loads it as SRC.
	TransformersForm bool `json:"transformers_form,omitempty"`
	// Orientation is "in-out" when the stacks are transposed; absent: out-in.
	Orientation      string  `json:"orientation,omitempty"`
	Files            int     `json:"files"`
	Shards           int     `json:"shards"`
	ReusedShards     int     `json:"reused_shards"`
	Bytes            int64   `json:"bytes"`
	Seconds          float64 `json:"seconds"`
	GBPerSec         float64 `json:"gb_per_s"`
	Folded           bool    `json:"routed_scaling_factor_folded"`
	FoldMaxRelChange float64 `json:"fold_max_rel_change"`
	FusedShared      int     `json:"num_fused_shared_experts"`
	// Ranks is N*M of a per-rank output (--ep); absent: one bank.
	Ranks int `json:"ranks,omitempty"`
	// SharedRequantized is the format the fused shared expert was
	// requantised into (--requantize-shared); "" when it was not.
	SharedRequantized string `json:"shared_requantized,omitempty"`
	// AlreadyComplete: --resume found DST complete, every file matching its
	// manifest and the contract this run would write; nothing was written.
	AlreadyComplete bool `json:"already_complete"`
	// Notices: what SRC's config.json says that moeprep ignores, as
	// transformers does (family.Plan.Notices).
	Notices []string `json:"notices,omitempty"`
	// DType and DequantizedTensors: with --dtype, the dtype the quantised
	// weights were dequantised into and how many were (absent without).
	DType              string `json:"dtype,omitempty"`
	DequantizedTensors int    `json:"dequantized_tensors,omitempty"`
}

// requantizedInto is the format c's shared expert was requantised into, ""
// when it was not.
func requantizedInto(c *layout.Contract) string {
	if c.SharedRequantized == nil {
		return ""
	}
	return c.SharedRequantized.Quantization
}

// ParseSize reads a size such as "5GB", "500MB", "1.5GiB" or "123456" (bytes).
// GB/MB/KB are powers of 1000 and GiB/MiB/KiB powers of 1024, as in transformers.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{
		{"TIB", 1 << 40}, {"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10},
		{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1},
	}
	mult := 1.0
	up := strings.ToUpper(t)
	for _, u := range units {
		if strings.HasSuffix(up, u.suffix) {
			mult = u.mult
			t = strings.TrimSpace(t[:len(t)-len(u.suffix)])
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 || v*mult > 1<<62 {
		return 0, fmt.Errorf("bad size %q (want e.g. 5GB, 500MB, 2GiB)", s)
	}
	return int64(v * mult), nil
}

// norm fills defaults and checks the options.
func (o *Options) norm() error {
	if o.Src == "" || o.Dst == "" {
		return fmt.Errorf("source and destination directories are required")
	}
	l, err := layout.Parse(string(o.Layout))
	if err != nil {
		return err
	}
	o.Layout = l
	o.orientationSet = o.Orientation != ""
	if o.Orientation, err = layout.ParseOrientation(string(o.Orientation)); err != nil {
		return err
	}
	if o.TP == 0 {
		o.TP = 1
	}
	if o.TP < 0 || o.TP > 1024 {
		return fmt.Errorf("--tp %d: want 1..1024", o.TP)
	}
	if err := o.normRanks(); err != nil {
		return err
	}
	if o.Replicas == 0 {
		o.Replicas = o.TP
	}
	if o.Replicas < 0 || o.Replicas > 1024 {
		return fmt.Errorf("--replicas %d: want 1..1024", o.Replicas)
	}
	if o.FoldScaling == "" {
		o.FoldScaling = layout.FoldNone
		if o.FuseShared {
			o.FoldScaling = layout.FoldAuto
		}
	}
	if o.RequantizeShared && !o.FuseShared {
		return fmt.Errorf("--requantize-shared applies to fuse-shared only: convert leaves the shared expert as it is")
	}
	switch o.FoldScaling {
	case layout.FoldAuto, layout.FoldDown, layout.FoldNone:
	default:
		return fmt.Errorf("--fold-scaling %q: want auto, down or none", o.FoldScaling)
	}
	if o.DType != "" && !weightfmt.Dequantisable(o.DType) {
		return fmt.Errorf("--dtype %s: want bf16, f16 or f32", strings.ToLower(string(o.DType)))
	}
	if o.MaxShardSize == 0 {
		o.MaxShardSize = DefaultMaxShardSize
	}
	if o.MaxShardSize < 0 {
		return fmt.Errorf("--max-shard-size %d: must be positive", o.MaxShardSize)
	}
	if o.Jobs == 0 {
		o.Jobs = DefaultJobs
	}
	if o.Jobs < 0 {
		return fmt.Errorf("--jobs %d: must be positive", o.Jobs)
	}
	if o.Digest == 0 {
		o.Digest = layout.ShardBlockAlgo
	}
	if o.Progress == nil {
		o.Progress = discard{}
	}
	return nil
}

type discard struct{}

func (discard) Total(int64) {}
func (discard) Add(int64)   {}
