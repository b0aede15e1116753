// Package inspect summarises a checkpoint's MoE plan for people (a table)
// and for machines (one JSON object).
package inspect

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/moeprep/moeprep/internal/human"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

// Summary is what `moeprep inspect --json` prints. Field names are part of
// the command's interface: add, never rename.
type Summary struct {
	Dir string `json:"dir"`
	// Shown is the checkpoint as the next: line names it, where it is not
	// Dir: a Hugging Face id as the user typed it, already shell-quoted.
	Shown                  string `json:"-"`
	Family                 string `json:"family"`
	ModelType              string `json:"model_type"`
	Format                 string `json:"format"`
	DType                  string `json:"dtype"`
	Quantization           string `json:"quantization"`
	ScaleFmt               string `json:"scale_fmt,omitempty"`
	ScaleDType             string `json:"scale_dtype,omitempty"`
	HiddenSize             int    `json:"hidden_size"`
	MoEIntermediateSize    int    `json:"moe_intermediate_size"`
	NumExperts             int    `json:"num_experts"`
	NumSharedExperts       int    `json:"num_shared_experts"`
	SharedIntermediateSize int    `json:"shared_intermediate_size"`
	SharedGated            bool   `json:"shared_gated"`
	// Latent: a latent MoE (Kimi K3), whose routed experts run on a
	// projection of the hidden state HiddenSize wide; nil otherwise.
	Latent *Latent `json:"latent,omitempty"`
	// SharedRouted: the router scores the shared experts too and weights
	// each per token (Inkling); RouterScaled: a per-layer scalar tensor
	// multiplies the routing weights (Inkling's gate.global_scale).
	SharedRouted bool `json:"shared_routed,omitempty"`
	RouterScaled bool `json:"router_scaled,omitempty"`
	// ExpertScaled: each weight is multiplied by its expert's entry of a
	// per-layer vector after the top-k (Gemma 4's per_expert_scale);
	// InputNorms: the layer reads the residual stream through two
	// RMSNorms of epsilon InputNormEps, the router's (times a scale
	// vector and H^-1/2) and the experts' (Gemma 4).
	ExpertScaled bool `json:"expert_scaled,omitempty"`
	// ZeroExperts: the router also ranks this many zero-compute identity
	// experts (LongCat-Flash), which return a token's input.
	ZeroExperts         int     `json:"zero_experts,omitempty"`
	InputNorms          bool    `json:"input_norms,omitempty"`
	InputNormEps        float64 `json:"input_norm_eps,omitempty"`
	TopK                int     `json:"top_k"`
	NGroup              int     `json:"n_group"`
	TopKGroup           int     `json:"topk_group"`
	Scoring             string  `json:"scoring"`
	NormTopKProb        bool    `json:"norm_topk_prob"`
	RoutedScalingFactor float64 `json:"routed_scaling_factor"`
	OutputScale         float64 `json:"output_scale,omitempty"`        // Cohere2 average: 0.5; absent means 1
	RoutedInputScaled   bool    `json:"routed_input_scaled,omitempty"` // Llama 4: the weight scales the expert input
	// Activation is the experts' gated activation where it is not plain
	// SwiGLU (gpt-oss, DeepSeek-V4's clamp); ExpertBias: the experts have
	// biases (gpt-oss).
	Activation *layout.Activation `json:"activation,omitempty"`
	// SharedActivation is the shared MLP's where it differs from the
	// routed experts' (HY-V4); LayerActivations the layers whose own
	// differ from both (Step-3.7's per-layer limits).
	SharedActivation *layout.Activation `json:"shared_activation,omitempty"`
	LayerActivations []LayerActivation  `json:"layer_activations,omitempty"`
	ExpertBias       bool               `json:"expert_bias,omitempty"`
	NumHiddenLayers  int                `json:"num_hidden_layers"`
	MoELayers        []int              `json:"moe_layers"`
	// Banks are the routed banks each MoE layer holds where it holds two
	// (ERNIE-4.5-VL: text and vision, each of its own expert width);
	// absent for one.
	Banks []Bank `json:"banks,omitempty"`
	// HashLayers are the MoE layers routed by token id (DeepSeek-V4's hash_moe).
	HashLayers  []int `json:"hash_layers,omitempty"`
	MTPLayers   []int `json:"mtp_layers"`
	NumTensors  int   `json:"num_tensors"`
	TotalBytes  int64 `json:"total_bytes"`
	WeightFiles int   `json:"weight_files"`
	// Contract is the moeprep section of a converted checkpoint, nil for a source checkpoint.
	Contract *layout.Contract `json:"moeprep,omitempty"`
	// Notices: what config.json says that moeprep ignores, as transformers
	// does (family.Plan.Notices).
	Notices []string `json:"notices,omitempty"`
	// Quant are the checkpoint's quantisation descriptions, wherever they
	// live, each with what it quantises per tensor group.
	Quant []QuantDesc `json:"quant_descriptions,omitempty"`
	// Wrapper is the multimodal wrapper the text model sits in; nil for a
	// bare text model. ModelType is then the wrapper's (config.json's).
	Wrapper *Wrapper `json:"wrapper,omitempty"`
}

// QuantDesc is one quantisation description as inspect reports it.
type QuantDesc struct {
	File  string `json:"file"`  // config.json or hf_quant_config.json
	Key   string `json:"key"`   // quantization_config, text_config.quantization_config, compression_config, quantization
	Label string `json:"label"` // the format it names
	// Groups says how each tensor group is stored (routed experts, shared
	// expert, router, attention, dense MLP); a group it leaves unquantised
	// is absent.
	Groups map[string]string `json:"groups"`
	// Text is the one-line account the table prints.
	Text string `json:"text"`
}

// quantDescs reads c's quantisation descriptions (none where it has none,
// or where they cannot be read: planning has refused those already).
func quantDescs(c *checkpoint.Checkpoint) []QuantDesc {
	descs, err := family.DetectQuantOf(c.Config, c.HFQuantConfig(), c)
	if err != nil {
		return nil
	}
	var out []QuantDesc
	for _, d := range descs {
		groups := map[string]string{}
		for g, how := range d.Groups {
			if how != "" {
				groups[g] = how
			}
		}
		out = append(out, QuantDesc{File: d.File, Key: d.Key, Label: d.Label, Groups: groups, Text: d.Summary()})
	}
	return out
}

// Wrapper is where in a multimodal wrapper the planned text model lives,
// and what else the checkpoint holds, which convert carries byte for byte.
type Wrapper struct {
	ModelType     string `json:"model_type"`
	TextConfig    string `json:"text_config"`
	TextModelType string `json:"text_model_type"`
	Layers        string `json:"layers"`
	// Carried groups every tensor outside the text model by its leading
	// name (its first segment, two under "model."), sorted.
	Carried []Carried `json:"carried"`
}

// Carried is one part of a wrapper outside its text model.
type Carried struct {
	Prefix  string `json:"prefix"`
	Tensors int    `json:"tensors"`
	Bytes   int64  `json:"bytes"`
}

// wrapperOf summarises p's wrapper over c's tensors.
func wrapperOf(c *checkpoint.Checkpoint, w *family.Wrapper) *Wrapper {
	out := &Wrapper{ModelType: w.ModelType, TextConfig: w.TextConfig, TextModelType: w.TextModelType, Layers: w.Layers,
		Carried: []Carried{}}
	at := map[string]int{}
	for _, t := range c.Tensors {
		if slices.ContainsFunc(w.Text, func(p string) bool { return strings.HasPrefix(t.Name, p) }) {
			continue
		}
		first, rest, _ := strings.Cut(t.Name, ".")
		if second, _, ok := strings.Cut(rest, "."); first == "model" && ok {
			first += "." + second
		}
		i, ok := at[first]
		if !ok {
			i = len(out.Carried)
			at[first] = i
			out.Carried = append(out.Carried, Carried{Prefix: first})
		}
		out.Carried[i].Tensors++
		out.Carried[i].Bytes += t.NumBytes()
	}
	slices.SortFunc(out.Carried, func(a, b Carried) int { return strings.Compare(a.Prefix, b.Prefix) })
	return out
}

// Summarize plans c and collects its summary. A checkpoint converted by
// moeprep is planned from its contract and stacked tensors.
func Summarize(c *checkpoint.Checkpoint) (*Summary, error) {
	contract, converted, err := layout.ReadContract(c.Config)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Dir, err)
	}
	if !converted {
		p, err := c.Plan()
		if err != nil {
			return nil, err
		}
		s := fromPlan(c, p)
		s.Quant = quantDescs(c)
		return s, nil
	}
	p, err := family.PlanConverted(c.Config, c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Dir, err)
	}
	s := fromPlan(c, p)
	s.Contract = contract
	s.DType = dtypeName(contract.WeightDType)
	s.Quantization = contract.Quantization
	return s, nil
}

func dtypeName(d string) string {
	p := family.Plan{WeightDType: safetensors.DType(d)}
	return p.DTypeName()
}

func fromPlan(c *checkpoint.Checkpoint, p *family.Plan) *Summary {
	s := &Summary{
		Dir: c.Dir, Family: p.Family, ModelType: p.ModelType, Format: c.Format,
		DType: p.DTypeName(), Quantization: string(p.Quantization), ScaleFmt: p.ScaleFmt, ScaleDType: string(p.ScaleDType),
		HiddenSize: p.ModelHidden(), MoEIntermediateSize: p.MoEIntermediateSize,
		NumExperts: p.NumExperts, NumSharedExperts: p.NumSharedExperts, ZeroExperts: p.ZeroExperts,
		SharedIntermediateSize: p.SharedIntermediateSize, SharedGated: p.SharedGated, SharedRouted: p.SharedRouted,
		TopK: p.TopK, NGroup: p.NGroup, TopKGroup: p.TopKGroup, Scoring: string(p.Scoring),
		NormTopKProb: p.NormTopKProb, RoutedScalingFactor: p.RoutedScalingFactor, OutputScale: outputScale(p),
		RoutedInputScaled: p.RoutedInputScaled,
		NumHiddenLayers:   p.NumHiddenLayers,
		MoELayers:         []int{}, MTPLayers: []int{},
		NumTensors: len(c.Tensors), TotalBytes: c.TotalBytes(), Notices: p.Notices,
	}
	if p.Latent != nil {
		s.Latent = &Latent{Size: p.HiddenSize, Norm: p.Latent.Norm, Eps: p.Latent.Eps}
	}
	if p.Wrapper != nil {
		s.ModelType = p.Wrapper.ModelType
		s.Wrapper = wrapperOf(c, p.Wrapper)
	}
	if !p.Act.SwiGLU() {
		act := p.Act
		s.Activation = &act
	}
	if p.SharedAct != nil && *p.SharedAct != p.Act {
		act := *p.SharedAct
		s.SharedActivation = &act
	}
	for _, l := range p.Layers {
		ra, sa := p.RoutedAct(l), p.SharedActOf(l)
		plainShared := p.Act
		if p.SharedAct != nil {
			plainShared = *p.SharedAct
		}
		if ra != p.Act || (l.Shared != nil && sa != plainShared) {
			la := LayerActivation{Layer: l.Key(), Activation: ra.Describe()}
			if l.Shared != nil {
				la.SharedActivation = sa.Describe()
			}
			s.LayerActivations = append(s.LayerActivations, la)
		}
	}
	s.ExpertBias = p.ExpertBias
	for _, l := range p.Layers {
		s.RouterScaled = s.RouterScaled || l.RouterScale != ""
		s.ExpertScaled = s.ExpertScaled || l.ExpertScale != ""
		if l.RouterInputScale != "" || l.ExpertInputNorm != "" {
			s.InputNorms, s.InputNormEps = true, p.InputNormEps
		}
		if l.HashTable != "" {
			s.HashLayers = append(s.HashLayers, l.Key())
		}
		if l.Bank != family.NoBank && !slices.ContainsFunc(s.Banks, func(b Bank) bool { return b.Name == l.Bank.String() }) {
			s.Banks = append(s.Banks, Bank{Name: l.Bank.String(), ExpertIntermediateSize: p.IntermediateOf(l), Module: l.Prefix[strings.LastIndexByte(l.Prefix, '.')+1:]})
		}
		if l.Bank.Second() {
			continue // its decoder layer is listed with the first bank
		}
		s.MoELayers = append(s.MoELayers, l.Index)
		if l.MTP {
			s.MTPLayers = append(s.MTPLayers, l.Index)
		}
	}
	for _, f := range c.WeightFiles {
		if !strings.HasSuffix(f, ".json") {
			s.WeightFiles++
		}
	}
	return s
}

// WriteText prints s as an aligned, human-readable block.
func WriteText(w io.Writer, s *Summary) error {
	shared := "none"
	if s.NumSharedExperts > 0 {
		shared = fmt.Sprintf("%d x intermediate %d", s.NumSharedExperts, s.SharedIntermediateSize/s.NumSharedExperts)
		if s.SharedGated {
			shared += " (per-token gated)"
		}
		if s.SharedRouted {
			shared += " (weighted per token by the router, with the routed experts)"
		}
	}
	quant := s.Quantization
	if s.ScaleFmt != "" {
		quant += " (scale_fmt " + s.ScaleFmt + ")"
	}
	if s.ScaleDType != "" {
		quant += ", " + s.ScaleDType + " weight_scale"
	}
	routing := fmt.Sprintf("%s, top-%d", s.Scoring, s.TopK)
	if s.NGroup > 1 {
		routing += fmt.Sprintf(", %d groups keep %d", s.NGroup, s.TopKGroup)
	}
	if s.NormTopKProb {
		routing += ", renormalised"
	}
	if s.RoutedInputScaled {
		routing += ", weight scales the expert input"
	}
	if s.OutputScale != 0 {
		routing += fmt.Sprintf(", output x %g (routed + shared)", s.OutputScale)
	}
	if s.SharedRouted {
		routing += fmt.Sprintf(", weights normalised over the top-%d and %d shared", s.TopK, s.NumSharedExperts)
	}
	if s.RoutedScalingFactor != 1 {
		routing += fmt.Sprintf(", routed_scaling_factor %g", s.RoutedScalingFactor)
	}
	if s.RouterScaled {
		routing += " x the layer's router scale tensor"
	}
	if s.ExpertScaled {
		routing += ", each weight x its expert's per_expert_scale"
	}
	experts := "SwiGLU"
	if a := s.Activation; a != nil {
		experts = activationText(*a)
	}
	if s.ExpertBias {
		experts += ", with biases"
	}
	if a := s.Activation; a != nil && a.Ungated() {
		experts += " (ungated: up and down only, converted --layout stacked)"
	}
	if a := s.SharedActivation; a != nil {
		experts += "; shared MLP " + a.Describe()
	}
	for _, la := range s.LayerActivations {
		experts += fmt.Sprintf("; layer %d: %s", la.Layer, la.Activation)
		if la.SharedActivation != "" {
			experts += ", shared MLP " + la.SharedActivation
		}
	}
	rows := [][2]string{
		{"checkpoint", s.Dir},
		{"family", fmt.Sprintf("%s (model_type %s)", s.Family, s.ModelType)},
		{"format", fmt.Sprintf("%s, %s, %s, %s", s.Format, human.Count(s.WeightFiles, "weight file"), human.Count(s.NumTensors, "tensor"), human.Bytes(s.TotalBytes))},
		{"expert weights", fmt.Sprintf("%s, quantization %s", s.DType, quant)},
		{"shapes", shapesText(s)},
		{"routed experts", routedText(s)},
		{"shared experts", shared},
		{"routing", routing},
		{"experts", experts},
		{"MoE layers", fmt.Sprintf("%d of %d: %s%s", len(s.MoELayers), s.NumHiddenLayers, Ranges(s.MoELayers), banksText(s))},
	}
	if w := s.Wrapper; w != nil {
		rows = append(rows, [2]string{"wrapper", fmt.Sprintf("%s: text model %s (%s), layers %sL", w.ModelType, w.TextModelType, w.TextConfig, w.Layers)})
		var parts []string
		for _, c := range w.Carried {
			parts = append(parts, fmt.Sprintf("%s (%s, %s)", c.Prefix, human.Count(c.Tensors, "tensor"), human.Bytes(c.Bytes)))
		}
		if len(parts) == 0 {
			parts = []string{"nothing"}
		}
		rows = append(rows, [2]string{"carried", strings.Join(parts, ", ") + ", byte for byte"})
	}
	if s.InputNorms {
		rows = append(rows, [2]string{"layer input", fmt.Sprintf("the residual stream r: the router reads rmsnorm(r) x router.scale x H^-1/2, the experts pre_feedforward_layernorm_2(r) (eps %g)", s.InputNormEps)})
	}
	if len(s.HashLayers) > 0 {
		rows = append(rows, [2]string{"hash routed", Ranges(s.HashLayers) + " (experts from the token-id table)"})
	}
	for _, q := range s.Quant {
		rows = append(rows, [2]string{"quantised", fmt.Sprintf("%s %s: %s", q.File, q.Key, q.Text)})
	}
	if len(s.MTPLayers) > 0 {
		rows = append(rows, [2]string{"MTP layers", Ranges(s.MTPLayers)})
	}
	if k := s.Contract; k != nil {
		fused := "no shared expert fused"
		if k.NumFusedSharedExperts > 0 {
			fused = fmt.Sprintf("%d shared experts fused at ids %d-%d (%d replicas x %d slices), slot weight %g",
				k.NumFusedSharedExperts, k.SharedFirstID, k.SharedFirstID+k.NumFusedSharedExperts-1, k.SharedReplicas, k.SharedSlices, k.SharedSlotWeight)
		}
		folded := "not folded (runtime multiply)"
		if k.RoutedScalingFactorFolded {
			folded = fmt.Sprintf("folded into routed down projections (max relative change %.3g)", k.FoldMaxRelChange)
		}
		rows = append(rows,
			[2]string{"converted by", fmt.Sprintf("%s, layout %s%s, from %s", k.Tool, k.Layout, orientation(k), k.SourceFormat)},
			[2]string{"fused shared", fused},
			[2]string{"rsf", fmt.Sprintf("%g, %s", k.RoutedScalingFactor, folded)})
		if d := k.Dequantized; d != nil {
			var from []string
			for _, g := range d.Groups {
				from = append(from, fmt.Sprintf("%d %s weights from %s", g.Tensors, strings.TrimSuffix(g.Group, "s"), g.Quantization))
			}
			rows = append(rows, [2]string{"dequantised", fmt.Sprintf("to %s (%s): %s", d.DType, d.Rounding, strings.Join(from, ", "))})
		}
	}
	if s.Contract == nil {
		rows = append(rows, [2]string{"next", nextStep(s)})
	}
	for _, r := range rows {
		if _, err := fmt.Fprintf(w, "%-16s %s\n", r[0]+":", wrapValue(r[1], r[0] == "next")); err != nil {
			return err
		}
	}
	return nil
}

// The text's width (issue 46): a value longer than its column wraps at
// spaces, under the values' column.
const (
	lineWidth   = 100
	valueColumn = 17
)

// wrapValue wraps a row's value to fit lineWidth; a command (command set:
// the value's words up to its OUT) is never broken, so that it can be
// copied, however long its path.
func wrapValue(v string, command bool) string {
	words := strings.Split(v, " ")
	if command {
		if i := slices.Index(words, "OUT"); i > 0 {
			words = append([]string{strings.Join(words[:i+1], " ")}, words[i+1:]...)
		}
	}
	indent := strings.Repeat(" ", valueColumn)
	var b strings.Builder
	col := valueColumn
	for i, word := range words {
		n := utf8.RuneCountInString(word)
		switch {
		case i == 0:
		case col+1+n > lineWidth:
			b.WriteString("\n" + indent)
			col = valueColumn
		default:
			b.WriteString(" ")
			col++
		}
		b.WriteString(word)
		col += n
	}
	return b.String()
}

// nextStep says what to run on a source checkpoint: fuse-shared where its
// shared expert can be fused (as far as the plan shows: a checkpoint may
// still be refused for what fuse-shared checks), else convert to the
// layout transformers 5 loads as it is.
func nextStep(s *Summary) string {
	dir := s.Dir
	if strings.ContainsAny(dir, " '\"$`\\") {
		dir = "'" + strings.ReplaceAll(dir, "'", `'\''`) + "'"
	}
	if s.Shown != "" {
		dir = s.Shown
	}
	fusable := s.NumSharedExperts > 0 && !s.SharedGated && !s.SharedRouted && s.Latent == nil && slices.Contains(family.FuseSharedModelTypes(), s.ModelType)
	// --layout transformers where transformers 5 was seen to load that
	// form as the original; gate-up, the engines' form, elsewhere.
	lay, loads := "transformers", "transformers 5 loads it"
	if !layout.LoadsInTransformers(s.ModelType) {
		lay, loads = "gate-up", "a loader maps it: README, Using the output"
	}
	if fusable {
		return fmt.Sprintf("moeprep fuse-shared --tp 8 %s OUT (the shared expert fuses), or convert --layout %s (%s)", dir, lay, loads)
	}
	why := "it has no shared expert"
	switch {
	case s.NumSharedExperts == 0:
	case s.SharedGated:
		why = "its shared expert is gated per token"
	case s.SharedRouted:
		why = "the router weights its shared experts per token"
	default:
		why = "its family's shared expert is not fused"
	}
	return fmt.Sprintf("moeprep convert --layout %s %s OUT (%s; fuse-shared does not apply: %s)", lay, dir, loads, why)
}

// LayerActivation is a layer whose activations differ from the
// checkpoint-wide ones, as text.
type LayerActivation struct {
	Layer            int    `json:"layer"`
	Activation       string `json:"activation"`
	SharedActivation string `json:"shared_activation,omitempty"`
}

// activationText spells out a gated activation other than SwiGLU
// (layout.Activation.Describe).
func activationText(a layout.Activation) string { return a.Describe() }

// Ranges renders sorted ints compactly: 1-3,5,7-9.
// Bank is one of the routed banks of a MoE layer that holds two.
type Bank struct {
	Name                   string `json:"name"`                     // "text", "vision"
	ExpertIntermediateSize int    `json:"expert_intermediate_size"` // I of its experts
	Module                 string `json:"module"`                   // its converted stacks' module under the layer's MoE module: "text_moe"
}

// Latent is a latent MoE's routed-expert width (routed_expert_hidden_size)
// and the norm its routed sum passes before the up projection.
type Latent struct {
	Size int     `json:"routed_expert_hidden_size"`
	Norm bool    `json:"norm"`
	Eps  float64 `json:"eps,omitempty"`
}

// shapesText is the shapes row: the expert width, each bank's where the
// layers hold two.
func shapesText(s *Summary) string {
	if l := s.Latent; l != nil {
		norm := "no norm"
		if l.Norm {
			norm = fmt.Sprintf("RMSNorm eps %g", l.Eps)
		}
		return fmt.Sprintf("hidden %d, routed experts on a latent of %d (%s), expert intermediate %d", s.HiddenSize, l.Size, norm, s.MoEIntermediateSize)
	}
	if len(s.Banks) == 0 {
		return fmt.Sprintf("hidden %d, expert intermediate %d", s.HiddenSize, s.MoEIntermediateSize)
	}
	var parts []string
	for _, b := range s.Banks {
		parts = append(parts, fmt.Sprintf("%d (%s bank)", b.ExpertIntermediateSize, b.Name))
	}
	return fmt.Sprintf("hidden %d, expert intermediate %s", s.HiddenSize, strings.Join(parts, ", "))
}

// banksText says, after the MoE layers, that each holds several banks.
func banksText(s *Summary) string {
	if len(s.Banks) == 0 {
		return ""
	}
	var names []string
	for _, b := range s.Banks {
		names = append(names, b.Name)
	}
	return fmt.Sprintf(", each with a %s routed bank of %d experts chosen by token type (converted as mlp.<bank>_moe.experts)", strings.Join(names, " and a "), s.NumExperts)
}

func Ranges(xs []int) string {
	if len(xs) == 0 {
		return "none"
	}
	var parts []string
	for i := 0; i < len(xs); {
		j := i
		for j+1 < len(xs) && xs[j+1] == xs[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, fmt.Sprint(xs[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", xs[i], xs[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// outputScale is the plan's output scale, 0 (left out of --json) when 1.
func outputScale(p *family.Plan) float64 {
	if p.Output() == 1 {
		return 0
	}
	return p.Output()
}

// orientation says ", in-out ([in, out] per expert)" for transposed
// stacks, "" for the default.
func orientation(k *layout.Contract) string {
	if k.Oriented() == layout.OutIn {
		return ""
	}
	return fmt.Sprintf(", %s ([in, out] per expert)", k.Oriented())
}

// routedText is the routed experts' count, with the zero-compute experts
// the router ranks beside them (LongCat-Flash).
func routedText(s *Summary) string {
	if s.ZeroExperts == 0 {
		return fmt.Sprint(s.NumExperts)
	}
	return fmt.Sprintf("%d, and %d zero-compute experts the router ranks with them (a slot on one returns the token's input, weighted)", s.NumExperts, s.ZeroExperts)
}
