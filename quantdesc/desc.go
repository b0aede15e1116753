// Package quantdesc reads how a checkpoint describes the quantisation of
// its weights, wherever that lives: config.json's quantization_config,
// text_config.quantization_config (multimodal wrappers),
// compression_config (older compressed-tensors), and hf_quant_config.json
// (ModelOpt). Detect classifies each description and resolves its
// ignore/exclude lists per tensor group (match.go: against the
// checkpoint's own modules of every layer); Desc.Supported says whether
// moeprep carries it, and Desc.Refusal words the one-line refusal of one it
// does not, so that none is read as bf16 or FP8 by mistake. The carried
// ones are read in full (read.go: Read, Int4Group, ReadHF) into
// weightfmt's quantization names; family plans each model family's
// tensors by them.
package quantdesc

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/moeprep/moeprep/internal/jsoncfg"
)

// Kind classifies a quantisation description.
type Kind string

const (
	KindNone       Kind = "none"
	KindFP8Block   Kind = "fp8-block-128x128"   // DeepSeek-style: weight_scale_inv per 128x128 (supported)
	KindFP8BlockCT Kind = "fp8-block-ct"        // compressed-tensors float-quantized, block strategy (weight_scale)
	KindInt4Pack   Kind = "int4-pack-quantized" // compressed-tensors pack-quantized
	KindMXFP4      Kind = "mxfp4"               // gpt-oss, or compressed-tensors mxfp4-pack-quantized
	KindNVFP4      Kind = "nvfp4"               // ModelOpt, or compressed-tensors nvfp4-pack-quantized
	KindMXFP8      Kind = "mxfp8"               // ModelOpt quant_algo MXFP8, or quant_method mxfp8 (MiniMax)
	KindFP8Channel Kind = "fp8-per-channel"     // weight_scale [out,1]
	KindFP8Tensor  Kind = "fp8-per-tensor"      // scalar weight_scale
	KindMixed      Kind = "mixed"               // several kinds over the groups
	KindUnknown    Kind = "unknown"             // anything else
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
	maxQuantPatterns   = jsoncfg.MaxList // entries of one list
	maxQuantRegexes    = 256             // re: patterns and globs compiled
	maxQuantPatternLen = 1024            // bytes of one entry
	maxQuantLayers     = jsoncfg.MaxList // quantized_layers entries
)

// Desc is one quantisation description as detected.
type Desc struct {
	File   string // "config.json" or "hf_quant_config.json"
	Key    string // "quantization_config", "text_config.quantization_config", "compression_config", "quantization"
	Kind   Kind
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
// wherever config.json holds it (Config reads the one description):
// FP8 128x128 blocks; FP8 per channel or per tensor (compressed-tensors
// float-quantized, or quant_method fp8 without weight_block_size; not
// ModelOpt's, whose activation scales are static); compressed-tensors
// pack-quantized INT4; gpt-oss's MXFP4; NVFP4 in groups of 16, ModelOpt's
// (config.json or hf_quant_config.json) or compressed-tensors'; MXFP8 in
// groups of 32, ModelOpt's (config.json or hf_quant_config.json) or
// quant_method mxfp8's. Read and the format's reader check the rest.
func (d Desc) Supported() bool {
	inConfig := d.File == "config.json"
	if d.Detail != "" {
		// One group in two formats: moeprep plans one per group.
		return false
	}
	switch d.Kind {
	case KindNone, KindFP8Block:
		return true
	case KindFP8Channel, KindFP8Tensor:
		return inConfig && !strings.HasPrefix(d.Label, "modelopt")
	case KindMXFP4:
		// gpt-oss's quant_method mxfp4 (family checks that the family is
		// gpt-oss) and compressed-tensors' mxfp4-pack-quantized in groups
		// of 32 (readCTFP4 checks the rest).
		return inConfig && (d.Label == "mxfp4" || d.Label == ctMXFP4Label)
	case KindInt4Pack:
		// readCTInt4 checks the rest: symmetric, group or channel, W4A16.
		return inConfig
	case KindNVFP4:
		return strings.HasPrefix(d.Label, "modelopt nvfp4 (group 16)") || d.Label == ctNVFP4Label && inConfig
	case KindMXFP8:
		// ModelOpt's in groups of 32 (readModelOpt checks the rest), and
		// quant_method mxfp8's (readMXFP8 checks its block and activations).
		return d.Label == modelOptMXFP8Label || d.Label == mxfp8Label && inConfig
	case KindMixed:
		// ModelOpt MIXED_PRECISION whose experts are all NVFP4 in groups of
		// 16 (attention and dense MLPs in any format: copied).
		return d.NVFP4Experts()
	}
	return false
}

// NVFP4Experts reports whether d is a ModelOpt MIXED_PRECISION
// description that moeprep carries as NVFP4: every routed expert entry
// NVFP4 in groups of 16, the shared expert's too where it names one.
func (d Desc) NVFP4Experts() bool {
	const nv = "nvfp4 (group 16)"
	sh := d.Groups[GroupShared]
	return d.Kind == KindMixed && strings.HasPrefix(d.Label, "modelopt") && d.Detail == "" &&
		d.Groups[GroupExperts] == nv && (sh == "" || sh == nv)
}

// CoversExperts reports whether a MIXED_PRECISION description's
// quantized_layers names the experts module e
// ("model.layers.3.mlp.experts") or a module under it.
func (d Desc) CoversExperts(e string) bool {
	i, found := slices.BinarySearch(d.experts, e)
	return found || i < len(d.experts) && strings.HasPrefix(d.experts[i], e+".")
}

// carriedFormats says which expert formats moeprep reads (FORMATS.md's format
// table), for refusals of anything else.
const carriedFormats = "moeprep reads bf16/f16/f32, FP8 (128x128 blocks, per-channel, per-tensor), compressed-tensors INT4 pack-quantized, MXFP4 (gpt-oss, compressed-tensors, DeepSeek-V4), ModelOpt NVFP4 and compressed-tensors NVFP4, MXFP8 (ModelOpt, quant_method mxfp8) experts"

// modelOptMXFP8Label and mxfp8Label are how ModelOpt's MXFP8 in groups of
// 32 and quant_method mxfp8 (MiniMax-M3-MXFP8) are labelled, the MXFP8
// descriptions moeprep may carry.
const (
	modelOptMXFP8Label = "modelopt mxfp8 (group 32)"
	mxfp8Label         = "mxfp8"
)

// ctMXFP4Label is how classifyCTScheme labels compressed-tensors MXFP4 in
// groups of 32, the one it may carry.
const ctMXFP4Label = "compressed-tensors mxfp4-pack-quantized (group 32)"

// ctNVFP4Label is how classifyCTScheme labels compressed-tensors NVFP4 in
// groups of 16, the one NVFP4 it may carry.
const ctNVFP4Label = "compressed-tensors nvfp4-pack-quantized (group 16)"

// Refusal is the one-line error for a description moeprep cannot carry.
func (d Desc) Refusal() error {
	why := "not carried yet; " + carriedFormats
	fp8Scaled := d.Kind == KindFP8Channel || d.Kind == KindFP8Tensor
	switch {
	case d.Detail != "":
		why = "not carried: " + d.Detail
	case fp8Scaled && strings.HasPrefix(d.Label, "modelopt"):
		why = "not carried: ModelOpt FP8 stores static activation scales (input_scale); moeprep reads FP8 with dynamic activations only"
	case fp8Scaled:
		why = "not carried yet: moeprep reads FP8 per-channel and per-tensor experts described by config.json only"
	case d.Kind == KindMXFP4:
		why = "not carried yet: moeprep reads MXFP4 experts in groups of 32 only (gpt-oss quant_method mxfp4, compressed-tensors mxfp4-pack-quantized, DeepSeek-V4 expert_dtype fp4)"
	case d.Kind == KindInt4Pack:
		why = "not carried yet: moeprep reads pack-quantized INT4 experts described by config.json only"
	case d.Kind == KindNVFP4:
		why = "not carried yet: moeprep reads NVFP4 experts in groups of 16 only (ModelOpt quant_algo NVFP4, compressed-tensors nvfp4-pack-quantized)"
	case d.Kind == KindMXFP8:
		why = "not carried yet: moeprep reads MXFP8 experts in groups of 32 only (ModelOpt quant_algo MXFP8 group_size 32, quant_method mxfp8 described by config.json)"
	case d.Kind == KindMixed && strings.HasPrefix(d.Label, "modelopt") && d.Groups[GroupExperts] == "nvfp4 (group 16)":
		why = fmt.Sprintf("not carried: the shared expert is %s beside NVFP4 routed experts; moeprep carries NVFP4 shared experts only (fusing or validating a shared expert of another format beside them is not built)", d.Groups[GroupShared])
	case d.Kind == KindMixed && strings.HasPrefix(d.Label, "modelopt"):
		why = "not carried yet: moeprep reads MIXED_PRECISION whose routed experts (and shared expert, where quantised) are NVFP4 in groups of 16; attention and dense MLPs may be anything, they are copied"
	}
	return fmt.Errorf("%s: %s: %s: %s", d.File, d.Key, d.Summary(), why)
}

// Summary says the format and, per group, what is quantised how.
func (d Desc) Summary() string {
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

// Detect reads every quantisation description of config.json (raw) and of
// hf_quant_config.json (hf may be nil) and classifies each, the ignore
// lists resolved against mods: the checkpoint's modules of each group in
// its text layers (a wrapper's under its text layer prefixes), or, for a
// group it has none of (mods nil: any), the representative names of
// groupNames. The FP8 block description of config.json's
// quantization_config is left to Read, which checks it in full.
func Detect(raw map[string]any, hf map[string]any, mods *Modules) ([]Desc, error) {
	var out []Desc
	top, _ := raw["expert_dtype"].(string)
	if err := configQuants(jsoncfg.Object{M: raw}, func(q jsoncfg.Object, key string) error {
		d, err := classify(q, "config.json", key, mods)
		if err != nil {
			return err
		}
		if dt, _ := q.M["expert_dtype"].(string); (top == "fp4" || dt == "fp4") && d.Groups[GroupExperts] != "" {
			// DeepSeek-V4: its experts FP4 beside FP8 (family's readExpertFP4).
			d.Groups[GroupExperts] = "mxfp4 (expert_dtype fp4)"
		}
		out = append(out, d)
		return nil
	}); err != nil {
		return nil, err
	}
	if hf != nil {
		h := jsoncfg.Object{M: hf}
		q, ok, err := h.Object("quantization")
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
func configQuants(c jsoncfg.Object, f func(q jsoncfg.Object, key string) error) error {
	visit := func(parent jsoncfg.Object, key string) error {
		q, ok, err := parent.Object(key)
		if err != nil || !ok {
			return err
		}
		return f(q, parent.At+key)
	}
	if err := visit(c, "quantization_config"); err != nil {
		return err
	}
	if tc, ok, err := c.Object("text_config"); err != nil {
		return err
	} else if ok {
		if err := visit(tc, "quantization_config"); err != nil {
			return err
		}
	}
	return visit(c, "compression_config")
}

// Config is config.json's quantisation description wherever it lives
// (configQuants), and its quant_method (compression_config's defaults to
// compressed-tensors, as only compressed-tensors wrote it); ok is false
// when there is none. Two descriptions must say the same: moeprep reads
// one.
func Config(c jsoncfg.Object) (q jsoncfg.Object, method string, ok bool, err error) {
	err = configQuants(c, func(d jsoncfg.Object, key string) error {
		if ok && !reflect.DeepEqual(d.M, q.M) {
			return fmt.Errorf("config.json: %s and %s describe the quantisation differently; moeprep reads one description", strings.TrimSuffix(q.At, "."), key)
		}
		if !ok {
			q, ok = d, true
		}
		return nil
	})
	if err != nil || !ok {
		return jsoncfg.Object{}, "", false, err
	}
	if method, err = q.Str("quant_method", ""); err != nil {
		return jsoncfg.Object{}, "", false, err
	}
	if method == "" && q.At == "compression_config." {
		method = "compressed-tensors"
	}
	return q, method, true, nil
}

// Conflicting is the refusal of a checkpoint whose config.json and
// hf_quant_config.json describe its weights differently (descs as
// Detect gives them, hf_quant_config.json's last): each file named
// with what it says, since moeprep cannot know which one the tensors
// follow.
func Conflicting(descs []Desc) error {
	hf := descs[len(descs)-1]
	if len(descs) < 2 {
		return hf.Refusal()
	}
	cfg := descs[0]
	return fmt.Errorf("%s: %s says %s, but %s: %s says %s; the two files describe the weights differently and moeprep reads one description (remove the one the tensors do not follow)",
		cfg.File, cfg.Key, cfg.Summary(), hf.File, hf.Key, hf.Summary())
}

// hfErr renames an error of jsoncfg's reads, which say config.json.
func hfErr(err error) error {
	return fmt.Errorf("hf_quant_config.json%s", strings.TrimPrefix(err.Error(), "config.json"))
}

func classify(q jsoncfg.Object, file, key string, mods *Modules) (Desc, error) {
	method, err := q.Str("quant_method", "")
	if err != nil {
		return Desc{}, err
	}
	if method == "" && key == "compression_config" {
		method = "compressed-tensors"
	}
	switch method {
	case "fp8":
		d := Desc{File: file, Key: key, Kind: KindFP8Tensor, Label: "fp8 per-tensor (no weight_block_size)"}
		if q.Has("weight_block_size") {
			// Read checks the block size and the rest.
			d.Kind, d.Label = KindFP8Block, "fp8 128x128 block"
			if b, err := q.Ints("weight_block_size"); err == nil && len(b) == 2 && b[0] == b[1] && b[0] != 128 {
				d.Label = fmt.Sprintf("fp8 %dx%d block", b[0], b[1])
			}
		}
		return d.quantisedBut(q, mods, "modules_to_not_convert", "ignored_layers")
	case "mxfp4":
		d := Desc{File: file, Key: key, Kind: KindMXFP4, Label: "mxfp4"}
		m, err := newMatcher(q, mods, syntaxRe, "modules_to_not_convert")
		if err != nil {
			return Desc{}, err
		}
		// gpt-oss quantises the experts only.
		d.Groups = map[string]string{}
		s, err := m.excluded(GroupExperts)
		if err != nil {
			return Desc{}, err
		}
		if !s.excluded {
			d.Groups[GroupExperts] = d.Label
		}
		return d, nil
	case "mxfp8":
		// MiniMax-M3-MXFP8: ignored_layers names what stays unquantised
		// (routers, vision tower, embeddings, head); readMXFP8 checks the
		// block and the activations.
		d := Desc{File: file, Key: key, Kind: KindMXFP8, Label: mxfp8Label}
		return d.quantisedBut(q, mods, "ignored_layers", "modules_to_not_convert")
	case "modelopt":
		return classifyModelOpt(q, file, key, mods)
	case "compressed-tensors":
		return classifyCT(q, file, key, mods)
	case "":
		return Desc{}, q.Missing("quant_method")
	}
	return Desc{}, q.Errorf("quant_method", "%q is not supported (only fp8 with 128x128 block scales)", method)
}

// quantisedBut gives every tensor group but the routers d.Label, except
// those the regular-expression ignore lists under keys leave unquantised
// (the keys a quant_method names its list by, read in this order); Detail
// names a routed or shared group the lists leave unquantised only in part.
func (d Desc) quantisedBut(q jsoncfg.Object, mods *Modules, keys ...string) (Desc, error) {
	m, err := newMatcher(q, mods, syntaxRe, keys...)
	if err != nil {
		return Desc{}, err
	}
	d.Groups, d.Detail, err = m.resolve(d.Label, false)
	return d, err
}

// modelOptAlgo names a ModelOpt quant_algo.
func modelOptAlgo(algo string, group int) (Kind, string) {
	switch strings.ToUpper(algo) {
	case "NVFP4", "W4A16_NVFP4", "NVFP4_AWQ":
		return KindNVFP4, fmt.Sprintf("modelopt nvfp4 (group %d)", group)
	case "FP8":
		return KindFP8Tensor, "modelopt fp8 per-tensor"
	case "FP8_PER_CHANNEL_PER_TOKEN":
		return KindFP8Channel, "modelopt fp8 per-channel"
	case "MXFP8":
		return KindMXFP8, fmt.Sprintf("modelopt mxfp8 (group %d)", group)
	}
	return KindUnknown, fmt.Sprintf("modelopt %s", strings.ToLower(algo))
}

func classifyModelOpt(q jsoncfg.Object, file, key string, mods *Modules) (Desc, error) {
	algo, err := q.Str("quant_algo", "")
	if err != nil {
		return Desc{}, err
	}
	if algo == "" {
		return Desc{}, q.Missing("quant_algo")
	}
	// NVFP4's group is 16; MXFP8's 32 (ModelOpt's config.json
	// quantization_config writes no group_size for it).
	defGroup := int64(16)
	if strings.EqualFold(algo, "MXFP8") {
		defGroup = 32
	}
	group, err := q.IntIn("group_size", defGroup, 1, jsoncfg.MaxDim)
	if err != nil {
		return Desc{}, err
	}
	m, err := newMatcher(q, mods, syntaxGlob, "exclude_modules", "ignore")
	if err != nil {
		return Desc{}, err
	}
	d := Desc{File: file, Key: key}
	if strings.ToUpper(algo) != "MIXED_PRECISION" {
		d.Kind, d.Label = modelOptAlgo(algo, group)
		d.Groups, d.Detail, err = m.resolve(d.Label, false)
		return d, err
	}
	d.Kind, d.Label = KindMixed, "modelopt MIXED_PRECISION"
	layers, ok, err := q.Object("quantized_layers")
	if err != nil {
		return Desc{}, err
	}
	if !ok {
		return Desc{}, q.Missing("quantized_layers")
	}
	if len(layers.M) > maxQuantLayers {
		return Desc{}, q.Errorf("quantized_layers", "%d entries, over the limit of %d", len(layers.M), maxQuantLayers)
	}
	// Each entry names a quantised module (a projection, or a layer's
	// whole experts: model.layers.L.mlp.experts); what it does not name
	// is unquantised. Per group: its one format, or the first two that
	// differ.
	d.Groups = map[string]string{}
	first := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(layers.M)) {
		g := moduleGroup(name)
		if g == "" {
			continue
		}
		if skip, err := m.matches(name); err != nil {
			return Desc{}, err
		} else if skip {
			continue
		}
		lc, ok := layers.M[name].(map[string]any)
		if !ok {
			return Desc{}, layers.Errorf(name, "want an object, got %s", jsoncfg.Describe(layers.M[name]))
		}
		at := jsoncfg.Object{M: lc, At: layers.At + name + "."}
		a, err := at.Str("quant_algo", "")
		if err != nil {
			return Desc{}, err
		}
		g2, err := at.IntIn("group_size", int64(group), 1, jsoncfg.MaxDim)
		if err != nil {
			return Desc{}, err
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

func classifyCT(q jsoncfg.Object, file, key string, mods *Modules) (Desc, error) {
	topFmt, err := q.Str("format", "")
	if err != nil {
		return Desc{}, err
	}
	groups, _, err := q.Object("config_groups")
	if err != nil {
		return Desc{}, err
	}
	if len(groups.M) > maxQuantLayers {
		return Desc{}, q.Errorf("config_groups", "%d entries, over the limit of %d", len(groups.M), maxQuantLayers)
	}
	m, err := newMatcher(q, mods, syntaxRe, "ignore")
	if err != nil {
		return Desc{}, err
	}
	d := Desc{File: file, Key: key}
	names := slices.Sorted(maps.Keys(groups.M))
	for _, gname := range names {
		g, _, err := groups.Object(gname)
		if err != nil {
			return Desc{}, err
		}
		kind, label, err := classifyCTScheme(g, topFmt)
		if err != nil {
			return Desc{}, err
		}
		if d.Kind == "" {
			d.Kind, d.Label = kind, label
		} else if d.Label != label {
			d.Kind, d.Label = KindMixed, "compressed-tensors (several schemes)"
		}
	}
	if d.Kind == "" {
		d.Kind, d.Label = KindUnknown, "compressed-tensors (no config_groups)"
	}
	d.Groups, d.Detail, err = m.resolve(d.Label, false)
	return d, err
}

func classifyCTScheme(g jsoncfg.Object, topFmt string) (Kind, string, error) {
	f, err := g.Str("format", topFmt)
	if err != nil {
		return "", "", err
	}
	w, ok, err := g.Object("weights")
	if err != nil {
		return "", "", err
	}
	if !ok {
		return KindUnknown, "compressed-tensors " + f + " (no weights scheme)", nil
	}
	typ, err := w.Str("type", "int")
	if err != nil {
		return "", "", err
	}
	bits, err := w.IntIn("num_bits", 8, 1, 64)
	if err != nil {
		return "", "", err
	}
	strategy, err := w.Str("strategy", "tensor")
	if err != nil {
		return "", "", err
	}
	sym, err := w.Bool("symmetric", true)
	if err != nil {
		return "", "", err
	}
	gs, err := w.IntIn("group_size", 0, 0, jsoncfg.MaxDim)
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
			return KindInt4Pack, fmt.Sprintf("compressed-tensors pack-quantized int4 (group %d, %s)", gs, symS), nil
		}
		return KindInt4Pack, fmt.Sprintf("compressed-tensors pack-quantized int4 (%s, %s)", strategy, symS), nil
	case typ == "float" && bits == 4 && (f == "nvfp4-pack-quantized" || f != "mxfp4-pack-quantized" && gs == 16):
		return KindNVFP4, fmt.Sprintf("compressed-tensors nvfp4-pack-quantized (group %d)", gs), nil
	case typ == "float" && bits == 4 && (f == "mxfp4-pack-quantized" || gs == 32):
		return KindMXFP4, fmt.Sprintf("compressed-tensors mxfp4-pack-quantized (group %d)", gs), nil
	case typ == "float" && bits == 8 && strategy == "channel":
		return KindFP8Channel, "compressed-tensors float-quantized fp8 per-channel", nil
	case typ == "float" && bits == 8 && strategy == "tensor":
		return KindFP8Tensor, "compressed-tensors float-quantized fp8 per-tensor", nil
	case typ == "float" && bits == 8 && strategy == "block":
		bs, err := w.Ints("block_structure")
		if err != nil {
			return "", "", err
		}
		return KindFP8BlockCT, fmt.Sprintf("compressed-tensors float-quantized fp8 block %v (weight_scale, not weight_scale_inv)", bs), nil
	}
	return KindUnknown, fmt.Sprintf("compressed-tensors %s %s%d %s (%s)", f, typ, bits, strategy, symS), nil
}
