package family

import "fmt"

// axk1 is SK Telecom's A.X-K1 (AXK1MoE = DeepseekV3MoE plus an output norm,
// transformers 5.17): DeepSeek-V3's router, experts and shared expert under
// DeepSeek-V3's hub names (model.layers.L.mlp.{gate,
// gate.e_score_correction_bias (F32), experts.E.*_proj, shared_experts.*_proj}).
// AXK1TopkRouter = DeepseekV3TopkRouter: f32 sigmoid, top-k of s + bias
// within the topk_group best of n_group groups (sum of their top 2, -inf
// elsewhere), weights s[ids] normalised +1e-20 when norm_topk_prob, times
// routed_scaling_factor; routed + shared(x) with the shared MLP n_shared_experts
// * I wide: fusable. Layer L is MoE iff L >= first_k_dense_replace (1).
//
// The block then applies its post_mlp_layernorm (an RMSNorm) to routed +
// shared. The checkpoints store that norm at the decoder layer,
// model.layers.L.post_mlp_layernorm.weight (transformers' axk1 mapping
// renames it into the block on load and back on save), so moeprep plans the
// MoE layer as the sum before the norm, carries the norm byte for byte, and
// validates that sum (the fixture's goldens take the norm's input). Fusing
// the shared expert changes nothing the norm sees. A golden taken as the
// block's output (a forward hook on mlp) is after the norm: the plan names
// the norm (Layer.PostNorm, eps rms_norm_eps, default 1e-6 as
// AXK1Config's) so validate can apply it to the sum (ModulePostNorm).
//
// transformers builds no MTP layer for A.X-K1 (AXK1Config drops
// num_mtp_layers); layers past num_hidden_layers that hold experts, as
// DeepSeek-V3's repos keep their MTP layer, are planned as DeepSeek's MTP
// layers (bounded by num_nextn_predict_layers where config.json gives it).
var axk1 = &spec{
	name: "axk1",
	names: func() naming {
		n := deepseek.names
		n.postNorm = "post_mlp_layernorm.weight"
		return n
	}(),
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		numExperts:   routedExperts,
		sharedCount:  "n_shared_experts",
		denseKey:     "first_k_dense_replace",
		denseFixed:   1,
		mtpCount:     "num_nextn_predict_layers",
	},
	layers: firstDense,
	mtp:    true,
	// AXK1Config's defaults (DeepseekV3Config's where it keeps them).
	defaults: map[string]any{
		"n_group": 8.0, "topk_group": 4.0, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
		"first_k_dense_replace": 1.0, "n_shared_experts": 1.0, "num_experts_per_tok": 8.0,
	},
	routing:      axk1Routing,
	moduleOutput: ModulePostNorm,
}

// axk1Routing is DeepSeek-V3's routing, and the post norm's epsilon.
func axk1Routing(c config, mt string, p *Plan) error {
	if err := biasedSigmoid("routed_scaling_factor", true, "norm_topk_prob")(c, mt, p); err != nil {
		return err
	}
	eps, err := c.float("rms_norm_eps", 1e-6)
	if err != nil {
		return err
	}
	if !(eps > 0 && eps < 1) {
		return fmt.Errorf("config.json: rms_norm_eps=%g: want a small positive number", eps)
	}
	p.PostNormEps = eps
	return nil
}
