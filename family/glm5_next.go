package family

import (
	"fmt"

	"github.com/moeprep/moeprep/layout"
)

// glm5NextText is GLM-5.3-Flash's language model (Glm5NextTextMoE,
// transformers 5.17), planned inside its wrapper glm5_next (wrapper.go):
// model.language_model.layers.L.mlp.{gate, gate.e_score_correction_bias
// (F32, strict), experts.E.*_proj, shared_experts.*_proj} (its conversion
// mapping merges the per-expert tensors on load, qwen2_moe's pattern, and
// renames no prefix). The decoder around the block (KDA linear attention,
// DSA attention with its indexer, hyper-connection mixers attn_hc/ffn_hc)
// and the vision tower are carried byte for byte.
//
// Glm5NextTextTopkRouter is DeepSeek-V3's: fp32 sigmoid, top-k of s + bias
// within the topk_group best of n_group groups (sum of their top 2, -inf
// elsewhere), weights normalised +1e-20 when norm_topk_prob, times
// routed_scaling_factor. Experts and the shared MLP (n_shared_experts * I)
// use the clamped SwiGLU silu(min(g, limit)) * clamp(u, -limit, limit),
// limit = swiglu_limit (10): the shared expert is ungated and clamped like
// the routed ones: fusable. MoE layers are mlp_layer_types "sparse", by
// default all but the first 3; layers past num_hidden_layers with experts
// (the hub's MTP layer 45) are planned as MTP layers.
var glm5NextText = func() *spec {
	s := layerTypedDeepSeek("glm5_next", glmKeys(3), map[string]any{
		"n_group": 1.0, "topk_group": 1.0, "norm_topk_prob": true, "routed_scaling_factor": 2.5, "n_shared_experts": 1.0,
		"num_experts_per_tok": 8.0, "swiglu_limit": 10.0,
	})
	s.modelTypes = []string{"glm5_next_text"}
	s.routing = withSwigluLimit(s.routing)
	s.aloneNames = stackedInMemory // its base text model saved alone
	return s
}()

// withSwigluLimit adds the clamped SwiGLU of swiglu_limit to a routing rule.
func withSwigluLimit(routing func(config, string, *Plan) error) func(config, string, *Plan) error {
	return func(c config, mt string, p *Plan) error {
		if err := routing(c, mt, p); err != nil {
			return err
		}
		limit, err := c.float("swiglu_limit", 0)
		if err != nil {
			return err
		}
		if !(limit > 0) {
			return fmt.Errorf("config.json: swiglu_limit=%g must be positive (%s clamps every expert by it)", limit, mt)
		}
		p.Act = layout.Activation{Limit: limit}
		return p.Act.Check()
	}
}
