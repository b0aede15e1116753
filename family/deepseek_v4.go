package family

import (
	"fmt"

	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
)

// deepseekV4 is DeepSeek-V4 (DeepseekV4SparseMoeBlock, transformers 5.17)
// as transformers saves it: model.layers.L.ffn with experts.E.{w1,w3,w2}
// (gate, up, down), router ffn.gate.weight [E,H], correction bias
// ffn.gate.bias [E] (F32; in memory gate.e_score_correction_bias) and one
// shared expert ffn.shared_experts.{w1,w3,w2} of moe_intermediate_size
// (n_shared_experts is not read by the shared MLP: it is always one, of
// the routed width). Every layer is MoE.
//
// Routing (DeepseekV4TopKRouter): s = sqrt(softplus(logits)) (scoring_func
// sqrtsoftplus; sigmoid and softmax are the other values the config
// documents), ids = top-k of s + bias, w = s[ids] / (sum + 1e-20) times
// routed_scaling_factor, always normalised (norm_topk_prob is not read).
// scoring_func sigmoid is planned too; softmax (also documented, shipped by
// no checkpoint) is refused.
// The first layers are "hash_moe" in mlp_layer_types (DeepseekV4HashRouter):
// ids = ffn.gate.tid2eid[token id] (int64 [vocab, k], no correction bias),
// weighted by the same normalised scores.
//
// DeepSeek-V4's official repo layout (deepseek-ai/DeepSeek-V4-*) names
// the same tensors without "model.": layers.L.ffn..., beside embed.weight,
// head.weight, norm.weight and the hyper-connection (hc_*), attention,
// compressor and indexer tensors, all carried byte for byte; its FP8
// weights (the shared expert's included) carry DeepSeek's x.scale (F8_E8M0
// per 128x128 block) instead of transformers' x.weight_scale_inv.
//
// DeepSeek-V4's official precision, "expert_dtype": "fp4" beside an FP8
// ue8m0 quantization_config, plans the routed experts as MXFP4 in
// DeepSeek's names (x.weight, x.scale) and the shared expert as FP8
// blocks stored apart (readExpertFP4, sharedApart in mxfp4.go).
//
// Experts and the shared MLP use the clamped SwiGLU: silu(min(g, limit)) *
// clamp(u, -limit, limit) with limit = swiglu_limit. Output = routed +
// shared(x), ungated: fusable.
var deepseekV4 = &spec{
	name: "deepseek_v4",
	names: naming{layers: "model.layers.", layersAlt: []string{"layers."}, modules: []string{"ffn", "mlp"}, experts: "experts",
		proj: [3]string{"w1", "w3", "w2"}, router: "gate", bias: "gate.bias", shared: "shared_experts",
		hashTable: "gate.tid2eid"},
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		numExperts:   routedExperts,
		sharedFixed:  1,
	},
	layers: hashOrMoE,
	defaults: map[string]any{
		"scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "num_experts_per_tok": 6.0,
	},
	routing: deepseekV4Routing,
}

func deepseekV4Routing(c config, _ string, p *Plan) error {
	scoring, err := c.str("scoring_func", "sqrtsoftplus")
	if err != nil {
		return err
	}
	switch scoring {
	case "sqrtsoftplus":
		p.Scoring = moe.SqrtSoftplus
	case "sigmoid":
		p.Scoring = moe.Sigmoid
	default:
		return fmt.Errorf("config.json: scoring_func %q is not supported for deepseek_v4 (sqrtsoftplus or sigmoid)", scoring)
	}
	p.NormTopKProb = true
	if p.RoutedScalingFactor, err = c.float("routed_scaling_factor", 1); err != nil {
		return err
	}
	limit, err := c.float("swiglu_limit", 0)
	if err != nil {
		return err
	}
	if !(limit >= 0) {
		return fmt.Errorf("config.json: swiglu_limit=%g must not be negative", limit)
	}
	p.Act = layout.Activation{Limit: limit}
	return p.Act.Check()
}
