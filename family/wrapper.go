package family

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// A wrapper is a multimodal model whose config.json holds its language
// model's config under one key and whose checkpoint holds that model's
// decoder layers under a name prefix of its own, beside a vision tower, a
// projector and whatever else the wrapper has. moeprep plans the text model
// with its family, as data: which key, which text model types, which
// prefixes. Everything outside the text model's MoE layers is carried byte
// for byte, as for any family; config.json is kept whole.
type wrapper struct {
	modelType string // config.json's model_type
	// textKey is the key of the text model's config; dots name a path
	// through nested configs ("thinker_config.text_config").
	textKey string
	// textTypes are the text config's model_types the wrapper holds; the
	// first is the one transformers assumes when the text config names none.
	textTypes []string
	// layers are the text decoder layers' name prefixes, each followed by
	// the layer index; the first that any tensor name starts with is used.
	layers []string
	// text are the name prefixes of the whole text model (embeddings,
	// layers, final norm, head); every other tensor belongs to the rest of
	// the wrapper, which inspect lists as carried.
	text []string
	// anyTextType: the wrapper's config class builds its text config as
	// textTypes[0] whatever model_type the text config names (it pops it).
	anyTextType bool
	// names, keyed by one of layers, rewrites the family's naming for a
	// checkpoint whose layers that prefix names: the tensor names below it
	// where the layout differs from the one the family plans (Inkling's
	// hub layout: w13_weight, gate and up rows interleaved).
	names map[string]func(*naming)
	// unfusable, when set, is why fuse-shared does not apply to the
	// wrapper though its text family's shared expert fuses (Kimi K3's
	// latent MoE).
	unfusable string
}

// wrappers are the multimodal wrappers moeprep reads, each as transformers
// 5.17 saves it (fixtures/hf/export_wrappers.py) and, where the hub's
// release names its layers otherwise, as the hub does.
var wrappers = []wrapper{
	// Qwen3.5/3.6 MoE: model.language_model.layers.L, model.visual.*, lm_head.
	{modelType: "qwen3_5_moe", textKey: "text_config", textTypes: []string{"qwen3_5_moe_text"},
		layers: []string{"model.language_model.layers."}, text: []string{"model.language_model.", "lm_head."}},
	// Llama 4 Scout/Maverick as released: language_model.model.layers.L,
	// language_model.lm_head, vision_model.*, multi_modal_projector.*.
	{modelType: "llama4", textKey: "text_config", textTypes: []string{"llama4_text"},
		layers: []string{"language_model.model.layers."}, text: []string{"language_model."}},
	// Kimi-K2.5/2.6: DeepSeek-V3's text model (kimi_k2 on the hub; transformers
	// rewrites it to deepseek_v3, its default) under language_model.model.layers.L
	// on the hub; transformers 5.17's save renames the layers
	// language_model.model.blocks.L. vision_tower.*, mm_projector.*.
	{modelType: "kimi_k25", textKey: "text_config", textTypes: []string{"deepseek_v3", "kimi_k2"},
		layers: []string{"language_model.model.layers.", "language_model.model.blocks."}, text: []string{"language_model."}},
	// Kimi K3: Kimi-Linear's text model with a latent MoE (family/kimi_linear.go)
	// under language_model.layers.L on disk, which vLLM's and SGLang's
	// mappers both rename language_model.model.layers.L on load (either is
	// read); vision_tower.*, mm_projector.*. Both engines build the text
	// config as their KimiLinearConfig whatever it names.
	{modelType: "kimi_k3", textKey: "text_config", textTypes: []string{"kimi_linear"}, anyTextType: true,
		layers: []string{"language_model.layers.", "language_model.model.layers."}, text: []string{"language_model."},
		unfusable: "its shared experts read the hidden state and its routed experts the latent"},
	// Qwen3-VL-MoE: as Qwen3.5, experts stacked on disk (either orientation).
	{modelType: "qwen3_vl_moe", textKey: "text_config", textTypes: []string{"qwen3_vl_moe_text"},
		layers: []string{"model.language_model.layers."}, text: []string{"model.language_model.", "lm_head."}},
	// GLM-4.5V: as Qwen3.5, GLM-4.5's MoE.
	{modelType: "glm4v_moe", textKey: "text_config", textTypes: []string{"glm4v_moe_text"},
		layers: []string{"model.language_model.layers."}, text: []string{"model.language_model.", "lm_head."}},
	// Qwen4-Exp: as Qwen3.5 (Qwen3-Next's block, a gated shared expert).
	{modelType: "qwen4_exp", textKey: "text_config", textTypes: []string{"qwen4_exp_text"},
		layers: []string{"model.language_model.layers."}, text: []string{"model.language_model.", "lm_head."}},
	// Qwen3-Omni-MoE: the thinker's text model (Qwen3-MoE's block) under
	// thinker.model.layers.L (its config at thinker_config.text_config),
	// thinker.lm_head; thinker.audio_tower.*, thinker.visual.*, the talker
	// (its own MoE with a gated shared expert, talker.model.layers.L) and
	// code2wav.* are carried byte for byte.
	{modelType: "qwen3_omni_moe", textKey: "thinker_config.text_config", textTypes: []string{"qwen3_omni_moe_text"},
		layers: []string{"thinker.model.layers."}, text: []string{"thinker.model.", "thinker.lm_head."}},
	// Qwen3-Omni-MoE's thinker saved alone (Qwen3OmniMoeThinkerForConditionalGeneration,
	// model_type qwen3_omni_moe_thinker): the text model under model.layers.L,
	// model.*, lm_head; audio_tower.*, visual.* carried.
	{modelType: "qwen3_omni_moe_thinker", textKey: "text_config", textTypes: []string{"qwen3_omni_moe_text"},
		layers: []string{"model.layers.", "thinker.model.layers."}, text: []string{"model.", "thinker.model.", "lm_head.", "thinker.lm_head."}},
	// Aria: aria_text under the llava pattern: the hub's release holds it
	// as language_model.model.layers.L and language_model.lm_head,
	// transformers 5.17's modules as model.language_model.layers.L and
	// lm_head, and the llava mapping reversed on save (^model.language_model
	// -> language_model) would write language_model.layers.L; which one a
	// save writes the fixture run will say. vision_tower.*,
	// multi_modal_projector.* are carried.
	{modelType: "aria", textKey: "text_config", textTypes: []string{"aria_text"},
		layers: []string{"language_model.model.layers.", "model.language_model.layers.", "language_model.layers."},
		text:   []string{"language_model.", "model.language_model.", "lm_head."}},
	// MiniMax-M3-VL: its text model under language_model.model.layers.L
	// (the hub's names, which transformers 5.17's minimax_m3_vl mapping
	// writes back on save: block_sparse_moe, per-expert w1/w3/w2),
	// language_model.lm_head; vision_tower.*, multi_modal_projector.*,
	// patch_merge_mlp.*. transformers replaces the text config's
	// model_type with minimax_m3_vl_text whatever it says.
	{modelType: "minimax_m3_vl", textKey: "text_config", textTypes: []string{"minimax_m3_vl_text"}, anyTextType: true,
		layers: []string{"language_model.model.layers.", "model.language_model.layers."},
		text:   []string{"language_model.", "model.language_model.", "lm_head."}},
	// Inkling: inkling_text under model.language_model.layers.L as
	// transformers 5.17 holds it (experts.gate_up_proj, gate then up rows),
	// lm_head; model.audio_tower.*, model.vision_tower.*. transformers 5.17
	// saves it in the hub's layout (its inkling_mm_model mapping reversed):
	// model.llm.layers.L, model.llm.{embed,embed_norm,norm,unembed},
	// model.audio.*, model.visual.*, with the MoE names of inklingHub.
	{modelType: "inkling_mm_model", textKey: "text_config", textTypes: []string{"inkling_text"},
		layers: []string{"model.language_model.layers.", "model.llm.layers."},
		text:   []string{"model.language_model.", "model.llm.", "lm_head."},
		names:  map[string]func(*naming){"model.llm.layers.": inklingHub}},
	// DeepSeek-OCR-2: DeepSeek-V2's MoE text model (deepseek_ocr2.go). Its
	// conversion mapping moves (^|model.)layers., embed_tokens. and norm.
	// under language_model on load, so transformers saves the text model
	// as the hub holds it, model.layers.L, beside model.sam_model.*,
	// model.qwen2_model.*, model.projector.* and model.view_seperator.
	{modelType: "deepseek_ocr2", textKey: "text_config", textTypes: []string{"deepseek_ocr2_text"},
		layers: []string{"model.layers.", "model.language_model.layers."},
		text:   []string{"model.embed_tokens.", "model.layers.", "model.norm.", "model.language_model.", "lm_head."}},
	// GLM-5.3-Flash: GLM-5's DSA model with KDA layers, hyper-connections and
	// clamped experts (glm5_next.go) under model.language_model.layers.L,
	// model.visual.*, lm_head. A flat config.json (the text keys at the top
	// level, no text_config) is refused naming text_config.
	{modelType: "glm5_next", textKey: "text_config", textTypes: []string{"glm5_next_text"},
		layers: []string{"model.language_model.layers."}, text: []string{"model.language_model.", "lm_head."}},
	// Step-3.7: step3p5's text model (step3p5.go). transformers 5.17 holds
	// it under model.language_model.layers.L and saves the hub's names
	// (its step3p7 mapping reversed): model.layers.L, model.embed_tokens,
	// model.norm, lm_head, beside vision_model.* and vit_large_projector.*.
	{modelType: "step3p7", textKey: "text_config", textTypes: []string{"step3p5"},
		layers: []string{"model.layers.", "model.language_model.layers."},
		text:   []string{"model.embed_tokens.", "model.layers.", "model.norm.", "model.language_model.", "lm_head."}},
	// Gemma 4: gemma4_text (gemma4.go) under model.language_model.layers.L,
	// model.vision_tower.*, model.embed_vision.* (and model.audio_tower.*,
	// model.embed_audio.* where it has audio); the head is tied to the
	// embeddings.
	{modelType: "gemma4", textKey: "text_config", textTypes: []string{"gemma4_text"},
		layers: []string{"model.language_model.layers."}, text: []string{"model.language_model.", "lm_head."}},
	// DiffusionGemma: Gemma 4's MoE text model (diffusion_gemma_text) in an
	// encoder and a diffusion decoder whose layers' weights are tied
	// (DiffusionGemmaModel._tied_weights_keys): transformers saves one copy,
	// the decoder's, model.decoder.layers.L, and the encoder's untied
	// buffers (model.encoder.language_model.layers.L.layer_scalar); converting
	// the decoder's layers converts the weights both run.
	// model.decoder.self_conditioning.*, model.encoder.vision_tower.*,
	// model.encoder.embed_vision.* are carried.
	{modelType: "diffusion_gemma", textKey: "text_config", textTypes: []string{"diffusion_gemma_text"},
		layers: []string{"model.decoder.layers."}, text: []string{"model.decoder.", "model.encoder.language_model.", "lm_head."}},
	// ERNIE-4.5-VL MoE: ernie4_5_vl_moe_text (ernie4_5_vl_moe.go), two
	// routed banks a layer. transformers 5.17 holds it under
	// model.language_model.layers.L and saves the hub's names (its
	// ernie4_5_vl_moe mapping reversed): model.layers.L, model.embed_tokens,
	// model.norm, lm_head, beside vision_tower.* (the hub's vision_model.*)
	// and model.resampler_model.*.
	{modelType: "ernie4_5_vl_moe", textKey: "text_config", textTypes: []string{"ernie4_5_vl_moe_text"},
		layers: []string{"model.layers.", "model.language_model.layers."},
		text:   []string{"model.embed_tokens.", "model.layers.", "model.norm.", "model.language_model.", "lm_head."}},
	// DeepSeek-V4.1 (deepseek_v41.go): its release's composite config, the
	// text model under text_config, the quantization_config at the top;
	// DeepSeek's own names, layers.L, embed.weight, norm.weight, head.weight
	// and the hyper-connection head (hc_head_*); the MTP layers (mtp.N),
	// vision tower (vision.*, aligner.*, image_*) and the rest carried.
	{modelType: "deepseek_v41", textKey: "text_config", textTypes: []string{"deepseek_v41_text"},
		layers: []string{"layers."}, text: []string{"layers.", "embed.", "norm.", "head.", "hc_head_"}},
}

// inklingHub is Inkling's MoE block in the hub's layout, which
// transformers 5.17's inkling_mm_model mapping reads (and writes back on
// save): routed experts mlp.experts.w13_weight [E, 2I, H] and w2_weight
// [E, H, I]; shared experts mlp.shared_experts.shared_w13_weight [S, 2I, H]
// and shared_w2_weight [S, H, I]; the correction bias mlp.gate.bias. Both
// w13 tensors interleave each expert's gate and up rows: the mapping's
// Interleave(dim=1) splits row r into [r/2, r%2] and swaps the two, so the
// gate is rows 0, 2, 4, ... and the up rows 1, 3, 5, ... (planned as
// strided row views, "[e][R:0:I:2]" and "[e][R:1:I:2]"). The router
// (gate.weight [E+S, H]) and gate.global_scale keep their names.
func inklingHub(n *naming) {
	n.stackedGateUp, n.stackedDown, n.stackedInterleaved = "experts.w13_weight", "experts.w2_weight", true
	n.bias = "gate.bias"
	n.sharedStackedGateUp, n.sharedStackedDown = "shared_w13_weight", "shared_w2_weight"
}

// Wrapper says where in a multimodal wrapper the planned text model lives.
type Wrapper struct {
	ModelType     string // config.json's model_type, e.g. "qwen3_5_moe"
	TextConfig    string // the key of the text model's config, "text_config"
	TextModelType string // the text model's model_type, which the family plans
	// Layers is the text decoder layers' name prefix, followed by the
	// index: "model.language_model.layers."
	Layers string
	// Text are the name prefixes of the whole text model; every tensor
	// outside them is the rest of the wrapper, carried byte for byte.
	Text []string
}

// SupportedWrappers lists, sorted, the multimodal wrapper model_types
// moeprep plans (the text model inside them).
func SupportedWrappers() []string {
	out := make([]string, len(wrappers))
	for i, w := range wrappers {
		out[i] = w.modelType
	}
	slices.Sort(out)
	return out
}

func wrapperOf(modelType string) *wrapper {
	for i := range wrappers {
		if wrappers[i].modelType == modelType {
			return &wrappers[i]
		}
	}
	return nil
}

// textFamily finds the family that plans a text model type: a bare
// family, or one planned only inside a wrapper.
func textFamily(modelType string) *spec {
	for _, f := range append(slices.Clone(families), wrappedTextFamilies...) {
		if slices.Contains(f.types(), modelType) {
			return f
		}
	}
	return nil
}

// plan plans the text model of a wrapper's checkpoint: its family, run on
// the text config with the wrapper's layer prefix.
func (w *wrapper) plan(raw map[string]any, t Tensors, converted bool) (*Plan, error) {
	c := config{m: raw}
	tc, ok, err := c, true, error(nil)
	for _, key := range strings.Split(w.textKey, ".") {
		if tc, ok, err = tc.object(key); err != nil || !ok {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("config.json: model_type %q keeps its language model's config under %s, which is missing", w.modelType, w.textKey)
	}
	mt, err := tc.str("model_type", w.textTypes[0])
	if err != nil {
		return nil, err
	}
	if w.anyTextType {
		mt = w.textTypes[0]
	}
	s := textFamily(mt)
	if !slices.Contains(w.textTypes, mt) || s == nil {
		return nil, fmt.Errorf("config.json: %s.model_type %q: a %s wrapper holds %s", w.textKey, mt, w.modelType, strings.Join(w.textTypes, " or "))
	}
	inner := *s
	inner.names.layers, inner.names.layersAlt = w.layerPrefix(t), nil
	if rename := w.names[inner.names.layers]; rename != nil {
		rename(&inner.names)
	}
	inner.textLayers = inner.names.layers
	text := maps.Clone(tc.m)
	text["model_type"] = mt
	moved, err := w.quantInText(c, text)
	if err != nil {
		return nil, err
	}
	p, err := inner.planBare(text, t, converted)
	if err != nil {
		return nil, inTextConfig{key: w.textKey, err: err, top: moved}
	}
	p.Wrapper = &Wrapper{ModelType: w.modelType, TextConfig: w.textKey, TextModelType: mt, Layers: inner.names.layers,
		Text: slices.Clone(w.text)}
	return p, nil
}

// quantKeys are the keys of a quantisation description that a wrapper's
// config.json may hold at its top level (Qwen3.5's and Qwen3-VL's FP8
// releases) rather than in its text config (Kimi-K2.5's).
var quantKeys = []string{"quantization_config", "compression_config"}

// quantInText puts a description at the wrapper's top level into text,
// the text config the family plans: it applies to the text model (what it
// says of the vision tower does not matter, which is carried byte for
// byte). Where the text config holds one too, the two must say the same.
// moved are the keys put there from the top level.
func (w *wrapper) quantInText(c config, text map[string]any) (moved []string, err error) {
	for _, key := range quantKeys {
		q, ok, err := c.object(key)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if in, ok := text[key]; ok && !reflect.DeepEqual(in, q.m) {
			return nil, fmt.Errorf("config.json: %s and %s.%s describe the quantisation differently; moeprep reads one description", key, w.textKey, key)
		} else if !ok {
			moved = append(moved, key)
		}
		text[key] = q.m
	}
	return moved, nil
}

// layerPrefix is the first of the wrapper's layer prefixes that a tensor
// name starts with (the first when none does: the plan then names it).
func (w *wrapper) layerPrefix(t Tensors) string {
	names := t.Names()
	for _, pre := range w.layers {
		for _, n := range names {
			if strings.HasPrefix(n, pre) {
				return pre
			}
		}
	}
	return w.layers[0]
}

// inTextConfig names the text config in an error about a key of it: the
// family's planner reads the text config as it reads a bare config.json.
// A key of top, a description the wrapper holds at its top level
// (quantInText), is named there.
type inTextConfig struct {
	key string
	err error
	top []string
}

func (e inTextConfig) Error() string {
	msg := e.err.Error()
	rest, ok := strings.CutPrefix(msg, "config.json: ")
	if !ok {
		return msg
	}
	for _, k := range e.top {
		if strings.HasPrefix(rest, k+".") || strings.HasPrefix(rest, k+":") {
			return msg
		}
	}
	return "config.json: " + e.key + ": " + rest
}

func (e inTextConfig) Unwrap() error { return e.err }
