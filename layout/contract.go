package layout

import (
	"encoding/json"
	"fmt"
	"math"
	"path"
	"reflect"
	"strings"

	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// ContractKey is the config.json key that holds the contract.
const ContractKey = "moeprep"

// ContractVersion is the version this package writes and reads.
const ContractVersion = 1

// ManifestFileName is the file, next to config.json, that lists every other
// output file with its size and sha256. It is a separate file because
// config.json cannot hold its own checksum; the manifest covers config.json.
const ManifestFileName = "moeprep-manifest.json"

// Fold modes of --fold-scaling.
const (
	FoldAuto = "auto"
	FoldDown = "down"
	FoldNone = "none"
)

// LayerInfo is one converted MoE layer. Its output tensor names are
// Contract.Names.
type LayerInfo struct {
	Index  int    `json:"index"`
	MTP    bool   `json:"mtp,omitempty"`
	Prefix string `json:"prefix"` // the MoE module in the source, e.g. "model.layers.3.mlp"
	// Bank is which routed bank of its decoder layer this is where the
	// layer has two (ERNIE-4.5-VL: "text", "vision"; Prefix is then the
	// bank's module, e.g. "model.layers.3.mlp.vision_moe", and a vision
	// bank's Index is its decoder layer's plus 65536); absent otherwise.
	Bank string `json:"bank,omitempty"`
	// Activation and SharedActivation are this layer's routed experts' and
	// shared MLP's activations where they differ from the contract's
	// (Step-3.7's per-layer swiglu_limits); absent: the contract's.
	Activation       *Activation `json:"activation,omitempty"`
	SharedActivation *Activation `json:"shared_activation,omitempty"`
}

// Contract is the "moeprep" object of a converted checkpoint's config.json.
type Contract struct {
	Version int    `json:"version"`
	Tool    string `json:"tool,omitempty"` // "moeprep <version>"
	Layout  Layout `json:"layout"`
	// Orientation of every expert matrix in the stacks: "in-out" ([in,
	// out] per expert, scale grids transposed with them); absent means
	// "out-in", nn.Linear's [out, in].
	Orientation Orientation `json:"orientation,omitempty"`
	// ExpertsModule is the module that holds the stacks, in place of the
	// last name of each layer's source MoE module, where convert --layout
	// transformers put them where transformers 5 holds them (Step-3.7:
	// "mlp" for the checkpoint's "moe"; Granite: "block_sparse_moe", kept);
	// absent: layout.ExpertsPrefix's rule.
	ExpertsModule string `json:"experts_module,omitempty"`
	SourceFormat  string `json:"source_format"` // "safetensors" or "torch"
	Family        string `json:"family"`

	NumExperts            int     `json:"num_experts"`              // routed experts E
	NumFusedSharedExperts int     `json:"num_fused_shared_experts"` // R*S, 0 when the shared expert was not fused
	SharedReplicas        int     `json:"shared_replicas"`          // R
	SharedSlices          int     `json:"shared_slices"`            // S
	SharedFirstID         int     `json:"shared_first_id"`          // E
	SharedSlotWeight      float64 `json:"shared_slot_weight"`       // 1.0 when folded, 1/rsf otherwise

	RoutedScalingFactor float64 `json:"routed_scaling_factor"` // the source's, unchanged
	// ExcludedFiles are SRC's files (slash-separated, relative to SRC)
	// that convert --exclude left out of DST on purpose; every other file
	// of SRC besides its weights is copied. Absent: none.
	ExcludedFiles []string `json:"excluded_files,omitempty"`
	// ZeroExperts is Z where the router also ranks Z zero-compute
	// identity experts (LongCat-Flash's zero_expert_num): a slot whose id
	// is E+z, past the bank, outputs its token's input, weighted and
	// scaled like any slot. Absent means none.
	ZeroExperts int `json:"zero_experts,omitempty"`
	// OutputScale multiplies the whole MoE output after the shared expert is
	// added (Cohere2 MoE's "average": 0.5). Absent means 1.
	OutputScale float64 `json:"output_scale,omitempty"`
	// RoutedInputScaled: the routing weight scales each routed expert's
	// input, E(w * x), not its output (Llama 4); the engine multiplies the
	// gathered rows by their slot weight before the grouped GEMM and sums
	// the slots unweighted. Absent means output scaling.
	RoutedInputScaled bool `json:"routed_input_scaled,omitempty"`
	// Activation of every expert; absent means SwiGLU, silu(gate) * up.
	Activation *Activation `json:"activation,omitempty"`
	// SharedActivation is the unfused shared MLP's where it differs from
	// the routed experts' (HY-V4: routed clamped, shared plain SwiGLU);
	// absent means Activation. A layer's own (LayerInfo) comes first.
	SharedActivation *Activation `json:"shared_activation,omitempty"`
	// ExpertBias: every expert has gate, up and down biases, stacked as
	// BiasNames says (gpt-oss).
	ExpertBias                bool    `json:"expert_bias,omitempty"`
	RoutedScalingFactorFolded bool    `json:"routed_scaling_factor_folded"`
	FoldMode                  string  `json:"fold_mode"`           // auto, down or none
	FoldMaxRelChange          float64 `json:"fold_max_rel_change"` // largest |folded - w*rsf| / |w*rsf| over folded values
	TP                        int     `json:"tp"`                  // --tp the run was prepared for

	WeightDType     string  `json:"weight_dtype"`                // safetensors dtype of the expert weights
	Quantization    string  `json:"quantization"`                // "none", "fp8_block_128x128", "fp8_channel" or "fp8_tensor"
	WeightBlockSize []int64 `json:"weight_block_size,omitempty"` // [bo, bi] for FP8 blocks
	// ScaleDType is the safetensors dtype of the scale tensors where the
	// format's producers differ in it (fp8_channel, fp8_tensor: BF16, F16
	// or F32; int4_pack; mxfp4 where not U8: DeepSeek-V4's F8_E8M0);
	// absent for formats whose scale dtype is fixed.
	ScaleDType string `json:"scale_dtype,omitempty"`
	// Naming is whose tensor names the stacks carry where the format's
	// producers differ in them and they are not the format's default
	// (mxfp4: "compressed-tensors", "deepseek"; absent: gpt-oss's).
	Naming string `json:"naming,omitempty"`
	// SharedQuantization and SharedWeightDType say how the shared expert,
	// left unfused (convert), is stored where it differs from the routed
	// experts: Kimi-K2's INT4 (or FP8 per-channel or per-tensor) routed
	// experts beside a BF16 shared expert ("none", "BF16"). Absent when it
	// is stored like them.
	// InputScales: the NVFP4 experts' static activation scales
	// (input_scale) are stacked beside the weights (ExpertTensors'
	// GateInput...), carried byte-exact and not read by validate.
	InputScales        bool   `json:"input_scales,omitempty"`
	SharedQuantization string `json:"shared_quantization,omitempty"`
	SharedWeightDType  string `json:"shared_weight_dtype,omitempty"`
	// SharedScaleDType and SharedNaming: an FP8 128x128 shared expert's
	// scale dtype and names where they are not transformers' F32
	// weight_scale_inv: DeepSeek-V4's official x.scale, F8_E8M0
	// ("F8_E8M0", "deepseek"). Absent otherwise.
	SharedScaleDType string `json:"shared_scale_dtype,omitempty"`
	SharedNaming     string `json:"shared_naming,omitempty"`
	// SharedWeightBlockSize: an FP8 shared expert's blocks where they are
	// not DeepSeek's 128x128 (DeepSeek-V4.1's [32, 32] beside its FP4
	// routed experts, whose own weight_block_size is MXFP4's). Absent
	// otherwise.
	SharedWeightBlockSize []int64 `json:"shared_weight_block_size,omitempty"`
	// SharedRequantized: the fused shared slots hold the shared expert
	// quantised by fuse-shared --requantize-shared from SRC's plain
	// weights into the routed experts' format, by that format's own rule.
	// Absent when the shared expert's bytes are SRC's.
	SharedRequantized *Requantization `json:"shared_requantized,omitempty"`
	// Dequantized: convert --dtype turned the checkpoint's quantised
	// weights into plain ones of Dequantized.DType (the experts' format
	// above is then "none" in that dtype); absent when it did not.
	Dequantized *Dequantized `json:"dequantized,omitempty"`

	Layers   []LayerInfo `json:"layers"`
	Manifest string      `json:"manifest"` // ManifestFileName
	// ExpertParallel: the routed experts are written per rank (--ep),
	// each rank's in files of its own (ranks.go); absent: one bank.
	ExpertParallel *ExpertParallel `json:"expert_parallel,omitempty"`
}

// Requantization is how fuse-shared --requantize-shared quantised the
// shared expert (weightfmt.RequantRule, requant.go): per scale block of the
// format, scale = amax / scale_divisor rounded once to the scale dtype, at
// least min_scale (and a power of two, rounded up, where
// scale_power_of_two); each code w / scale in float32, clamped to
// code_range and rounded to the nearest code, ties to even (rounding).
type Requantization struct {
	SourceDType     string     `json:"source_dtype"` // SRC's shared expert weights: BF16, F16 or F32
	Quantization    string     `json:"quantization"` // the format quantised into: the contract's quantization
	Rule            string     `json:"rule"`         // absmax-int4, absmax-e4m3
	ScaleDivisor    float64    `json:"scale_divisor"`
	MinScale        float64    `json:"min_scale"`
	ScalePowerOfTwo bool       `json:"scale_power_of_two,omitempty"`
	CodeRange       [2]float64 `json:"code_range"`
	Rounding        string     `json:"rounding"`
}

// NewRequantization is the record of a shared expert of dtype source
// quantised into format f by its own rule.
func NewRequantization(f weightfmt.Format, source safetensors.DType) (*Requantization, error) {
	r, err := weightfmt.Requantisable(f)
	if err != nil {
		return nil, err
	}
	rule := r.RequantRule()
	return &Requantization{SourceDType: string(source), Quantization: f.Quantization(), Rule: rule.Name, ScaleDivisor: rule.Divisor,
		MinScale: rule.MinScale, ScalePowerOfTwo: rule.PowerOfTwo, CodeRange: [2]float64{rule.Lo, rule.Hi}, Rounding: rule.Rounding}, nil
}

// checkRequantized: a requantised shared expert is fused, was plain, and
// follows the contract format's own rule, as NewRequantization records it.
func (c *Contract) checkRequantized() error {
	r := c.SharedRequantized
	if r == nil {
		return nil
	}
	if c.NumFusedSharedExperts == 0 {
		return fmt.Errorf("moeprep contract: shared_requantized without fused shared experts")
	}
	switch safetensors.DType(r.SourceDType) {
	case safetensors.BF16, safetensors.F16, safetensors.F32:
	default:
		return fmt.Errorf("moeprep contract: shared_requantized.source_dtype %q: want BF16, F16 or F32", r.SourceDType)
	}
	f, err := c.Format()
	if err != nil {
		return fmt.Errorf("moeprep contract: %v", err)
	}
	want, err := NewRequantization(f, safetensors.DType(r.SourceDType))
	if err != nil {
		return fmt.Errorf("moeprep contract: shared_requantized: %v", err)
	}
	if *r != *want {
		key, got, rule := firstFieldDiff(*r, *want)
		return fmt.Errorf("moeprep contract: shared_requantized.%s is %v, the %s rule's is %v", key, got, f, rule)
	}
	return nil
}

// firstFieldDiff names the first field (by its JSON key) in which two
// values of one struct type differ, with both values: a refusal names the
// key a reader can find in config.json, not a dump of the whole record.
func firstFieldDiff(a, b any) (key string, x, y any) {
	av, bv := reflect.ValueOf(a), reflect.ValueOf(b)
	for i := range av.NumField() {
		if fa, fb := av.Field(i).Interface(), bv.Field(i).Interface(); !reflect.DeepEqual(fa, fb) {
			key, _, _ = strings.Cut(av.Type().Field(i).Tag.Get("json"), ",")
			return key, fa, fb
		}
	}
	return "", a, b
}

// Dequantized records what convert --dtype did: every quantised weight of
// the source (the experts' and any other, such as DeepSeek's FP8
// attention) is stored as its exact float32 dequantisation rounded once to
// DType, under the plain name an unquantised checkpoint gives it, and its
// scale tensors (and input_scale) are gone.
type Dequantized struct {
	DType string `json:"dtype"` // BF16, F16 or F32
	// Rounding is weightfmt.RoundNearestEven (BF16, F16) or RoundExact (F32).
	Rounding string `json:"rounding"`
	// Groups say how each group of dequantised weights was stored in the
	// source: "experts" (the stacked routed experts, and fused shared
	// experts where quantised), "other" (every other quantised weight); a
	// group per source format where a mixed-format checkpoint stores them
	// in two (DeepSeek-V4: experts mxfp4, then experts fp8_block_128x128 for
	// a fused shared expert; other fp8_block_128x128), the routed experts'
	// format first.
	Groups []DequantGroup `json:"groups"`
	// InputScalesDropped: the source's weights had static activation
	// scales (input_scale), which the output does not carry.
	InputScalesDropped bool `json:"input_scales_dropped,omitempty"`
}

// Dequantized groups.
const (
	GroupExperts = "experts"
	GroupOther   = "other"
)

// DequantGroup is one group of dequantised weights: the source format (as
// the contract's own quantization fields describe a format) and how many
// source weights it dequantised.
type DequantGroup struct {
	Group           string  `json:"group"`
	Quantization    string  `json:"quantization"`
	WeightDType     string  `json:"weight_dtype"`
	WeightBlockSize []int64 `json:"weight_block_size,omitempty"`
	ScaleDType      string  `json:"scale_dtype,omitempty"`
	Naming          string  `json:"naming,omitempty"`
	Tensors         int     `json:"tensors"`
}

// FormatFields are a weight format as a contract records it: quantization,
// weight_dtype, weight_block_size (FP8 blocks, [1, group] for INT4,
// NVFP4 and MXFP4; absent for per channel or per tensor scales and plain
// weights) and scale_dtype (where the format's producers differ in it:
// FP8 per channel and per tensor, INT4).
func FormatFields(f weightfmt.Format) (quant, weightDType string, block []int64, scaleDType, naming string) {
	quant, weightDType = f.Quantization(), string(f.DType())
	if sc, ok := f.Scale(); ok {
		switch quant {
		case weightfmt.QuantFP8Channel, weightfmt.QuantFP8Tensor:
			scaleDType = string(sc.DType)
		case weightfmt.QuantInt4Pack:
			block, scaleDType = []int64{sc.Block[0], sc.Block[1]}, string(sc.DType)
		default:
			block = []int64{sc.Block[0], sc.Block[1]}
			// What else New needs to build the format again (MXFP4:
			// DeepSeek-V4's F8_E8M0 scales, a producer's names).
			sd, n := weightfmt.ContractSpec(f)
			scaleDType, naming = string(sd), n
		}
	}
	return quant, weightDType, block, scaleDType, naming
}

// NewDequantGroup is group's record of n weights dequantised from format f.
func NewDequantGroup(group string, f weightfmt.Format, n int) DequantGroup {
	g := DequantGroup{Group: group, Tensors: n}
	g.Quantization, g.WeightDType, g.WeightBlockSize, g.ScaleDType, g.Naming = FormatFields(f)
	return g
}

// Format is the source format the group records.
func (g DequantGroup) Format() (weightfmt.Format, error) {
	return weightfmt.New(weightfmt.Spec{Quantization: g.Quantization, DType: safetensors.DType(g.WeightDType), Block: g.WeightBlockSize,
		ScaleDType: safetensors.DType(g.ScaleDType), Naming: g.Naming})
}

// Group is the record of group ("experts", "other"); ok is false when
// nothing of it was dequantised.
func (d *Dequantized) Group(group string) (DequantGroup, bool) {
	for _, g := range d.Groups {
		if g.Group == group {
			return g, true
		}
	}
	return DequantGroup{}, false
}

// check verifies the record's internal consistency.
func (d *Dequantized) check() error {
	if !weightfmt.Dequantisable(safetensors.DType(d.DType)) {
		return fmt.Errorf("dequantized.dtype %q: want BF16, F16 or F32", d.DType)
	}
	if want := weightfmt.RoundingOf(safetensors.DType(d.DType)); d.Rounding != want {
		// name both keys: either may be the one that was changed
		return fmt.Errorf("dequantized.rounding %q with dequantized.dtype %s: dequantising to %s is %q", d.Rounding, d.DType, d.DType, want)
	}
	if len(d.Groups) == 0 {
		return fmt.Errorf("dequantized.groups is empty")
	}
	// each group at most once per source format (a mixed-format
	// checkpoint: DeepSeek-V4's fused FP8 shared expert beside the FP4
	// experts, ModelOpt MIXED_PRECISION's unfused NVFP4 shared expert beside
	// FP8 attention); the first experts group is the routed experts'.
	seen := map[string]bool{}
	for _, g := range d.Groups {
		key := fmt.Sprint(g.Group, g.Quantization, g.WeightDType, g.WeightBlockSize, g.ScaleDType, g.Naming)
		if g.Group != GroupExperts && g.Group != GroupOther || seen[key] {
			return fmt.Errorf("dequantized.groups: group %q (want experts and other, each at most once per source format)", g.Group)
		}
		seen[key] = true
		if g.Tensors <= 0 {
			return fmt.Errorf("dequantized.groups: %s has %d tensors", g.Group, g.Tensors)
		}
		f, err := g.Format()
		if err != nil {
			return fmt.Errorf("dequantized.groups: %s: %v", g.Group, err)
		}
		if _, scaled := f.Scale(); !scaled {
			return fmt.Errorf("dequantized.groups: %s was %s, not quantised", g.Group, f)
		}
	}
	return nil
}

// Quantized reports whether the expert weights carry scales.
func (c *Contract) Quantized() bool { return c.Quantization != "" && c.Quantization != "none" }

// scaleDTyped reports whether the contract's format records its scale
// dtype (scale_dtype).
func (c *Contract) scaleDTyped() bool {
	return c.Quantization == weightfmt.QuantFP8Channel || c.Quantization == weightfmt.QuantFP8Tensor || c.int4()
}

// int4 reports whether the routed experts are pack-quantized INT4, whose
// weight_block_size is [1, group size] ([1, 0]: one scale per row) and
// whose scale_dtype is recorded too.
func (c *Contract) int4() bool { return c.Quantization == weightfmt.QuantInt4Pack }

// SharedFormat is how an unfused shared expert is stored: Format, unless
// shared_quantization says otherwise.
func (c *Contract) SharedFormat() (weightfmt.Format, error) {
	if c.SharedQuantization == "" {
		return c.Format()
	}
	return weightfmt.New(weightfmt.Spec{Quantization: c.SharedQuantization, DType: safetensors.DType(c.SharedWeightDType),
		ScaleDType: safetensors.DType(c.SharedScaleDType), Naming: c.SharedNaming, Block: c.SharedWeightBlockSize})
}

// RuntimeScale is what a serving engine multiplies the routed sum by: rsf when
// not folded, 1 when folded into the weights.
func (c *Contract) RuntimeScale() float64 {
	if c.RoutedScalingFactorFolded {
		return 1
	}
	return c.RoutedScalingFactor
}

// Output is OutputScale, 1 when absent.
func (c *Contract) Output() float64 {
	if c.OutputScale == 0 {
		return 1
	}
	return c.OutputScale
}

// Format is how the expert weights are stored: quantization, weight_dtype,
// weight_block_size and scale_dtype.
func (c *Contract) Format() (weightfmt.Format, error) {
	return weightfmt.New(weightfmt.Spec{Quantization: c.Quantization, DType: safetensors.DType(c.WeightDType), Block: c.WeightBlockSize,
		ScaleDType: safetensors.DType(c.ScaleDType), Naming: c.Naming})
}

// Oriented is the stacks' orientation, OutIn when absent.
func (c *Contract) Oriented() Orientation {
	if c.Orientation == "" {
		return OutIn
	}
	return c.Orientation
}

// Shapes are layer stacks' shapes for this contract: a bank of n experts of
// intermediate I and hidden H, in its layout, format and orientation.
func (c *Contract) Shapes(n, I, H int64) Shapes {
	f, _ := c.Format() // Check refuses a contract without one
	return StackShapesFor(c.Layout, n, I, H, f).Oriented(c.Oriented())
}

// Names gives layer li's output tensor names.
func (c *Contract) Names(li LayerInfo) ExpertTensors {
	f, _ := c.Format() // Check refuses a contract without one; nil names no scales
	t := NamesIn(c.Layout, li.Prefix, c.ExpertsModule, f)
	if c.RoutedAct(li).Ungated() {
		t = t.Ungated()
	}
	return t
}

// BankSize is the number of experts in each stack: E + R*S.
func (c *Contract) BankSize() int { return c.NumExperts + c.NumFusedSharedExperts }

// AlignExperts is how many expert ids the gate's slots may name: the bank
// and, past it, the zero-compute experts (which the grouped GEMM leaves
// alone, as another rank's, and IdentityRows fills).
func (c *Contract) AlignExperts() int { return c.BankSize() + c.ZeroExperts }

// Check verifies the contract's internal consistency.
func (c *Contract) Check() error {
	if err := checkExcluded(c.ExcludedFiles); err != nil {
		return err
	}
	switch {
	case c.Version != ContractVersion:
		return fmt.Errorf("moeprep contract version %d, this moeprep reads version %d", c.Version, ContractVersion)
	case c.Layout != Stacked && c.Layout != GateUp && c.Layout != UpGate && c.Layout != AsStored:
		return fmt.Errorf("moeprep contract: unknown layout %q", c.Layout)
	case c.ExpertsModule != "" && (!c.Layout.Fused() || !PlainName(c.ExpertsModule)):
		return fmt.Errorf("moeprep contract: experts_module %q with layout %s, want one module name with a fused layout", c.ExpertsModule, c.Layout)
	case c.NumExperts <= 0:
		return fmt.Errorf("moeprep contract: num_experts %d", c.NumExperts)
	case c.NumFusedSharedExperts < 0 || c.SharedReplicas < 0 || c.SharedSlices < 0:
		return fmt.Errorf("moeprep contract: negative shared expert counts")
	case c.NumFusedSharedExperts != c.SharedReplicas*c.SharedSlices:
		return fmt.Errorf("moeprep contract: num_fused_shared_experts %d != shared_replicas %d * shared_slices %d", c.NumFusedSharedExperts, c.SharedReplicas, c.SharedSlices)
	case c.ZeroExperts < 0 || c.ZeroExperts > 1<<20:
		return fmt.Errorf("moeprep contract: zero_experts %d", c.ZeroExperts)
	case c.ZeroExperts > 0 && (c.NumFusedSharedExperts > 0 || c.RoutedScalingFactorFolded):
		// their ids would be the fused shared slots', and a folded rsf has
		// no down projection to ride in for them
		return fmt.Errorf("moeprep contract: zero_experts %d with fused shared experts or a folded routed_scaling_factor", c.ZeroExperts)
	case c.NumFusedSharedExperts > 0 && c.SharedFirstID != c.NumExperts:
		return fmt.Errorf("moeprep contract: shared_first_id %d != num_experts %d", c.SharedFirstID, c.NumExperts)
	case math.IsNaN(c.SharedSlotWeight) || c.SharedSlotWeight <= 0:
		return fmt.Errorf("moeprep contract: shared_slot_weight %v", c.SharedSlotWeight)
	case math.IsNaN(c.OutputScale) || math.IsInf(c.OutputScale, 0) || c.OutputScale < 0:
		return fmt.Errorf("moeprep contract: output_scale %v", c.OutputScale)
	case c.Activation != nil && c.Activation.Check() != nil:
		return fmt.Errorf("moeprep contract: %v", c.Activation.Check())
	case c.SharedActivation != nil && c.SharedActivation.Check() != nil:
		return fmt.Errorf("moeprep contract: shared_activation: %v", c.SharedActivation.Check())
	case c.Quantized() && !c.scaleDTyped() && len(c.WeightBlockSize) != 2:
		return fmt.Errorf("moeprep contract: weight_block_size %v, want [rows, cols]", c.WeightBlockSize)
	case c.int4() && (len(c.WeightBlockSize) != 2 || c.WeightBlockSize[0] != 1 || c.WeightBlockSize[1] < 0):
		return fmt.Errorf("moeprep contract: weight_block_size %v with quantization %s, want [1, group size] or [1, 0]", c.WeightBlockSize, c.Quantization)
	case c.scaleDTyped() && !c.int4() && len(c.WeightBlockSize) != 0:
		return fmt.Errorf("moeprep contract: weight_block_size %v with quantization %s, which has none", c.WeightBlockSize, c.Quantization)
	case c.scaleDTyped() && c.ScaleDType == "":
		return fmt.Errorf("moeprep contract: quantization %s without scale_dtype", c.Quantization)
	case !c.scaleDTyped() && c.ScaleDType != "" && c.Quantization != weightfmt.QuantMXFP4:
		return fmt.Errorf("moeprep contract: scale_dtype %s with quantization %s, whose scale dtype is fixed", c.ScaleDType, c.Quantization)
	case c.Orientation != "" && c.Orientation != OutIn && c.Orientation != InOut:
		return fmt.Errorf("moeprep contract: unknown orientation %q", c.Orientation)
	case (c.SharedQuantization == "") != (c.SharedWeightDType == ""):
		return fmt.Errorf("moeprep contract: shared_quantization %q and shared_weight_dtype %q: both or neither", c.SharedQuantization, c.SharedWeightDType)
	case c.SharedQuantization == "" && (c.SharedScaleDType != "" || c.SharedNaming != ""):
		return fmt.Errorf("moeprep contract: shared_scale_dtype %q, shared_naming %q without shared_quantization", c.SharedScaleDType, c.SharedNaming)
	case len(c.SharedWeightBlockSize) != 0 && c.SharedQuantization != weightfmt.QuantFP8Block:
		return fmt.Errorf("moeprep contract: shared_weight_block_size %v with shared_quantization %q: only an FP8 block-scaled shared expert has blocks", c.SharedWeightBlockSize, c.SharedQuantization)
	case c.SharedQuantization != "" && c.NumFusedSharedExperts > 0:
		return fmt.Errorf("moeprep contract: shared_quantization %s with fused shared experts, which are stored like the routed ones", c.SharedQuantization)
	}
	if err := c.checkRequantized(); err != nil {
		return err
	}
	if c.ExpertParallel != nil {
		if err := c.ExpertParallel.check(c.NumExperts, len(c.Layers)); err != nil {
			return err
		}
	}
	if err := c.checkLayerActs(); err != nil {
		return err
	}
	if c.Dequantized != nil {
		switch err := c.Dequantized.check(); {
		case err != nil:
			return fmt.Errorf("moeprep contract: %v", err)
		case c.Quantized() || c.WeightDType != c.Dequantized.DType:
			return fmt.Errorf("moeprep contract: quantization %s, weight_dtype %s with dequantized.dtype %s: dequantised experts are quantization none of that dtype", c.Quantization, c.WeightDType, c.Dequantized.DType)
		}
	}
	if c.SharedQuantization != "" {
		if _, err := c.SharedFormat(); err != nil {
			return fmt.Errorf("moeprep contract: shared expert: %v", err)
		}
	}
	for _, b := range c.WeightBlockSize {
		if b <= 0 && !c.int4() {
			return fmt.Errorf("moeprep contract: weight_block_size %v", c.WeightBlockSize)
		}
	}
	f, err := c.Format()
	if err != nil {
		return fmt.Errorf("moeprep contract: %v", err)
	}
	if why := TransposeRefusal(f); c.Oriented() == InOut && why != "" {
		return fmt.Errorf("moeprep contract: orientation in-out, but %s", why)
	}
	return nil
}

// InvalidContractError is a contract that decodes, in this version, but
// breaks the contract's rules (Check): what holds it is not what moeprep
// writes. validate reports it as a DST that fails its check (exit 1), not
// as input it cannot read; its text is Err's.
type InvalidContractError struct{ Err error }

func (e *InvalidContractError) Error() string { return e.Err.Error() }
func (e *InvalidContractError) Unwrap() error { return e.Err }

// ReadContract extracts the contract from a decoded config.json. ok is false
// (and err nil) when config has no "moeprep" object. A contract that does
// not decode, or is of another version, is a plain error (unreadable
// here); one that decodes and breaks the rules is an *InvalidContractError.
func ReadContract(config map[string]any) (*Contract, bool, error) {
	raw, ok := config[ContractKey]
	if !ok {
		return nil, false, nil
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, true, fmt.Errorf("moeprep contract: %v", err)
	}
	var c Contract
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, true, fmt.Errorf("moeprep contract: %v", err)
	}
	if err := c.Check(); err != nil {
		if c.Version != ContractVersion {
			return nil, true, err // another moeprep's output, not a wrong one
		}
		return nil, true, &InvalidContractError{err}
	}
	return &c, true, nil
}

// Act is the experts' activation, SwiGLU when absent.
func (c *Contract) Act() Activation {
	if c.Activation == nil {
		return Activation{}
	}
	return *c.Activation
}

// RoutedAct is layer li's routed experts' activation (fused shared slots
// included: fuse-shared refuses shared MLPs that differ).
func (c *Contract) RoutedAct(li LayerInfo) Activation {
	if li.Activation != nil {
		return *li.Activation
	}
	return c.Act()
}

// SharedAct is layer li's unfused shared MLP's activation.
func (c *Contract) SharedAct(li LayerInfo) Activation {
	switch {
	case li.SharedActivation != nil:
		return *li.SharedActivation
	case c.SharedActivation != nil:
		return *c.SharedActivation
	}
	return c.RoutedAct(li)
}

// LayerActs reports whether some layer's activations differ from the
// contract-wide ones, or the shared MLP's from the routed experts'.
func (c *Contract) LayerActs() bool {
	if c.SharedActivation != nil {
		return true
	}
	for _, li := range c.Layers {
		if li.Activation != nil || li.SharedActivation != nil {
			return true
		}
	}
	return false
}

func (c *Contract) checkLayerActs() error {
	for _, li := range c.Layers {
		for _, a := range []*Activation{li.Activation, li.SharedActivation} {
			if a == nil {
				continue
			}
			if err := a.Check(); err != nil {
				return fmt.Errorf("moeprep contract: layer %d: %v", li.Index, err)
			}
		}
	}
	for _, li := range append([]LayerInfo{{Index: -1}}, c.Layers...) {
		if c.RoutedAct(li).Ungated() && c.Layout.Fused() {
			// no gate rows to put beside the up rows
			return fmt.Errorf("moeprep contract: layout %s with ungated experts (activation %s), whose stacks are all_up and all_down", c.Layout, c.RoutedAct(li).Describe())
		}
		if c.RoutedAct(li).Ungated() && c.ExpertBias {
			return fmt.Errorf("moeprep contract: expert biases with ungated experts (activation %s)", c.RoutedAct(li).Describe())
		}
	}
	if c.NumFusedSharedExperts > 0 && c.LayerActs() {
		for _, li := range c.Layers {
			if c.SharedAct(li) != c.RoutedAct(li) {
				return fmt.Errorf("moeprep contract: layer %d: fused shared experts with an activation of their own (%+v, routed %+v)", li.Index, c.SharedAct(li), c.RoutedAct(li))
			}
		}
	}
	return nil
}

// Biases names layer li's bias stacks; ok is false when the experts have none.
func (c *Contract) Biases(li LayerInfo) (ExpertBiases, bool) {
	if !c.ExpertBias {
		return ExpertBiases{}, false
	}
	return BiasNamesIn(c.Layout, li.Prefix, c.ExpertsModule), true
}

// maxExcludedFiles bounds excluded_files as the manifest bounds its files.
const maxExcludedFiles = 262144

// checkExcluded: excluded_files are plain relative paths inside SRC,
// sorted, each once, bounded in count.
func checkExcluded(files []string) error {
	if len(files) > maxExcludedFiles {
		return fmt.Errorf("moeprep contract: excluded_files has %d entries, over the limit of %d", len(files), maxExcludedFiles)
	}
	for i, f := range files {
		if f == "" || path.IsAbs(f) || path.Clean(f) != f || f == "." || strings.HasPrefix(f, "../") || f == ".." || strings.Contains(f, "\\") {
			return fmt.Errorf("moeprep contract: excluded_files[%d] %q is not a plain relative path", i, f)
		}
		if i > 0 && files[i-1] >= f {
			return fmt.Errorf("moeprep contract: excluded_files is not sorted and unique at %q", f)
		}
	}
	return nil
}

// PlainName reports whether s is one plain Python name (a module or a
// class): ASCII letters, digits and underscores, at most 128 of them, so
// it can be printed in a command or joined into a tensor name as it is.
func PlainName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}
