package family

import (
	"fmt"
	"maps"
)

// axk2 is SK Telecom's A.X-K2 (AXK2MoE = DeepseekV32MoE, transformers 5.17):
// DeepSeek-V3's block under DeepSeek-V3's hub names (transformers' axk2
// mapping merges mlp.experts.E.{gate,up,down}_proj on load and splits them
// again on save): model.layers.L.mlp.{gate, gate.e_score_correction_bias
// (F32), experts.E.*_proj, shared_experts.*_proj}, the shared MLP
// n_shared_experts * I wide, added ungated: fusable.
//
// AXK2TopkRouter: f32 sigmoid, s + bias, top-k, weights s[ids] normalised
// +1e-20 when norm_topk_prob, times routed_scaling_factor. Without groups
// (n_group null, A.X-K2-Light) that is DeepSeek-V3's router with one group.
// With groups it masks the dropped groups' biased scores to 0, not -inf,
// so an expert of a dropped group still wins over a kept one whose biased
// score is negative: moeprep's grouped top-k does not compute that, and a
// config with n_group > 1 is refused by name.
//
// MoE layers are mlp_layer_types "sparse"; a config without the list (the
// hub's) gets it as AXK2Config builds it, sparse iff L >=
// first_k_dense_replace (1) and L % moe_layer_freq (1) == 0. The gated
// RMSNorms around attention and before the block, and DeepSeek-V3.2's
// indexer, lie outside the block and are copied. Layers past
// num_hidden_layers that hold experts are planned as DeepSeek's MTP layers
// (bounded by num_nextn_predict_layers where config.json gives it).
var axk2 = &spec{
	name:  "axk2",
	names: deepseek.names,
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		numExperts:   routedExperts,
		sharedCount:  "n_shared_experts",
		denseFixed:   1,
		mtpCount:     "num_nextn_predict_layers",
	},
	layers: layerTypes,
	mtp:    true,
	defaults: map[string]any{
		"norm_topk_prob": true, "routed_scaling_factor": 2.5, "n_shared_experts": 1.0, "num_experts_per_tok": 8.0,
	},
	lift:    axk2Config,
	routing: biasedSigmoid("routed_scaling_factor", false, "norm_topk_prob"),
}

// axk2Config refuses grouped routing and writes mlp_layer_types where
// config.json gives only first_k_dense_replace and moe_layer_freq.
func axk2Config(c config) (config, error) {
	groups, err := c.count("n_group", 1)
	if err != nil {
		return c, err
	}
	if groups > 1 {
		return c, fmt.Errorf("config.json: n_group=%d: A.X-K2's grouped router masks the dropped groups' scores to 0, not -inf, "+
			"so an expert of a dropped group can win over a kept one whose biased score is negative; moeprep's grouped top-k "+
			"does not compute that (ungrouped A.X-K2, n_group null or 1, is planned)", groups)
	}
	if c.has("mlp_layer_types") {
		return c, nil
	}
	layers, err := c.sizeAtMost("num_hidden_layers", maxLayers, "the deepest released models have about 130")
	if err != nil {
		return c, err
	}
	moe, err := c.denseReplaced(1)
	if err != nil {
		return c, err
	}
	types := make([]any, layers)
	for l := range types {
		types[l] = "dense"
		if moe(l) {
			types[l] = "sparse"
		}
	}
	m := maps.Clone(c.m)
	m["mlp_layer_types"] = types
	return config{m: m}, nil
}
