// Package family knows the MoE model families moeprep supports. Each family
// lives in its own file and turns a config.json plus the checkpoint's tensor
// names into a Plan: the MoE hyper-parameters and, for every MoE layer, the
// exact tensor names of its router, routed experts and shared expert.
package family

import (
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/quantdesc"
	"github.com/moeprep/moeprep/safetensors"
)

// Quantization of the expert weights.
type Quantization string

const (
	QuantNone     Quantization = "none"
	QuantFP8Block Quantization = "fp8_block_128x128" // F8_E4M3 with F32 weight_scale_inv per 128x128 block
	// F8_E4M3 with a weight_scale per output row [out,1] (compressed-tensors
	// float-quantized, strategy channel) or one per weight (strategy
	// tensor; quant_method fp8 without weight_block_size), of
	// Plan.ScaleDType.
	QuantFP8Channel Quantization = "fp8_channel"
	QuantFP8Tensor  Quantization = "fp8_tensor"
	// compressed-tensors pack-quantized INT4 (W4A16, symmetric): I32
	// weight_packed [out, in/8], weight_scale [out, in/group] of
	// Plan.ScaleDType (Plan.GroupSize; 0: one per row), I64 weight_shape [2].
	QuantInt4Pack Quantization = "int4_pack"
	// ModelOpt NVFP4 (W4A4: NVIDIA's DeepSeek-R1-FP4, DeepSeek-V3.2-NVFP4):
	// U8 weight [out, in/2] (E2M1, even element in the low nibble),
	// F8_E4M3 weight_scale [out, in/16], F32 weight_scale_2 (a scalar
	// multiplier) and F32 input_scale (the static activation scale, carried
	// byte-exact, not read).
	QuantNVFP4 Quantization = "nvfp4_modelopt"
	// compressed-tensors nvfp4-pack-quantized (RedHat / llm-compressor
	// NVFP4 and NVFP4A16): U8 weight_packed [out, in/2], F8_E4M3
	// weight_scale [out, in/16], F32 weight_global_scale [1] (a divisor,
	// the reciprocal of ModelOpt's weight_scale_2) and, W4A4, F32
	// input_global_scale [1] (carried byte-exact, not read).
	QuantNVFP4CT Quantization = "nvfp4_ct"
	// gpt-oss's MXFP4 (quant_method mxfp4): U8 E2M1 pairs with a U8 E8M0
	// scale per 32 input columns, experts stacked on disk as
	// *_blocks [E, rows, cols/32, 16] and *_scales [E, rows, cols/32].
	QuantMXFP4 Quantization = "mxfp4"
	// MXFP8 (ModelOpt quant_algo MXFP8; quant_method mxfp8, MiniMax-M3):
	// F8_E4M3 weight [out, in] with a U8 E8M0 scale per 32 input columns,
	// [out, in/32], named x.weight_scale (ModelOpt) or x.weight_scale_inv
	// (Plan.Naming NamingMiniMax), per expert.
	QuantMXFP8 Quantization = "mxfp8"
)

// MLP names the tensors of one SwiGLU MLP (a routed expert or a shared
// expert): E(x) = Down(silu(Gate x) * Up x). Scale names are empty unless the
// weights are FP8 block-quantised.
type MLP struct {
	// The source tensors by projection (ProjGate, ProjUp, ProjDown; never
	// ProjGateUp) and role. RoleBias: per-expert biases, [I] for gate and
	// up and [H] for down (gpt-oss). RoleShape: compressed-tensors'
	// weight_shape I64 [2] tensors of packed weights (int4_pack); convert
	// checks and drops them: the contract states every expert's [out, in].
	// RoleGlobal: the per-tensor second scale of an NVFP4 weight
	// (weight_scale_2 or weight_global_scale, F32 scalar); RoleInput: its
	// static activation scale (input_scale or input_global_scale, F32
	// scalar). "" where there is none.
	layout.Tensors
}

// MLPOf is the MLP of three weights and no other tensor.
func MLPOf(gate, up, down string) MLP {
	var m MLP
	m.Set(layout.ProjGate, layout.RoleWeight, gate)
	m.Set(layout.ProjUp, layout.RoleWeight, up)
	m.Set(layout.ProjDown, layout.RoleWeight, down)
	return m
}

// Ungated reports whether the MLP has no gate projection (Nemotron-H's
// experts and shared MLP: up and down only, relu2).
func (m MLP) Ungated() bool {
	return m.Weight(layout.ProjGate) == "" && m.Weight(layout.ProjUp) != ""
}

// First is the MLP's first projection, whose rows are its intermediate
// size: the gate, or the up projection of an ungated MLP.
func (m MLP) First() string {
	if g := m.Weight(layout.ProjGate); g != "" {
		return g
	}
	return m.Weight(layout.ProjUp)
}

// Layer is one MoE layer of the checkpoint.
type Layer struct {
	Index      int    // decoder layer index (>= NumHiddenLayers for MTP layers)
	MTP        bool   // a multi-token-prediction layer
	Prefix     string // the MoE module, e.g. "model.layers.3.mlp"
	Router     string // router weight [E,H]
	RouterBias string // e_score_correction_bias [E] (F32), "" if none
	// RouterLogitBias is the router's own bias [E], added to its logits
	// before top-k and the weights (gpt-oss), unlike a correction bias,
	// which only steers the choice. "" if none.
	RouterLogitBias string
	// HashTable is a hash-routed layer's token-to-experts table [vocab, k]
	// (DeepSeek-V4's gate.tid2eid, int64): the experts of a token are
	// table[token id], not a top-k of its scores, which only weight them.
	// "" for a routed layer.
	HashTable  string
	Experts    []MLP  // routed experts, index = expert id
	Shared     *MLP   // nil when the family has no shared expert
	SharedGate string // per-token shared-expert gate [1,H] (Qwen2-MoE), "" if none
	// SharedExperts are the shared experts of a layer whose router weights
	// them (Plan.SharedRouted, Inkling), each of MoEIntermediateSize, in
	// the order of the router's shared rows. Shared is nil then.
	SharedExperts []MLP
	// RouterScale is a scalar tensor [1] the routing weights are multiplied
	// by, shared slots included (Inkling's gate.global_scale), "" if none.
	RouterScale string
	// ExpertScale [E] multiplies each routing weight by its expert's entry
	// after the top-k and its renormalisation (Gemma 4's
	// router.per_expert_scale), "" if none.
	ExpertScale string
	// The layer's two inputs (Gemma 4), "" if the router and the experts
	// both read the layer's input x as it is. RouterInputScale [H]: the
	// router reads rmsnorm(x) * RouterInputScale * H^-1/2 (router.scale,
	// its RMSNorm without a weight); ExpertInputNorm [H]: the experts read
	// rmsnorm(x) * ExpertInputNorm (pre_feedforward_layernorm_2.weight).
	// Both norms take Plan.InputNormEps. x is then the residual stream.
	RouterInputScale, ExpertInputNorm string
	// LatentDown [L,H], LatentNorm [L] and LatentUp [H,L]: a latent MoE's
	// projections around the routed experts (Plan.Latent: the experts run
	// on LatentDown(x), their sum passes LatentNorm's RMSNorm, where it has
	// one, and LatentUp); "" otherwise. Carried byte for byte.
	LatentDown, LatentNorm, LatentUp string
	// Bank is the routed bank this layer is, where a decoder layer holds
	// more than one (ERNIE-4.5-VL's BankText and BankVision, two Layers of
	// one Index); NoBank where it holds one. Key is the index the written
	// forms use for both.
	Bank Bank
	// Intermediate is the layer's routed experts' width where it is not
	// Plan.MoEIntermediateSize (ERNIE-4.5-VL's vision bank); 0 otherwise.
	Intermediate int
	// PostNorm [H] is the RMSNorm weight the module transformers calls the
	// MoE block applies to the planned sum before returning it (A.X-K1's
	// post_mlp_layernorm, stored at the decoder layer and carried byte for
	// byte), "" if none: see Plan.ModuleOutput.
	PostNorm string
}

// InputTensors are the layer's tensors that shape its routing weights and
// inputs beyond the router (ExpertScale, RouterInputScale,
// ExpertInputNorm), the empty ones left out.
func (l *Layer) InputTensors() []string {
	var out []string
	for _, n := range []string{l.ExpertScale, l.RouterInputScale, l.ExpertInputNorm} {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

// ModuleOutput is what the module transformers 5.17 calls a layer's MoE
// block (the decoder layer's mlp, block_sparse_moe, feed_forward, mixer,
// ...) returns, against the sum moeprep plans: routed experts plus any
// shared expert, before anything the decoder layer does after.
type ModuleOutput int

const (
	// ModuleSum: the module returns the planned sum (most families).
	ModuleSum ModuleOutput = iota
	// ModulePostNorm: the module returns RMSNorm(sum) * Layer.PostNorm,
	// with Plan.PostNormEps (A.X-K1's AXK1MoE ends in post_mlp_layernorm).
	ModulePostNorm
	// ModuleRouted: the module returns the routed part alone; the decoder
	// layer adds Layer.Shared beside it (Granite's shared_mlp).
	ModuleRouted
)

// String names the point in reports and errors.
func (m ModuleOutput) String() string {
	switch m {
	case ModulePostNorm:
		return "the post-norm of the sum (RMSNorm(routed + shared) * post norm)"
	case ModuleRouted:
		return "the routed part (the decoder layer adds the shared MLP outside the module)"
	}
	return "the sum (routed + shared)"
}

// Plan is everything moeprep needs to know about a checkpoint's MoE layers.
type Plan struct {
	Family                 string // registered family name, e.g. "deepseek"
	ModelType              string // config.json model_type
	HiddenSize             int
	MoEIntermediateSize    int  // I of one routed expert
	NumExperts             int  // routed experts E
	NumSharedExperts       int  // S shared experts (0: none); DeepSeek's shared MLP has intermediate S*I
	SharedIntermediateSize int  // intermediate size of the whole shared MLP (Qwen2-MoE: its own key)
	SharedGated            bool // Qwen2-MoE's per-token sigmoid gate
	// SharedRouted: the router has NumSharedExperts more rows, after the E
	// routed ones, for the shared experts (Inkling). The routed experts are
	// chosen by sigmoid + correction bias as DeepSeek-V3's, but the weights
	// are one normalisation of the sigmoids of the k chosen and the S shared
	// logits, so each shared expert is weighted per token by its share
	// (times RoutedScalingFactor and the layer's RouterScale).
	SharedRouted bool
	// ZeroExperts Z: the router has Z more rows, after the E routed ones,
	// for zero-compute identity experts ranked with the routed ones
	// (LongCat-Flash's zero_expert_num): a token's slot on one returns its
	// input times its weight. Their correction bias entries follow the
	// routed ones'.
	ZeroExperts int
	TopK        int
	TopKMethod  moe.TopKMethod
	NGroup      int // 1 when the family has no grouping
	TopKGroup   int
	Scoring     moe.Scoring
	// JitterEps is sparsemixer's mask threshold (router_jitter_noise): an
	// expert takes part in a slot's softmax only when its logit is within
	// 2*JitterEps (relative) of that slot's winner.
	JitterEps           float64
	NormTopKProb        bool
	RoutedScalingFactor float64 // 1 when the family has none
	// OutputScale multiplies the whole MoE output, routed sum and shared
	// expert together: Cohere2 MoE's "average" strategy is (routed +
	// shared) / 2. 0 or 1 when the family has none.
	OutputScale float64
	// RoutedInputScaled: the routing weight scales each routed expert's
	// input, E_j(w_j * x), instead of its output (Llama 4). The weights are
	// then not multiplied into the routed sum.
	RoutedInputScaled bool
	// Act is the experts' gated activation (zero: SwiGLU); ExpertBias: the
	// experts have biases (gpt-oss's clamped SwiGLU with biases).
	Act layout.Activation
	// SharedAct is the shared MLP's activation where it differs from the
	// routed experts' (HY-V4: routed clamped, shared plain SwiGLU); nil:
	// Act. A layer's own (Layer.SharedAct) comes first.
	SharedAct *layout.Activation
	// ActByLayer and SharedActByLayer: the layers whose routed experts' or
	// shared MLP's activation is their own (Step-3.7's per-layer
	// swiglu_limits and swiglu_limits_shared), by layer index.
	ActByLayer, SharedActByLayer map[int]layout.Activation
	ExpertBias                   bool
	// Transformers is how transformers 5 holds the routed experts in
	// memory: what convert --layout transformers writes.
	Transformers    TransformersForm
	NumHiddenLayers int
	WeightDType     safetensors.DType // dtype of the expert weights
	Quantization    Quantization
	ScaleFmt        string // quantization_config.scale_fmt, e.g. "ue8m0"; "" if unset
	// ScaleDType is the dtype of the expert weights' scale tensors where
	// the format's producers differ in it (FP8 per channel or per tensor:
	// read from the checkpoint's first expert scale, every other must
	// match); "" otherwise.
	ScaleDType safetensors.DType
	// Naming is whose tensor names the expert weights carry where the
	// format's producers differ (weightfmt.Naming*: MXFP4 as
	// compressed-tensors or DeepSeek-V4 stores it); "" for the format's
	// own (gpt-oss's, for MXFP4).
	Naming string
	// GroupSize is the columns one scale covers for int4_pack (0: one
	// scale per row, strategy channel); 0 otherwise.
	GroupSize int64
	// FP8Block is the edge of FP8 square blocks where weight_block_size
	// says other than DeepSeek's 128 (DeepSeek-V4.1's [32, 32]); 0 for
	// 128 and for every other format.
	FP8Block int64
	// NVFP4InputScale: every NVFP4 expert weight has an input_scale
	// (ModelOpt) or input_global_scale (compressed-tensors) (MLP's
	// GateInput...), carried per expert; false: none has.
	NVFP4InputScale bool
	// SharedQuantization is how the shared expert is stored where it
	// differs from the routed experts (Kimi-K2's INT4 routed experts and
	// BF16 shared expert: QuantNone, its dtype SharedWeightDType;
	// DeepSeek-V4's FP4 experts and FP8 shared expert: QuantFP8Block,
	// F8_E4M3); "" when it is stored like them.
	SharedQuantization Quantization
	SharedWeightDType  safetensors.DType
	// SharedScaleDType and SharedNaming: the FP8 shared expert's scale
	// dtype and tensor names where they are not the format's own
	// (DeepSeek-V4's official layout: x.scale, F8_E8M0; weightfmt's
	// NamingDeepSeek); "" otherwise.
	SharedScaleDType safetensors.DType
	SharedNaming     string
	// InputNormEps is the epsilon of the RMSNorms of a layer's two inputs
	// (Layer.RouterInputScale, ExpertInputNorm: Gemma 4's rms_norm_eps);
	// 0 when the layers have none.
	InputNormEps float64
	// ModuleOutput is what the module transformers calls the MoE block
	// returns, against the sum moeprep plans and validates (routed +
	// shared): a golden taken there (a forward hook on it) states the
	// point, and validate compares the matching quantity.
	ModuleOutput ModuleOutput
	// PostNormEps is the epsilon of Layer.PostNorm's RMSNorm (A.X-K1's
	// rms_norm_eps); 0 when the layers have none.
	PostNormEps float64
	Layers      []Layer // sorted by Key
	// Notices are one-line remarks on what the config says and moeprep,
	// as transformers, ignores (moe_layers entries past the last layer);
	// commands print them to stderr and carry them in their JSON.
	Notices []string
	// Latent is a latent MoE's (Kimi K3's) outer width and norm; nil for
	// every other. HiddenSize is then the routed experts' width (the
	// latent, routed_expert_hidden_size), every layer names its
	// LatentDown, LatentNorm and LatentUp, and the router, the shared
	// experts and the block's input and output are Latent.Hidden wide.
	Latent *Latent
	// Wrapper is the multimodal wrapper the text model was planned inside
	// (its model_type, text config key and layer prefix); nil for a bare
	// text model. ModelType is then the text model's.
	Wrapper *Wrapper
}

// textLayers are the layer prefixes the ignore lists of the plan's
// quantisation descriptions are resolved under: a wrapper's text layers;
// nil, model.layers., for a bare text model.
func (p *Plan) textLayers() []string {
	if p.Wrapper == nil {
		return nil
	}
	return []string{p.Wrapper.Layers}
}

// Latent is a latent MoE's outer shape: Hidden is the model's hidden_size
// H (the router's input, the shared experts' width, the block's input and
// output); Norm: the routed sum passes an RMSNorm of epsilon Eps
// (latent_moe_use_norm, rms_norm_eps) before the up projection.
type Latent struct {
	Hidden int
	Norm   bool
	Eps    float64
}

// ModelHidden is the width of the block's input and output, its router's
// and its shared experts': Latent.Hidden for a latent MoE, else HiddenSize.
func (p *Plan) ModelHidden() int {
	if p.Latent != nil {
		return p.Latent.Hidden
	}
	return p.HiddenSize
}

// IntermediateOf is I of layer l's routed experts.
func (p *Plan) IntermediateOf(l Layer) int {
	if l.Intermediate > 0 {
		return l.Intermediate
	}
	return p.MoEIntermediateSize
}

// RoutedAct is layer l's routed experts' activation.
func (p *Plan) RoutedAct(l Layer) layout.Activation {
	if a, ok := p.ActByLayer[l.Index]; ok {
		return a
	}
	return p.Act
}

// SharedActOf is layer l's shared MLP's activation.
func (p *Plan) SharedActOf(l Layer) layout.Activation {
	if a, ok := p.SharedActByLayer[l.Index]; ok {
		return a
	}
	if p.SharedAct != nil {
		return *p.SharedAct
	}
	return p.RoutedAct(l)
}

// Output is OutputScale, 1 when unset.
func (p *Plan) Output() float64 {
	if p.OutputScale == 0 {
		return 1
	}
	return p.OutputScale
}

// RouteSpec is the gate of the plan's routers: greedy is plain top-k (no
// groups), group_limited_greedy (DeepSeek-V2) scores groups by their max,
// noaux_tc (DeepSeek-V3, Kimi-K2) by the sum of their top-2 biased scores;
// a router with shared rows (SharedRouted) has NumSharedExperts of them.
func (p *Plan) RouteSpec() moe.RouteSpec {
	rsf := p.RoutedScalingFactor
	if rsf == 0 {
		rsf = 1
	}
	s := moe.RouteSpec{
		Scoring:             p.Scoring,
		NumExperts:          p.NumExperts,
		TopK:                p.TopK,
		NGroup:              p.NGroup,
		TopKGroup:           p.TopKGroup,
		NormTopKProb:        p.NormTopKProb,
		GroupByMax:          p.TopKMethod.GroupByMax(),
		RoutedScalingFactor: rsf,
		JitterEps:           p.JitterEps,
	}
	if p.SharedRouted {
		s.SharedLogits = p.NumSharedExperts
	}
	s.ZeroExperts = p.ZeroExperts
	if !p.TopKMethod.Grouped() || s.NGroup < 1 {
		s.NGroup, s.TopKGroup = 1, 1
	}
	return s
}

// DTypeName is the short dtype name inspect reports: bf16, f16, f32, fp8_e4m3.
func (p *Plan) DTypeName() string {
	switch p.WeightDType {
	case safetensors.BF16:
		return "bf16"
	case safetensors.F16:
		return "f16"
	case safetensors.F32:
		return "f32"
	case safetensors.F8E4M3:
		return "fp8_e4m3"
	}
	return string(p.WeightDType)
}

// TensorMeta is what a family may know about a tensor without reading it.
type TensorMeta struct {
	// Name is the tensor's name as the view holds it, "" where the view
	// does not say: a plan keeps this string rather than the one it built
	// to look the tensor up, so a checkpoint of 200,000 tensors holds
	// each name once.
	Name  string
	DType safetensors.DType
	Shape []int64
}

// ModulesMemo is a Tensors that keeps the quantisation modules collected
// from its names (quantdesc.ModulesOf) for the layers asked, building them
// with build the first time: a plan checks several descriptions, each
// against the same modules.
type ModulesMemo interface {
	QuantModules(layers []string, build func() *quantdesc.Modules) *quantdesc.Modules
}

// Tensors is the read-only view of a checkpoint's tensor names a family plans from.
type Tensors interface {
	Lookup(name string) (TensorMeta, bool)
	Names() []string
}

// Family is one supported model family.
type Family interface {
	// Name is the family's registered name ("deepseek", "qwen2_moe", ...).
	Name() string
	// ModelTypes are the config.json model_type values it handles.
	ModelTypes() []string
	// Plan reads config (config.json decoded) and checks every MoE layer's tensors.
	Plan(config map[string]any, tensors Tensors) (*Plan, error)
}
