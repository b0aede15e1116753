// Package handwrap holds checkpoints built by hand, as data: config.json
// and the shapes of the tensors, for the multimodal wrappers that
// transformers has not yet written a fixture of (issue 30). cktest writes
// them with drawn values; family's tests plan them from the shapes alone.
// It imports nothing of moeprep, so every package's tests can use it.
package handwrap

import "strconv"

// A Hand is a checkpoint built by hand: its config.json and the shape of
// every tensor.
type Hand struct {
	Config  map[string]any
	Tensors map[string][]int64
}

// addMLP adds one SwiGLU MLP's gate, up and down projections under pre.
func addMLP(ts map[string][]int64, pre string, proj [3]string, h, inter int64) {
	ts[pre+proj[0]+".weight"] = []int64{inter, h}
	ts[pre+proj[1]+".weight"] = []int64{inter, h}
	ts[pre+proj[2]+".weight"] = []int64{h, inter}
}

var hf = [3]string{"gate_proj", "up_proj", "down_proj"}

// Wrappers are hand-built checkpoints of issue 30's second set of
// wrappers, as transformers 5.17 saves them (by its conversion mappings,
// read from its source): H 16, I 8, 4 experts, top 2, two text layers,
// and the rest of the wrapper (towers, talker) carried. Keyed by the
// wrapper's model_type.
func Wrappers() map[string]Hand {
	const h, inter, e = 16, 8, 4
	out := map[string]Hand{}

	// Qwen3-Omni-MoE: the thinker's text model (layer 0 dense by
	// mlp_only_layers, layer 1 MoE), and a talker with its own MoE (a
	// gated shared expert) that is carried.
	ts := map[string][]int64{
		"thinker.model.embed_tokens.weight": {32, h}, "thinker.model.norm.weight": {h}, "thinker.lm_head.weight": {32, h},
		"thinker.audio_tower.conv2d1.weight": {4, 1, 3, 3}, "thinker.visual.patch_embed.proj.weight": {8, 12},
		"talker.model.layers.0.mlp.gate.weight": {e, h}, "talker.model.layers.0.mlp.shared_expert_gate.weight": {1, h},
		"code2wav.decoder.0.conv.weight": {4, 4, 3},
	}
	addMLP(ts, "thinker.model.layers.0.mlp.", hf, h, 24)
	ts["thinker.model.layers.1.mlp.gate.weight"] = []int64{e, h}
	for x := range e {
		addMLP(ts, "thinker.model.layers.1.mlp.experts."+itoa(x)+".", hf, h, inter)
		addMLP(ts, "talker.model.layers.0.mlp.experts."+itoa(x)+".", hf, h, inter)
	}
	addMLP(ts, "talker.model.layers.0.mlp.shared_expert.", hf, h, 12)
	for l := range 2 {
		ts["thinker.model.layers."+itoa(l)+".input_layernorm.weight"] = []int64{h}
	}
	out["qwen3_omni_moe"] = Hand{Config: map[string]any{
		"model_type": "qwen3_omni_moe", "enable_audio_output": true,
		"thinker_config": map[string]any{"model_type": "qwen3_omni_moe_thinker", "text_config": map[string]any{
			"model_type": "qwen3_omni_moe_text", "hidden_size": h, "num_hidden_layers": 2, "intermediate_size": 24,
			"moe_intermediate_size": inter, "num_experts": e, "num_experts_per_tok": 2, "mlp_only_layers": []int{0},
			"decoder_sparse_step": 1, "norm_topk_prob": true}},
		"talker_config": map[string]any{"text_config": map[string]any{
			"model_type": "qwen3_omni_moe_talker_text", "hidden_size": h, "num_hidden_layers": 1,
			"moe_intermediate_size": inter, "num_experts": e, "num_experts_per_tok": 2, "shared_expert_intermediate_size": 12}},
	}, Tensors: ts}

	// Aria: aria_text under language_model.model (the hub's names), every
	// layer MoE, experts stacked transposed (fc1 [E, H, 2I], fc2 [E, I, H]),
	// two shared experts.
	ts = map[string][]int64{
		"language_model.model.embed_tokens.weight": {32, h}, "language_model.model.norm.weight": {h},
		"language_model.lm_head.weight": {32, h}, "vision_tower.embeddings.patch_embedding.weight": {8, 3, 2, 2},
		"multi_modal_projector.query": {4, 8}, "multi_modal_projector.feed_forward.linear_in.weight": {h, 8},
	}
	for l := range 2 {
		pre := "language_model.model.layers." + itoa(l) + ".mlp."
		ts[pre+"router.weight"] = []int64{e, h}
		ts[pre+"experts.fc1.weight"] = []int64{e, h, 2 * inter}
		ts[pre+"experts.fc2.weight"] = []int64{e, inter, h}
		addMLP(ts, pre+"shared_experts.", hf, h, 2*inter)
	}
	out["aria"] = Hand{Config: map[string]any{
		"model_type": "aria", "vision_config": map[string]any{"model_type": "idefics3_vision", "hidden_size": 8},
		"text_config": map[string]any{"model_type": "aria_text", "hidden_size": h, "num_hidden_layers": 2,
			"intermediate_size": inter, "moe_num_experts": e, "moe_topk": 2, "moe_num_shared_experts": 2, "hidden_act": "silu"},
	}, Tensors: ts}

	// MiniMax-M3-VL: the hub's names (block_sparse_moe, per-expert
	// w1/w3/w2, the correction bias on the block), layer 0 dense by
	// moe_layer_freq, one shared expert of I, the clamp at 0.5 so it binds.
	ts = map[string][]int64{
		"language_model.model.embed_tokens.weight": {32, h}, "language_model.model.norm.weight": {h},
		"language_model.lm_head.weight": {32, h}, "vision_tower.vision_model.embeddings.patch_embedding.weight": {8, 3, 2, 2},
		"multi_modal_projector.linear_1.weight": {h, 8}, "patch_merge_mlp.linear_1.weight": {h, h},
	}
	addMLP(ts, "language_model.model.layers.0.block_sparse_moe.", hf, h, 24)
	pre := "language_model.model.layers.1.block_sparse_moe."
	ts[pre+"gate.weight"] = []int64{e, h}
	ts[pre+"e_score_correction_bias"] = []int64{e}
	for x := range e {
		addMLP(ts, pre+"experts."+itoa(x)+".", [3]string{"w1", "w3", "w2"}, h, inter)
	}
	addMLP(ts, pre+"shared_experts.", hf, h, inter)
	out["minimax_m3_vl"] = Hand{Config: map[string]any{
		"model_type": "minimax_m3_vl", "vision_config": map[string]any{"hidden_size": 8},
		"text_config": map[string]any{"model_type": "minimax_m3", "hidden_size": h, "num_hidden_layers": 2,
			"intermediate_size": inter, "dense_intermediate_size": 24, "shared_intermediate_size": inter,
			"num_local_experts": e, "num_experts_per_tok": 2, "routed_scaling_factor": 2.0, "moe_layer_freq": []int{0, 1},
			"swiglu_alpha": 1.702, "swiglu_limit": 0.5},
	}, Tensors: ts}
	return out
}

func itoa(i int) string { return strconv.Itoa(i) }
