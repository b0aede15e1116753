package layout

import (
	"encoding/json"
	"fmt"
	"math"

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
}

// Contract is the "moeprep" object of a converted checkpoint's config.json.
type Contract struct {
	Version int    `json:"version"`
	Tool    string `json:"tool,omitempty"` // "moeprep <version>"
	Layout  Layout `json:"layout"`
	// Orientation of every expert matrix in the stacks: "in-out" ([in,
	// out] per expert, scale grids transposed with them); absent means
	// "out-in", nn.Linear's [out, in].
	Orientation  Orientation `json:"orientation,omitempty"`
	SourceFormat string      `json:"source_format"` // "safetensors" or "torch"
	Family       string      `json:"family"`

	NumExperts            int     `json:"num_experts"`              // routed experts E
	NumFusedSharedExperts int     `json:"num_fused_shared_experts"` // R*S, 0 when the shared expert was not fused
	SharedReplicas        int     `json:"shared_replicas"`          // R
	SharedSlices          int     `json:"shared_slices"`            // S
	SharedFirstID         int     `json:"shared_first_id"`          // E
	SharedSlotWeight      float64 `json:"shared_slot_weight"`       // 1.0 when folded, 1/rsf otherwise

	RoutedScalingFactor float64 `json:"routed_scaling_factor"` // the source's, unchanged
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
	// or F32); absent for formats whose scale dtype is fixed.
	ScaleDType string `json:"scale_dtype,omitempty"`
	// SharedQuantization and SharedWeightDType say how the shared expert,
	// left unfused (convert), is stored where it differs from the routed
	// experts: Kimi-K2's INT4 routed experts beside a BF16 shared expert
	// ("none", "BF16"). Absent when it is stored like them.
	// InputScales: the NVFP4 experts' static activation scales
	// (input_scale) are stacked beside the weights (ExpertTensors'
	// GateInput...), carried byte-exact and not read by validate.
	InputScales        bool   `json:"input_scales,omitempty"`
	SharedQuantization string `json:"shared_quantization,omitempty"`
	SharedWeightDType  string `json:"shared_weight_dtype,omitempty"`

	Layers   []LayerInfo `json:"layers"`
	Manifest string      `json:"manifest"` // ManifestFileName
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
	return weightfmt.New(weightfmt.Spec{Quantization: c.SharedQuantization, DType: safetensors.DType(c.SharedWeightDType)})
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
		ScaleDType: safetensors.DType(c.ScaleDType)})
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
	return NamesFor(c.Layout, li.Prefix, f)
}

// BankSize is the number of experts in each stack: E + R*S.
func (c *Contract) BankSize() int { return c.NumExperts + c.NumFusedSharedExperts }

// Check verifies the contract's internal consistency.
func (c *Contract) Check() error {
	switch {
	case c.Version != ContractVersion:
		return fmt.Errorf("moeprep contract version %d, this moeprep reads version %d", c.Version, ContractVersion)
	case c.Layout != Stacked && c.Layout != GateUp && c.Layout != UpGate:
		return fmt.Errorf("moeprep contract: unknown layout %q", c.Layout)
	case c.NumExperts <= 0:
		return fmt.Errorf("moeprep contract: num_experts %d", c.NumExperts)
	case c.NumFusedSharedExperts < 0 || c.SharedReplicas < 0 || c.SharedSlices < 0:
		return fmt.Errorf("moeprep contract: negative shared expert counts")
	case c.NumFusedSharedExperts != c.SharedReplicas*c.SharedSlices:
		return fmt.Errorf("moeprep contract: num_fused_shared_experts %d != shared_replicas %d * shared_slices %d", c.NumFusedSharedExperts, c.SharedReplicas, c.SharedSlices)
	case c.NumFusedSharedExperts > 0 && c.SharedFirstID != c.NumExperts:
		return fmt.Errorf("moeprep contract: shared_first_id %d != num_experts %d", c.SharedFirstID, c.NumExperts)
	case math.IsNaN(c.SharedSlotWeight) || c.SharedSlotWeight <= 0:
		return fmt.Errorf("moeprep contract: shared_slot_weight %v", c.SharedSlotWeight)
	case math.IsNaN(c.OutputScale) || math.IsInf(c.OutputScale, 0) || c.OutputScale < 0:
		return fmt.Errorf("moeprep contract: output_scale %v", c.OutputScale)
	case c.Activation != nil && c.Activation.Check() != nil:
		return fmt.Errorf("moeprep contract: %v", c.Activation.Check())
	case c.Quantized() && !c.scaleDTyped() && len(c.WeightBlockSize) != 2:
		return fmt.Errorf("moeprep contract: weight_block_size %v, want [rows, cols]", c.WeightBlockSize)
	case c.int4() && (len(c.WeightBlockSize) != 2 || c.WeightBlockSize[0] != 1 || c.WeightBlockSize[1] < 0):
		return fmt.Errorf("moeprep contract: weight_block_size %v with quantization %s, want [1, group size] or [1, 0]", c.WeightBlockSize, c.Quantization)
	case c.scaleDTyped() && !c.int4() && len(c.WeightBlockSize) != 0:
		return fmt.Errorf("moeprep contract: weight_block_size %v with quantization %s, which has none", c.WeightBlockSize, c.Quantization)
	case c.scaleDTyped() && c.ScaleDType == "":
		return fmt.Errorf("moeprep contract: quantization %s without scale_dtype", c.Quantization)
	case !c.scaleDTyped() && c.ScaleDType != "":
		return fmt.Errorf("moeprep contract: scale_dtype %s with quantization %s, whose scale dtype is fixed", c.ScaleDType, c.Quantization)
	case c.Orientation != "" && c.Orientation != OutIn && c.Orientation != InOut:
		return fmt.Errorf("moeprep contract: unknown orientation %q", c.Orientation)
	case (c.SharedQuantization == "") != (c.SharedWeightDType == ""):
		return fmt.Errorf("moeprep contract: shared_quantization %q and shared_weight_dtype %q: both or neither", c.SharedQuantization, c.SharedWeightDType)
	case c.SharedQuantization != "" && c.NumFusedSharedExperts > 0:
		return fmt.Errorf("moeprep contract: shared_quantization %s with fused shared experts, which are stored like the routed ones", c.SharedQuantization)
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

// ReadContract extracts the contract from a decoded config.json. ok is false
// (and err nil) when config has no "moeprep" object.
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
		return nil, true, err
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

// Biases names layer li's bias stacks; ok is false when the experts have none.
func (c *Contract) Biases(li LayerInfo) (ExpertBiases, bool) {
	if !c.ExpertBias {
		return ExpertBiases{}, false
	}
	return BiasNames(c.Layout, li.Prefix), true
}
