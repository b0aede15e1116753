package family

// qwenDefaults are Qwen2MoeConfig's and Qwen3MoeConfig's (they agree).
var qwenDefaults = map[string]any{
	"decoder_sparse_step": 1.0,
	"norm_topk_prob":      false,
	"mlp_only_layers":     []any{},
}

// qwen3NextDefaults are Qwen3NextConfig's.
var qwen3NextDefaults = map[string]any{
	"decoder_sparse_step": 1.0,
	"norm_topk_prob":      true,
	"mlp_only_layers":     []any{},
}

// qwen2MoE is Qwen1.5-MoE / Qwen2-MoE: routed experts as in Qwen3-MoE plus
// one shared expert of its own size behind a per-token sigmoid gate,
// model.layers.L.mlp.{shared_expert.*_proj, shared_expert_gate}.
var qwen2MoE = &spec{
	name:       "qwen2_moe",
	modelTypes: []string{"qwen2_moe", "qwen3_next"},
	names: func() naming {
		n := hubLayoutNames("mlp", "gate", "", "shared_expert")
		n.sharedGate = "shared_expert_gate"
		return n
	}(),
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		sharedFixed:  1,
		sharedSize:   "shared_expert_intermediate_size",
		sharedGated:  true,
	},
	layers: sparseStep,
	// Qwen3-Next (Qwen3NextSparseMoeBlock) has the same block: softmax
	// top-k, a sigmoid-gated shared expert; only norm_topk_prob's default
	// differs. Its gated-delta-net layers are copied byte for byte.
	defaultsByType: map[string]map[string]any{"qwen2_moe": qwenDefaults, "qwen3_next": qwen3NextDefaults},
	routing:        softmaxRouting,
}

// softmaxRouting is Qwen's: softmax, plain top-k, renormalised only if
// norm_topk_prob, no scaling factor.
func softmaxRouting(c config, _ string, p *Plan) error {
	var err error
	p.NormTopKProb, err = c.boolean("norm_topk_prob", false)
	return err
}
