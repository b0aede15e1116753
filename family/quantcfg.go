package family

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// This file detects how a checkpoint says its weights are quantised,
// wherever that lives: config.json's
// quantization_config, text_config.quantization_config (multimodal
// wrappers), compression_config (older compressed-tensors), and
// hf_quant_config.json (ModelOpt). Each description is classified, its
// ignore/exclude list resolved against one representative module name per
// tensor group, and every format other than FP8 128x128 blocks and FP8 per
// channel or per tensor (Supported) is refused with one line, so that none
// is read as bf16 or FP8 by mistake.

// QuantKind classifies a quantisation description.
type QuantKind string

const (
	QuantKindNone       QuantKind = "none"
	QuantKindFP8Block   QuantKind = "fp8-block-128x128"   // DeepSeek-style: weight_scale_inv per 128x128 (supported)
	QuantKindFP8BlockCT QuantKind = "fp8-block-ct"        // compressed-tensors float-quantized, block strategy (weight_scale)
	QuantKindInt4Pack   QuantKind = "int4-pack-quantized" // compressed-tensors pack-quantized
	QuantKindMXFP4      QuantKind = "mxfp4"               // gpt-oss, or compressed-tensors mxfp4-pack-quantized
	QuantKindNVFP4      QuantKind = "nvfp4"               // ModelOpt, or compressed-tensors nvfp4-pack-quantized
	QuantKindFP8Channel QuantKind = "fp8-per-channel"     // weight_scale [out,1]
	QuantKindFP8Tensor  QuantKind = "fp8-per-tensor"      // scalar weight_scale
	QuantKindMixed      QuantKind = "mixed"               // several kinds over the groups
	QuantKindUnknown    QuantKind = "unknown"             // anything else
)

// Tensor groups a quantisation description is resolved for, in report order.
const (
	GroupExperts   = "routed experts"
	GroupShared    = "shared expert"
	GroupRouter    = "router"
	GroupAttention = "attention"
	GroupDenseMLP  = "dense MLP"
)

var quantGroups = []string{GroupExperts, GroupShared, GroupRouter, GroupAttention, GroupDenseMLP}

// groupNames are representative module names of each group in the common
// hub namings; a group is excluded when an ignore entry matches any of them
// (inside a multimodal wrapper, any of them under its text layer prefix in
// place of model.layers.: matcher.excluded).
var groupNames = map[string][]string{
	GroupExperts: {"model.layers.1.mlp.experts.0.gate_proj", "model.layers.1.mlp.experts.0.down_proj",
		"model.layers.1.mlp.experts", "model.layers.1.block_sparse_moe.experts.0.w1"},
	GroupShared: {"model.layers.1.mlp.shared_experts.gate_proj", "model.layers.1.mlp.shared_expert.gate_proj",
		"model.layers.1.mlp.shared_experts.down_proj"},
	GroupRouter:    {"model.layers.1.mlp.gate", "model.layers.1.mlp.router"},
	GroupAttention: {"model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.o_proj"},
	GroupDenseMLP:  {"model.layers.0.mlp.gate_proj", "model.layers.0.mlp.down_proj"},
}

// Bounds on ignore/exclude lists: real ones have a handful of entries (a
// MIXED_PRECISION list names every layer: a few thousand).
const (
	maxQuantPatterns   = maxConfigList // entries of one list
	maxQuantRegexes    = 256           // re: patterns and globs compiled
	maxQuantPatternLen = 1024          // bytes of one entry
	maxQuantLayers     = maxConfigList // quantized_layers entries
)

// QuantDesc is one quantisation description as detected.
type QuantDesc struct {
	File   string // "config.json" or "hf_quant_config.json"
	Key    string // "quantization_config", "text_config.quantization_config", "compression_config", "quantization"
	Kind   QuantKind
	Label  string            // e.g. "compressed-tensors pack-quantized int4 (group 32, symmetric)"
	Groups map[string]string // group -> how it is stored ("" when left unquantised)
	// Detail names the modules where a mixed-precision description gives
	// one group two formats ("" when each has one).
	Detail string
	// experts are the routed-expert modules a mixed-precision description
	// names (quantized_layers), sorted: what it leaves out is unquantised.
	experts []string
}

// Supported reports whether moeprep carries the description today,
// wherever config.json holds it (quantConfig reads the one description):
// FP8 128x128 blocks; FP8 per channel or per tensor (compressed-tensors
// float-quantized, or quant_method fp8 without weight_block_size; not
// ModelOpt's, whose activation scales are static); compressed-tensors
// pack-quantized INT4; gpt-oss's MXFP4; NVFP4 in groups of 16, ModelOpt's
// (config.json or hf_quant_config.json) or compressed-tensors'. readQuant
// and the format's reader check the rest.
func (d QuantDesc) Supported() bool {
	inConfig := d.File == "config.json"
	if d.Detail != "" {
		// One group in two formats: moeprep plans one per group.
		return false
	}
	switch d.Kind {
	case QuantKindNone, QuantKindFP8Block:
		return true
	case QuantKindFP8Channel, QuantKindFP8Tensor:
		return inConfig && !strings.HasPrefix(d.Label, "modelopt")
	case QuantKindMXFP4:
		// gpt-oss's quant_method mxfp4 (family checks that the family is
		// gpt-oss) and compressed-tensors' mxfp4-pack-quantized in groups
		// of 32 (readCTFP4 checks the rest).
		return inConfig && (d.Label == "mxfp4" || d.Label == ctMXFP4Label)
	case QuantKindInt4Pack:
		// readCTInt4 checks the rest: symmetric, group or channel, W4A16.
		return inConfig
	case QuantKindNVFP4:
		return strings.HasPrefix(d.Label, "modelopt nvfp4 (group 16)") || d.Label == ctNVFP4Label && inConfig
	case QuantKindMixed:
		// ModelOpt MIXED_PRECISION whose experts are all NVFP4 in groups of
		// 16 (attention and dense MLPs in any format: copied).
		return d.nvfp4Experts()
	}
	return false
}

// nvfp4Experts reports whether d is a ModelOpt MIXED_PRECISION
// description that moeprep carries as NVFP4: every routed expert entry
// NVFP4 in groups of 16, the shared expert's too where it names one.
func (d QuantDesc) nvfp4Experts() bool {
	const nv = "nvfp4 (group 16)"
	sh := d.Groups[GroupShared]
	return d.Kind == QuantKindMixed && strings.HasPrefix(d.Label, "modelopt") && d.Detail == "" &&
		d.Groups[GroupExperts] == nv && (sh == "" || sh == nv)
}

// carriedFormats says which expert formats moeprep reads (FORMATS.md's
// table), for refusals of anything else.
const carriedFormats = "moeprep reads bf16/f16/f32, FP8 (128x128 blocks, per-channel, per-tensor), compressed-tensors INT4 pack-quantized, MXFP4 (gpt-oss, compressed-tensors, DeepSeek-V4), ModelOpt NVFP4 and compressed-tensors NVFP4 experts"

// ctMXFP4Label is how classifyCTScheme labels compressed-tensors MXFP4 in
// groups of 32, the one it may carry.
const ctMXFP4Label = "compressed-tensors mxfp4-pack-quantized (group 32)"

// ctNVFP4Label is how classifyCTScheme labels compressed-tensors NVFP4 in
// groups of 16, the one NVFP4 it may carry.
const ctNVFP4Label = "compressed-tensors nvfp4-pack-quantized (group 16)"

// Refusal is the one-line error for a description moeprep cannot carry.
func (d QuantDesc) Refusal() error {
	why := "not carried yet; " + carriedFormats
	fp8Scaled := d.Kind == QuantKindFP8Channel || d.Kind == QuantKindFP8Tensor
	switch {
	case d.Detail != "":
		why = "not carried: " + d.Detail
	case fp8Scaled && strings.HasPrefix(d.Label, "modelopt"):
		why = "not carried: ModelOpt FP8 stores static activation scales (input_scale); moeprep reads FP8 with dynamic activations only"
	case fp8Scaled:
		why = "not carried yet: moeprep reads FP8 per-channel and per-tensor experts described by config.json only"
	case d.Kind == QuantKindMXFP4:
		why = "not carried yet: moeprep reads MXFP4 experts in groups of 32 only (gpt-oss quant_method mxfp4, compressed-tensors mxfp4-pack-quantized, DeepSeek-V4 expert_dtype fp4)"
	case d.Kind == QuantKindInt4Pack:
		why = "not carried yet: moeprep reads pack-quantized INT4 experts described by config.json only"
	case d.Kind == QuantKindNVFP4:
		why = "not carried yet: moeprep reads NVFP4 experts in groups of 16 only (ModelOpt quant_algo NVFP4, compressed-tensors nvfp4-pack-quantized)"
	case d.Kind == QuantKindMixed && strings.HasPrefix(d.Label, "modelopt") && d.Groups[GroupExperts] == "nvfp4 (group 16)":
		why = fmt.Sprintf("not carried: the shared expert is %s beside NVFP4 routed experts; moeprep carries NVFP4 shared experts only (fusing or validating a shared expert of another format beside them is not built)", d.Groups[GroupShared])
	case d.Kind == QuantKindMixed && strings.HasPrefix(d.Label, "modelopt"):
		why = "not carried yet: moeprep reads MIXED_PRECISION whose routed experts (and shared expert, where quantised) are NVFP4 in groups of 16; attention and dense MLPs may be anything, they are copied"
	}
	return fmt.Errorf("%s: %s: %s: %s", d.File, d.Key, d.Summary(), why)
}

// Summary says the format and, per group, what is quantised how.
func (d QuantDesc) Summary() string {
	byHow := map[string][]string{}
	var hows, plain []string
	for _, g := range quantGroups {
		h := d.Groups[g]
		if h == "" {
			plain = append(plain, g)
			continue
		}
		if _, ok := byHow[h]; !ok {
			hows = append(hows, h)
		}
		byHow[h] = append(byHow[h], g)
	}
	var s string
	switch {
	case len(hows) == 0:
		return d.Label + " on no tensor group"
	case len(hows) == 1 && hows[0] == d.Label:
		s = d.Label + " on the " + strings.Join(byHow[d.Label], ", ")
	default:
		parts := make([]string, len(hows))
		for i, h := range hows {
			parts[i] = h + " on the " + strings.Join(byHow[h], ", ")
		}
		s = d.Label + " (" + strings.Join(parts, "; ") + ")"
	}
	if len(plain) > 0 {
		s += " (unquantised: " + strings.Join(plain, ", ") + ")"
	}
	return s
}

// DetectQuant reads every quantisation description of config.json and of
// hf_quant_config.json (hf may be nil) and classifies each. The FP8 block
// description of config.json's quantization_config is left to readQuant,
// which checks it in full.
func DetectQuant(raw map[string]any, hf map[string]any) ([]QuantDesc, error) {
	return DetectQuantOf(raw, hf, nil)
}

// DetectQuantOf is DetectQuant with the ignore lists resolved against t's
// module names (nil: representative names), as planning resolves them.
func DetectQuantOf(raw map[string]any, hf map[string]any, t Tensors) ([]QuantDesc, error) {
	var layers []string
	if mt, _ := raw["model_type"].(string); wrapperOf(mt) != nil {
		layers = wrapperOf(mt).layers
	}
	return detectQuant(raw, hf, quantModulesOf(t, layers))
}

// detectQuant is DetectQuant with the ignore lists resolved against mods:
// the checkpoint's modules of each group in its text layers (a wrapper's
// under its text layer prefixes), or, for a group it has none of, the
// representative names of groupNames.
func detectQuant(raw map[string]any, hf map[string]any, mods *quantModules) ([]QuantDesc, error) {
	var out []QuantDesc
	top, _ := raw["expert_dtype"].(string)
	if err := configQuants(config{m: raw}, func(q config, key string) error {
		d, err := classify(q, "config.json", key, mods)
		if err != nil {
			return err
		}
		if dt, _ := q.m["expert_dtype"].(string); (top == "fp4" || dt == "fp4") && d.Groups[GroupExperts] != "" {
			// DeepSeek-V4: its experts FP4 beside FP8 (readExpertFP4).
			d.Groups[GroupExperts] = "mxfp4 (expert_dtype fp4)"
		}
		out = append(out, d)
		return nil
	}); err != nil {
		return nil, err
	}
	if hf != nil {
		h := config{m: hf}
		q, ok, err := h.object("quantization")
		if err != nil {
			return nil, hfErr(err)
		}
		if ok {
			d, err := classifyModelOpt(q, "hf_quant_config.json", "quantization", mods)
			if err != nil {
				return nil, hfErr(err)
			}
			out = append(out, d)
		}
	}
	return out, nil
}

// configQuants calls f on each quantisation description of config.json,
// where one is, in order: quantization_config, text_config's
// quantization_config (multimodal wrappers: Kimi-K2.5), compression_config
// (older compressed-tensors); key is its path ("text_config.quantization_config").
func configQuants(c config, f func(q config, key string) error) error {
	visit := func(parent config, key string) error {
		q, ok, err := parent.object(key)
		if err != nil || !ok {
			return err
		}
		return f(q, parent.at+key)
	}
	if err := visit(c, "quantization_config"); err != nil {
		return err
	}
	if tc, ok, err := c.object("text_config"); err != nil {
		return err
	} else if ok {
		if err := visit(tc, "quantization_config"); err != nil {
			return err
		}
	}
	return visit(c, "compression_config")
}

// quantConfig is config.json's quantisation description wherever it lives
// (configQuants), and its quant_method (compression_config's defaults to
// compressed-tensors, as only compressed-tensors wrote it); ok is false
// when there is none. Two descriptions must say the same: moeprep reads
// one.
func quantConfig(c config) (q config, method string, ok bool, err error) {
	err = configQuants(c, func(d config, key string) error {
		if ok && !reflect.DeepEqual(d.m, q.m) {
			return fmt.Errorf("config.json: %s and %s describe the quantisation differently; moeprep reads one description", strings.TrimSuffix(q.at, "."), key)
		}
		if !ok {
			q, ok = d, true
		}
		return nil
	})
	if err != nil || !ok {
		return config{}, "", false, err
	}
	if method, err = q.str("quant_method", ""); err != nil {
		return config{}, "", false, err
	}
	if method == "" && q.at == "compression_config." {
		method = "compressed-tensors"
	}
	return q, method, true, nil
}

// conflictingQuant is the refusal of a checkpoint whose config.json and
// hf_quant_config.json describe its weights differently (descs as
// detectQuant gives them, hf_quant_config.json's last): each file named
// with what it says, since moeprep cannot know which one the tensors
// follow.
func conflictingQuant(descs []QuantDesc) error {
	hf := descs[len(descs)-1]
	if len(descs) < 2 {
		return hf.Refusal()
	}
	cfg := descs[0]
	return fmt.Errorf("%s: %s says %s, but %s: %s says %s; the two files describe the weights differently and moeprep reads one description (remove the one the tensors do not follow)",
		cfg.File, cfg.Key, cfg.Summary(), hf.File, hf.Key, hf.Summary())
}

// hfErr renames an error of config's helpers, which say config.json.
func hfErr(err error) error {
	return fmt.Errorf("hf_quant_config.json%s", strings.TrimPrefix(err.Error(), "config.json"))
}

func classify(q config, file, key string, mods *quantModules) (QuantDesc, error) {
	method, err := q.str("quant_method", "")
	if err != nil {
		return QuantDesc{}, err
	}
	if method == "" && key == "compression_config" {
		method = "compressed-tensors"
	}
	switch method {
	case "fp8":
		d := QuantDesc{File: file, Key: key, Kind: QuantKindFP8Tensor, Label: "fp8 per-tensor (no weight_block_size)"}
		if q.has("weight_block_size") {
			// readQuant checks the block size and the rest.
			d.Kind, d.Label = QuantKindFP8Block, "fp8 128x128 block"
		}
		m, err := newMatcher(q, mods, syntaxRe, "modules_to_not_convert", "ignored_layers")
		if err != nil {
			return QuantDesc{}, err
		}
		d.Groups, d.Detail, err = m.resolve(d.Label, false)
		return d, err
	case "mxfp4":
		d := QuantDesc{File: file, Key: key, Kind: QuantKindMXFP4, Label: "mxfp4"}
		m, err := newMatcher(q, mods, syntaxRe, "modules_to_not_convert")
		if err != nil {
			return QuantDesc{}, err
		}
		// gpt-oss quantises the experts only.
		d.Groups = map[string]string{}
		s, err := m.excluded(GroupExperts)
		if err != nil {
			return QuantDesc{}, err
		}
		if !s.excluded {
			d.Groups[GroupExperts] = d.Label
		}
		return d, nil
	case "modelopt":
		return classifyModelOpt(q, file, key, mods)
	case "compressed-tensors":
		return classifyCT(q, file, key, mods)
	case "":
		return QuantDesc{}, q.missing("quant_method")
	}
	return QuantDesc{}, q.errorf("quant_method", "%q is not supported (only fp8 with 128x128 block scales)", method)
}

// modelOptAlgo names a ModelOpt quant_algo.
func modelOptAlgo(algo string, group int) (QuantKind, string) {
	switch strings.ToUpper(algo) {
	case "NVFP4", "W4A16_NVFP4", "NVFP4_AWQ":
		return QuantKindNVFP4, fmt.Sprintf("modelopt nvfp4 (group %d)", group)
	case "FP8":
		return QuantKindFP8Tensor, "modelopt fp8 per-tensor"
	case "FP8_PER_CHANNEL_PER_TOKEN":
		return QuantKindFP8Channel, "modelopt fp8 per-channel"
	}
	return QuantKindUnknown, fmt.Sprintf("modelopt %s", strings.ToLower(algo))
}

func classifyModelOpt(q config, file, key string, mods *quantModules) (QuantDesc, error) {
	algo, err := q.str("quant_algo", "")
	if err != nil {
		return QuantDesc{}, err
	}
	if algo == "" {
		return QuantDesc{}, q.missing("quant_algo")
	}
	group, err := q.intIn("group_size", 16, 1, maxDim)
	if err != nil {
		return QuantDesc{}, err
	}
	m, err := newMatcher(q, mods, syntaxGlob, "exclude_modules", "ignore")
	if err != nil {
		return QuantDesc{}, err
	}
	d := QuantDesc{File: file, Key: key}
	if strings.ToUpper(algo) != "MIXED_PRECISION" {
		d.Kind, d.Label = modelOptAlgo(algo, group)
		d.Groups, d.Detail, err = m.resolve(d.Label, false)
		return d, err
	}
	d.Kind, d.Label = QuantKindMixed, "modelopt MIXED_PRECISION"
	layers, ok, err := q.object("quantized_layers")
	if err != nil {
		return QuantDesc{}, err
	}
	if !ok {
		return QuantDesc{}, q.missing("quantized_layers")
	}
	if len(layers.m) > maxQuantLayers {
		return QuantDesc{}, q.errorf("quantized_layers", "%d entries, over the limit of %d", len(layers.m), maxQuantLayers)
	}
	// Each entry names a quantised module (a projection, or a layer's
	// whole experts: model.layers.L.mlp.experts); what it does not name
	// is unquantised. Per group: its one format, or the first two that
	// differ.
	d.Groups = map[string]string{}
	first := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(layers.m)) {
		g := moduleGroup(name)
		if g == "" {
			continue
		}
		if skip, err := m.matches(name); err != nil {
			return QuantDesc{}, err
		} else if skip {
			continue
		}
		lc, ok := layers.m[name].(map[string]any)
		if !ok {
			return QuantDesc{}, layers.errorf(name, "want an object, got %s", describe(layers.m[name]))
		}
		at := config{m: lc, at: layers.at + name + "."}
		a, err := at.str("quant_algo", "")
		if err != nil {
			return QuantDesc{}, err
		}
		g2, err := at.intIn("group_size", int64(group), 1, maxDim)
		if err != nil {
			return QuantDesc{}, err
		}
		_, how := modelOptAlgo(a, g2)
		how = strings.TrimPrefix(how, "modelopt ")
		if g == GroupExperts {
			d.experts = append(d.experts, name)
		}
		switch prev := d.Groups[g]; {
		case prev == "":
			d.Groups[g], first[g] = how, name
		case prev != how && d.Detail == "" && (g == GroupExperts || g == GroupShared):
			d.Detail = fmt.Sprintf("quantized_layers: %s is %s but %s is %s; moeprep plans one %s format per checkpoint", first[g], prev, name, how, strings.TrimSuffix(g, "s"))
		}
	}
	return d, nil
}

// moduleGroup is the tensor group a module name of quantized_layers
// belongs to, by its segments: "" for none (embeddings, head).
func moduleGroup(name string) string {
	mlp := false
	for rest := name; rest != ""; {
		s, after, more := strings.Cut(rest, ".")
		rest = after
		last := !more
		switch {
		case s == "shared_expert_gate" && last:
			// Qwen's [1, H] sigmoid gate on the shared expert's output:
			// a router of sorts, not one of the shared MLP's projections.
			return GroupRouter
		case strings.HasPrefix(s, "shared_expert") || s == "shared_mlp":
			return GroupShared
		case s == "experts":
			return GroupExperts
		case strings.Contains(s, "attn") || s == "attention":
			return GroupAttention
		case (s == "gate" || s == "router") && last:
			return GroupRouter
		case s == "mlp" || s == "ffn" || s == "feed_forward":
			mlp = true
		}
	}
	if mlp {
		return GroupDenseMLP
	}
	return ""
}

func classifyCT(q config, file, key string, mods *quantModules) (QuantDesc, error) {
	topFmt, err := q.str("format", "")
	if err != nil {
		return QuantDesc{}, err
	}
	groups, _, err := q.object("config_groups")
	if err != nil {
		return QuantDesc{}, err
	}
	if len(groups.m) > maxQuantLayers {
		return QuantDesc{}, q.errorf("config_groups", "%d entries, over the limit of %d", len(groups.m), maxQuantLayers)
	}
	m, err := newMatcher(q, mods, syntaxRe, "ignore")
	if err != nil {
		return QuantDesc{}, err
	}
	d := QuantDesc{File: file, Key: key}
	names := slices.Sorted(maps.Keys(groups.m))
	for _, gname := range names {
		g, _, err := groups.object(gname)
		if err != nil {
			return QuantDesc{}, err
		}
		kind, label, err := classifyCTScheme(g, topFmt)
		if err != nil {
			return QuantDesc{}, err
		}
		if d.Kind == "" {
			d.Kind, d.Label = kind, label
		} else if d.Label != label {
			d.Kind, d.Label = QuantKindMixed, "compressed-tensors (several schemes)"
		}
	}
	if d.Kind == "" {
		d.Kind, d.Label = QuantKindUnknown, "compressed-tensors (no config_groups)"
	}
	d.Groups, d.Detail, err = m.resolve(d.Label, false)
	return d, err
}

func classifyCTScheme(g config, topFmt string) (QuantKind, string, error) {
	f, err := g.str("format", topFmt)
	if err != nil {
		return "", "", err
	}
	w, ok, err := g.object("weights")
	if err != nil {
		return "", "", err
	}
	if !ok {
		return QuantKindUnknown, "compressed-tensors " + f + " (no weights scheme)", nil
	}
	typ, err := w.str("type", "int")
	if err != nil {
		return "", "", err
	}
	bits, err := w.intIn("num_bits", 8, 1, 64)
	if err != nil {
		return "", "", err
	}
	strategy, err := w.str("strategy", "tensor")
	if err != nil {
		return "", "", err
	}
	sym, err := w.boolean("symmetric", true)
	if err != nil {
		return "", "", err
	}
	gs, err := w.intIn("group_size", 0, 0, maxDim)
	if err != nil {
		return "", "", err
	}
	symS := "symmetric"
	if !sym {
		symS = "asymmetric"
	}
	switch {
	case typ == "int" && bits == 4 && f == "pack-quantized":
		if strategy == "group" {
			return QuantKindInt4Pack, fmt.Sprintf("compressed-tensors pack-quantized int4 (group %d, %s)", gs, symS), nil
		}
		return QuantKindInt4Pack, fmt.Sprintf("compressed-tensors pack-quantized int4 (%s, %s)", strategy, symS), nil
	case typ == "float" && bits == 4 && (f == "nvfp4-pack-quantized" || f != "mxfp4-pack-quantized" && gs == 16):
		return QuantKindNVFP4, fmt.Sprintf("compressed-tensors nvfp4-pack-quantized (group %d)", gs), nil
	case typ == "float" && bits == 4 && (f == "mxfp4-pack-quantized" || gs == 32):
		return QuantKindMXFP4, fmt.Sprintf("compressed-tensors mxfp4-pack-quantized (group %d)", gs), nil
	case typ == "float" && bits == 8 && strategy == "channel":
		return QuantKindFP8Channel, "compressed-tensors float-quantized fp8 per-channel", nil
	case typ == "float" && bits == 8 && strategy == "tensor":
		return QuantKindFP8Tensor, "compressed-tensors float-quantized fp8 per-tensor", nil
	case typ == "float" && bits == 8 && strategy == "block":
		bs, err := w.ints("block_structure")
		if err != nil {
			return "", "", err
		}
		return QuantKindFP8BlockCT, fmt.Sprintf("compressed-tensors float-quantized fp8 block %v (weight_scale, not weight_scale_inv)", bs), nil
	}
	return QuantKindUnknown, fmt.Sprintf("compressed-tensors %s %s%d %s (%s)", f, typ, bits, strategy, symS), nil
}

// HFQuantConfigs is what a Tensors may also implement to hand family the
// decoded hf_quant_config.json of the checkpoint directory (nil when it has
// none); checkpoint.Checkpoint does.
type HFQuantConfigs interface {
	HFQuantConfig() map[string]any
}

func hfQuantOf(t Tensors) map[string]any {
	if h, ok := t.(HFQuantConfigs); ok {
		return h.HFQuantConfig()
	}
	return nil
}

// refuseQuant refuses the first description moeprep cannot carry, its
// ignore lists resolved under layers (detectQuant).
func refuseQuant(raw map[string]any, t Tensors, layers []string) error {
	return eachQuantDesc(raw, t, layers, func(d QuantDesc) error {
		if !d.Supported() {
			return d.Refusal()
		}
		return nil
	})
}
