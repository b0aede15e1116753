package family

// The text models that moeprep plans only inside their multimodal wrapper
// (wrapper.go): transformers 5.17 saves them there in a layout of their own,
// and a text model saved alone may differ (Qwen3-VL-MoE's text model alone
// has no conversion mapping, so its experts would be saved untransposed and
// unrenamed), so they are not listed among the families a bare config.json
// names.

// qwen35MoE is Qwen3.5/3.6 MoE's text model (Qwen3_5MoeSparseMoeBlock):
// every decoder layer is MoE, per-expert tensors as the hub layout
// (transformers 5.17 saves mlp.experts.E.{gate,up,down}_proj through its
// qwen2_moe conversion pattern), mlp.gate [E,H], and one shared expert
// mlp.shared_expert.*_proj of shared_expert_intermediate_size behind a
// per-token sigmoid gate mlp.shared_expert_gate [1,H]. The router
// (Qwen3_5MoeTopKRouter) is softmax top-k, always renormalised: the text
// config has no norm_topk_prob, decoder_sparse_step or mlp_only_layers (its
// class deletes them), so none is read.
var qwen35MoE = &spec{
	name:       "qwen3_5_moe",
	modelTypes: []string{"qwen3_5_moe_text"},
	names:      qwen2MoE.names,
	keys:       qwen2MoE.keys,
	layers:     everyLayer,
	routing:    softmaxNorm(true),
}

// qwen3VLMoE is Qwen3-VL-MoE's text model (Qwen3VLMoeTextSparseMoeBlock):
// Qwen3-MoE's layer rule (mlp_only_layers, decoder_sparse_step), no shared
// expert, softmax top-k always renormalised (Qwen3VLMoeTextTopKRouter), and
// the experts stacked on disk as mlp.experts.gate_up_proj and
// mlp.experts.down_proj in either orientation: the hub's checkpoints hold
// them transposed, [E, H, 2I] (gate columns, then up) and [E, I, H], and
// transformers 5.17's save_pretrained writes them as it holds them, [E, 2I, H]
// and [E, H, I] (its Transpose(check_dims) loads whichever shape differs
// from its own and reverses nothing on save). The shapes say which.
var qwen3VLMoE = &spec{
	name:       "qwen3_vl_moe",
	modelTypes: []string{"qwen3_vl_moe_text"},
	names:      stackedHubNames("mlp", "gate", "", "experts.gate_up_proj", "experts.down_proj", eitherWayStacks),
	keys:       configKeys{intermediate: "moe_intermediate_size"},
	layers:     sparseStep,
	defaults:   map[string]any{"decoder_sparse_step": 1.0, "mlp_only_layers": []any{}},
	routing:    softmaxNorm(true),
}

// glm4vMoEText is GLM-4.5V's text model (Glm4vMoeTextMoE): GLM-4.5's MoE
// block as the deepseek family plans it (Glm4vMoeTextTopkRouter: fp32
// sigmoid, correction bias, groups by the sum of their top 2, weights
// normalised +1e-20, times routed_scaling_factor; one shared expert),
// layers from first_k_dense_replace, with Glm4vMoeTextConfig's defaults,
// which are Glm4MoeConfig's.
var glm4vMoEText = func() *spec {
	s := *deepseek
	s.modelTypes = []string{"glm4v_moe_text"}
	s.defaultsByType = map[string]map[string]any{"glm4v_moe_text": glm4MoEDefaults}
	s.aloneNames = stackedInMemory
	return &s
}()

// stackedInMemory is how transformers 5.17 saves the base text model of a
// DeepSeek-style wrapper (Glm4vMoeTextModel, Glm5NextTextModel: there is
// no causal-LM class for their text configs) alone: no conversion mapping
// applies, so the routed experts are saved as it holds them,
// mlp.experts.gate_up_proj [E, 2I, H] (gate rows, then up) and
// mlp.experts.down_proj [E, H, I]; router, correction bias and shared
// experts keep their per-projection names.
func stackedInMemory(n *naming) {
	n.stackedGateUp, n.stackedDown = "experts.gate_up_proj", "experts.down_proj"
}

// qwen4ExpText is Qwen4-Exp's text model (Qwen4ExpTextSparseMoeBlock =
// Qwen3-Next's block, transformers 5.17): every decoder layer is MoE,
// per-expert mlp.experts.E.{gate,up,down}_proj (its mapping is Qwen3.5's
// plus a concatenation of the n-gram embedding shards, which are copied),
// mlp.gate [E,H], and one shared expert mlp.shared_expert.*_proj of
// shared_expert_intermediate_size behind a per-token sigmoid gate
// mlp.shared_expert_gate [1,H]: not fusable. Qwen4ExpTextTopKRouter:
// softmax of the logits in f32, top-k, renormalised when norm_topk_prob
// (default true). The hyper-connection mixers, per-layer embeddings and the
// QSA indexer lie outside the block and are copied.
var qwen4ExpText = &spec{
	name:       "qwen4_exp",
	modelTypes: []string{"qwen4_exp_text"},
	names:      qwen2MoE.names,
	keys:       qwen2MoE.keys,
	layers:     everyLayer,
	defaults:   map[string]any{"norm_topk_prob": true, "num_experts_per_tok": 10.0},
	routing:    softmaxRouting,
}

// qwen3OmniMoEText is Qwen3-Omni-MoE's thinker text model
// (Qwen3OmniMoeThinkerTextSparseMoeBlock): Qwen3-MoE's block, names (the
// qwen2_moe conversion pattern: mlp.experts.E.*_proj, mlp.gate) and layer
// rule (mlp_only_layers, decoder_sparse_step), softmax top-k renormalised
// when norm_topk_prob, which Qwen3OmniMoeTextConfig defaults to true. No
// shared expert (the talker's MoE has one; it is carried).
var qwen3OmniMoEText = &spec{
	name:       "qwen3_omni_moe",
	modelTypes: []string{"qwen3_omni_moe_text"},
	names:      qwen3MoE.names,
	keys:       qwen3MoE.keys,
	layers:     sparseStep,
	defaults:   map[string]any{"decoder_sparse_step": 1.0, "norm_topk_prob": true, "mlp_only_layers": []any{}},
	routing:    softmaxRouting,
}

// alone is the family as it plans its text model saved alone: under
// model.layers.L (its *ForCausalLM) or layers.L (its base text model, where
// transformers has no causal-LM class for the text config), with the names
// below the layer the wrapper's unless aloneNames says otherwise.
func (s *spec) alone() *spec {
	out := *s
	out.names.layers, out.names.layersAlt = "model.layers.", []string{"layers."}
	if s.aloneNames != nil {
		s.aloneNames(&out.names)
	}
	return &out
}

// notSavedAlone are the wrapped text models transformers 5.17 has no class
// to save alone (no *ForCausalLM and no base model for the text config:
// fixtures/hf/export-text-only-log.txt), so no checkpoint of one alone is
// read: each with where it is read instead.
var notSavedAlone = map[string]string{
	"qwen3_omni_moe_text":  "read it inside qwen3_omni_moe, or its thinker saved alone (qwen3_omni_moe_thinker)",
	"deepseek_ocr2_text":   "read it inside deepseek_ocr2",
	"ernie4_5_vl_moe_text": "read it inside ernie4_5_vl_moe",
	// no transformers release ships DeepSeek-V4.1 at all
	"deepseek_v41_text": "read it inside deepseek_v41, its release's composite config",
}

// wrappedTextFamilies are the families planned only inside a wrapper, and
// (alone) their text models saved alone.
var wrappedTextFamilies = []*spec{qwen35MoE, qwen3VLMoE, glm4vMoEText, qwen4ExpText, qwen3OmniMoEText, minimaxM3, aria, deepseekOcr2Text, glm5NextText, ernie45VLText, deepseekV41Text}
