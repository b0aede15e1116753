package family

// deepseekV41Text is DeepSeek-V4.1's language model (model_type
// deepseek_v41_text), planned only inside its release's composite config
// (model_type deepseek_v41: the text model under text_config, a vision
// tower under vision_config, one quantization_config at the top). No
// transformers release ships it; the layout and the MoE math are what two
// engines read from the official checkpoint, each written against the
// release's inference code: vLLM (vllm/models/deepseek_v4_1 and its
// DeepseekV41Config) and TensorRT-LLM (configs/deepseek_v41.py,
// models/modeling_deepseekv41.py). FORMATS.md and MODELS.md cite them.
//
// Both agree that V4.1's MoE block is DeepSeek-V4's (deepseekV4 in
// deepseek_v4.go: sqrt(softplus) scores, the correction bias ffn.gate.bias
// choosing the top k, the chosen scores normalised with 1e-20 and scaled
// by routed_scaling_factor, the clamped SwiGLU of swiglu_limit, one
// ungated shared expert of moe_intermediate_size), under DeepSeek's own
// names (layers.L.ffn.experts.E.w1/w3/w2, ffn.shared_experts.w1/w3/w2,
// ffn.gate.weight and .bias, embed.weight, norm.weight, head.weight), with
// three differences that change what is planned:
//
//   - every decoder layer routes by top-k: the hash-routed prefix is gone
//     (no num_hash_layers, no tid2eid; vLLM passes num_hash_layers=0,
//     TensorRT-LLM pins n_hash_layers to 0);
//   - no expert groups (no n_group or topk_group: one group of all);
//   - TensorRT-LLM divides the router logits by gate_temp (default 1);
//     vLLM has no such key. Only 1 is the same network in both, so any
//     other value is refused, naming the key.
//
// The MTP (DSpark) layers, mtp.N.*, hold experts of their own count
// (dspark_n_routed_experts, top dspark_num_experts_per_tok) and are carried
// byte for byte, not planned; so are the vision tower (vision.*,
// aligner.*, image_*), the Engram tables and every other tensor. The
// image tokens' correction bias ffn.gate.bias_vl is carried too: validate
// routes text tokens, whose bias is ffn.gate.bias.
var deepseekV41Text = &spec{
	name: "deepseek_v41_text",
	names: naming{layers: "layers.", modules: []string{"ffn"}, experts: "experts",
		proj: [3]string{"w1", "w3", "w2"}, router: "gate", bias: "gate.bias", shared: "shared_experts"},
	keys:     deepseekV4.keys, // the same keys, and the same defaults (TensorRT-LLM's V4.1 config)
	layers:   everyLayer,
	defaults: deepseekV4.defaults,
	refuse:   deepseekV41Refuse,
	routing:  deepseekV4Routing,
}

// deepseekV41Refuse refuses the V4.1 configs whose network the two sources
// do not describe alike: a temperature on the router logits other than 1,
// expert groups, hash-routed layers.
func deepseekV41Refuse(c config) error {
	if t, err := c.float("gate_temp", 1); err != nil {
		return err
	} else if t != 1 {
		return c.errorf("gate_temp", "%g: a router temperature other than 1 is described by one engine only (TensorRT-LLM divides the logits by it; vLLM reads no such key), so moeprep does not guess it", t)
	}
	for _, k := range []string{"n_group", "topk_group"} {
		if n, err := c.count(k, 1); err != nil {
			return err
		} else if n != 1 {
			return c.errorf(k, "%d: DeepSeek-V4.1 routes over all experts in one group; grouped routing is not what its engines run", n)
		}
	}
	if n, err := c.count("num_hash_layers", 0); err != nil {
		return err
	} else if n != 0 {
		return c.errorf("num_hash_layers", "%d: DeepSeek-V4.1 has no hash-routed layers (tid2eid); this is DeepSeek-V4's key", n)
	}
	return nil
}
