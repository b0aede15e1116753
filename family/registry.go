package family

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/moeprep/moeprep/internal/suggest"
)

// families lists every supported family, in the order All reports them.
var families = []*spec{deepseek, qwen2MoE, qwen3MoE, mixtral,
	glm4MoELite, exaoneMoE, hyV3, afmoe, minimaxM2, ernie45MoE, olmoe, jamba, cohere2MoE,
	graniteMoE, graniteMoESWA, phimoe, llama4, gptOSS, deepseekV4, inkling,
	dots1, hunyuanV1MoE, flexOlmo, lfm2MoE, dbrx, solarOpen, mimoV2Flash,
	mellum, graniteMoEHybrid, axk1, axk2, deepseekV32, glmMoEDsa, mistral4, kimiLinear, laguna, hyV4, step3p5, gemma4, longcatFlash, nemotronH}

// unsupported are the MoE model types transformers ships that moeprep
// refuses, each with the reason a user needs.
var unsupported = map[string]string{
	"jetmoe": "JetMoE's MoE MLP adds a block output bias (mlp.bias [H]) after the weighted expert sum, and its attention is itself a mixture of attention heads with a router of its own (self_attention.experts), which moeprep's MoE layer model, a bias-free expert bank, cannot express",
	"youtu":  "Youtu-LLM is a dense model (MLA attention and one SwiGLU MLP in every layer): it has no MoE layer to convert",
	// issue 30, read from transformers 5.17.0's sources
	"zaya":                  "ZAYA's router is an MLP (down_proj, two GELU layers, out_proj) fed router states carried from the previous layer, and routes to a skip expert with no compute, which moeprep's linear router and SwiGLU bank cannot express",
	"doge":                  "Doge's CDMoE retrieves product-key experts that are embedding rows (down_embed, up_embed), not SwiGLU MLPs, which moeprep's expert bank cannot hold",
	"openai_privacy_filter": "OpenAI Privacy Filter is a bidirectional token classifier, not a language model, and its experts (concatenated gate|up with gpt-oss's clamped activation) and router (softmax over the top-k logits divided by k) are planned for no model moeprep converts",
	"switch_transformers":   "Switch Transformers is an encoder-decoder model with top-1 routed experts in both stacks; moeprep converts decoder-only language models",
	"nllb_moe":              "NLLB-MoE is an encoder-decoder translation model with top-2 routed experts in both stacks; moeprep converts decoder-only language models",
	"vitpose":               "ViTPose is a vision model (pose estimation) whose backbone's 'experts' are per-dataset output slices chosen by a dataset index, not routed MoE experts",
	"vitpose_backbone":      "ViTPose's backbone is a vision model whose 'experts' are per-dataset output slices chosen by a dataset index, not routed MoE experts",
	"bamba":                 "Bamba is a dense Mamba-2/attention hybrid: it has no MoE experts to convert",
	"evolla":                "Evolla is a dense protein-language model: it has no MoE experts to convert",
	"pi0":                   "PI0 is a dense vision-language-action model: it has no MoE experts to convert",
	"decision_transformer":  "Decision Transformer is a dense GPT-2 policy model: it has no MoE experts to convert",
	// issue 30's multimodal wrappers and text models moeprep cannot carry exactly
	"cosmos3_omni": "Cosmos3-Omni is not a MoE model: its language model is a dense Qwen3-VL text model, and its generator expert (Mixture-of-Transformers, moe_gen) is a second transformer tower that transformers drops on load; there are no routed experts to plan",
}

// All returns every supported family.
func All() []Family {
	out := make([]Family, len(families))
	for i, f := range families {
		out[i] = f
	}
	return out
}

// SupportedModelTypes lists every config.json model_type moeprep plans, sorted.
func SupportedModelTypes() []string {
	var out []string
	for _, f := range families {
		out = append(out, f.types()...)
	}
	slices.Sort(out)
	return out
}

// FuseSharedModelTypes lists, sorted, the model types (and the multimodal
// wrappers of such text models) whose shared expert
// fuse-shared can append to the expert bank as constant-weight slots, where
// a checkpoint has one: the family names a shared expert that no per-token
// gate, router row or input scaling ties to the token. (A checkpoint may
// still be refused for what its config holds: no shared expert, or shared
// biases the routed experts lack.)
func FuseSharedModelTypes() []string {
	var out []string
	for _, f := range families {
		if f.fusable() {
			out = append(out, f.types()...)
		}
	}
	for _, w := range wrappers {
		if textFamily(w.textTypes[0]).fusable() && w.unfusable == "" {
			out = append(out, w.modelType)
		}
	}
	for _, mt := range SupportedTextAlone() {
		if textFamily(mt).fusable() {
			out = append(out, mt)
		}
	}
	slices.Sort(out)
	return out
}

// SupportedTextAlone lists, sorted, the model types of the wrappers' text
// models that no bare family names, read when transformers saved the text
// model alone (its *ForCausalLM on the text config: model.layers.L, the
// family's own names).
func SupportedTextAlone() []string {
	var out []string
	for _, f := range wrappedTextFamilies {
		for _, mt := range f.types() {
			if _, ok := notSavedAlone[mt]; !ok {
				out = append(out, mt)
			}
		}
	}
	slices.Sort(out)
	return out
}

// fusable: the family names a shared expert that no per-token gate, router
// row or input scaling ties to the token.
func (s *spec) fusable() bool {
	return s.names.shared != "" && !s.keys.sharedGated && s.sharedUnfusable == ""
}

func lookup(modelType string) (*spec, error) {
	for _, f := range families {
		if slices.Contains(f.types(), modelType) {
			return f, nil
		}
	}
	// A wrapper's text model saved alone (its *ForCausalLM on the text
	// config): the family, under model.layers.L (wrapped_text.go).
	for _, f := range wrappedTextFamilies {
		if !slices.Contains(f.types(), modelType) {
			continue
		}
		if where, ok := notSavedAlone[modelType]; ok {
			w := wrapperHolding(modelType)
			return nil, fmt.Errorf("config.json: model_type %q is the text model of the %s wrapper, and transformers 5.17 has no class that saves it alone (no causal-LM or base model for its config), so moeprep reads it only inside the wrapper: %s", modelType, w.modelType, where)
		}
		return f.alone(), nil
	}
	if why, ok := unsupported[modelType]; ok {
		return nil, fmt.Errorf("config.json: model_type %q is not supported: %s", modelType, why)
	}
	// The closest names, not all 48: the full list is in --help.
	known := slices.Concat(SupportedModelTypes(), SupportedWrappers(), SupportedTextAlone())
	return nil, fmt.Errorf("config.json: model_type %q is not supported%s (`moeprep --help` lists the %d text model types, %d wrappers and %d wrappers' text models saved alone moeprep reads)",
		modelType, suggest.Phrase(modelType, known), len(SupportedModelTypes()), len(SupportedWrappers()), len(SupportedTextAlone()))
}

// namesExperts reports whether a config says anything of experts: a key
// naming them, at the top or in a nested text or language config. A
// config that does not is a dense model, with nothing for moeprep to do.
func namesExperts(config map[string]any) bool {
	for _, m := range []any{config, config["text_config"], config["language_config"], config["llm_config"]} {
		c, ok := m.(map[string]any)
		if !ok {
			continue
		}
		for k := range c {
			if strings.Contains(strings.ToLower(k), "expert") || strings.HasPrefix(k, "moe_") || k == "ffn_config" {
				return true
			}
		}
	}
	return false
}

// wrapperHolding is the multimodal wrapper whose text config names
// modelType, nil if none does.
func wrapperHolding(modelType string) *wrapper {
	for i := range wrappers {
		if slices.Contains(wrappers[i].textTypes, modelType) {
			return &wrappers[i]
		}
	}
	return nil
}

// Lookup finds the family that handles a config.json model_type.
func Lookup(modelType string) (Family, error) {
	f, err := lookup(modelType)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// modelType reads config.json's model_type: a family's, or a multimodal
// wrapper's (wrapper.go). Other configs that nest the language model under
// text_config are named in the error.
func modelType(config map[string]any) (string, error) {
	if config == nil {
		return "", errors.New("config.json: no configuration")
	}
	v, ok := config["model_type"]
	if !ok || v == nil {
		return "", errors.New("config.json: model_type is missing")
	}
	mt, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("config.json: model_type: want a string, got %s", describe(v))
	}
	if wrapperOf(mt) != nil {
		return mt, nil
	}
	if _, err := lookup(mt); err != nil {
		if unsupported[mt] == "" && wrapperHolding(mt) == nil && !namesExperts(config) {
			return "", fmt.Errorf("config.json: model_type %q is a dense model (its config names no experts): it has no MoE layers for moeprep to prepare; serve it as it is", mt)
		}
		// A model type refused for a reason of its own is named with it alone.
		if _, nested := config["text_config"].(map[string]any); nested && unsupported[mt] == "" {
			return "", fmt.Errorf("%w; configs with the language model under text_config are not supported except the multimodal wrappers %s",
				err, strings.Join(SupportedWrappers(), ", "))
		}
		return "", err
	}
	return mt, nil
}

// Detect reads config.json's model_type and plans the checkpoint with its
// family. A checkpoint that is already moeprep output is refused with an
// error wrapping ErrAlreadyConverted.
func Detect(config map[string]any, tensors Tensors) (*Plan, error) {
	mt, err := modelType(config)
	if err != nil {
		return nil, err
	}
	if _, ok := config["moeprep"]; ok {
		return nil, errConvertedConfig()
	}
	if w := wrapperOf(mt); w != nil {
		return w.plan(config, tensors, false)
	}
	f, _ := lookup(mt)
	return f.planBare(config, tensors, false)
}

// PlanConverted plans a checkpoint whose experts are already stacked (moeprep
// output): sizes, routing, layer selection, routers and biases are planned
// and checked as in Detect; Layer.Experts is nil (the stacked names belong to
// the layout that wrote them); Layer.Shared is nil where fuse-shared folded
// the shared expert into the stack; WeightDType is that of the shared expert
// if one remains, else empty. NumExperts is the moeprep section's num_experts
// (the routed count) when present.
func PlanConverted(config map[string]any, tensors Tensors) (*Plan, error) {
	mt, err := modelType(config)
	if err != nil {
		return nil, err
	}
	if w := wrapperOf(mt); w != nil {
		return w.plan(config, tensors, true)
	}
	f, _ := lookup(mt)
	return f.planBare(config, tensors, true)
}

// PlanStored plans a moeprep output whose experts are stored as its source
// stores them (layout as-stored): the checkpoint is the source's but for
// config.json's contract, so it is planned as Detect plans the source, the
// contract left aside, and its Layer.Experts name DST's own tensors.
func PlanStored(config map[string]any, tensors Tensors) (*Plan, error) {
	hub := make(map[string]any, len(config))
	for k, v := range config {
		if k != "moeprep" {
			hub[k] = v
		}
	}
	return Detect(hub, tensors)
}
