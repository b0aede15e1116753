package family

import (
	"fmt"

	"github.com/moeprep/moeprep/moe"
)

// deepseekV3Defaults are DeepseekV3Config's defaults; transformers and
// DeepSeek's own configuration_deepseek.py agree on them, and Kimi-K2 ships
// the same class under model_type kimi_k2.
var deepseekV3Defaults = map[string]any{
	"scoring_func":          "sigmoid",
	"topk_method":           "noaux_tc",
	"n_group":               8.0,
	"topk_group":            4.0,
	"norm_topk_prob":        true,
	"routed_scaling_factor": 2.5,
	"first_k_dense_replace": 3.0,
	"moe_layer_freq":        1.0,
	"n_shared_experts":      1.0,
}

// deepseekV2Defaults are DeepseekV2Config's. n_shared_experts has none on
// purpose: transformers says 2, DeepSeek's code says None; a missing key
// plans no shared expert, and shared tensors then make planning fail.
var deepseekV2Defaults = map[string]any{
	"scoring_func":          "softmax",
	"topk_method":           "greedy",
	"n_group":               1.0,
	"topk_group":            1.0,
	"norm_topk_prob":        false,
	"routed_scaling_factor": 1.0,
	"first_k_dense_replace": 0.0,
	"moe_layer_freq":        1.0,
}

// deepseek covers DeepSeek-V2/V2-Lite, DeepSeek-V3/R1 and Kimi-K2:
// model.layers.L.mlp.{gate, experts.E.*_proj, shared_experts.*_proj}.
var deepseek = &spec{
	name:       "deepseek",
	modelTypes: []string{"deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe"},
	names:      hubLayoutNames("mlp", "gate", "gate.e_score_correction_bias", "shared_experts"),
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		// n_routed_experts is the hub key; transformers aliases num_local_experts (V3) and num_experts (V2).
		numExperts:  []string{"n_routed_experts", "num_local_experts", "num_experts"},
		sharedCount: "n_shared_experts", // the shared MLP has intermediate n_shared_experts * I
		mtpCount:    "num_nextn_predict_layers",
	},
	layers: denseReplace,
	mtp:    true,
	defaultsByType: map[string]map[string]any{
		"deepseek_v2": deepseekV2Defaults,
		"deepseek_v3": deepseekV3Defaults,
		"kimi_k2":     deepseekV3Defaults,
		"glm4_moe":    glm4MoEDefaults, // glm4_moe.go
	},
	routing: deepseekRouting,
}

// deepseekRouting: V3 and Kimi-K2 route by sigmoid + correction bias with
// noaux_tc (both transformers and DeepSeek's code support nothing else); V2
// routes by softmax, greedy or group_limited_greedy (group score = max).
func deepseekRouting(c config, modelType string, p *Plan) error {
	scoring, err := c.str("scoring_func", "")
	if err != nil {
		return err
	}
	method, err := c.str("topk_method", "")
	if err != nil {
		return err
	}
	if method == "gready" { // DeepSeek-V2's own configuration default is spelled so
		method = "greedy"
	}
	v2 := modelType == "deepseek_v2"
	switch {
	case !v2 && scoring == "sigmoid" && method == "noaux_tc":
		p.Scoring, p.TopKMethod = moe.Sigmoid, moe.TopKNoAuxTC
	case v2 && scoring == "softmax" && method == "greedy":
		p.Scoring, p.TopKMethod = moe.Softmax, moe.TopKGreedy // n_group is not used
	case v2 && scoring == "softmax" && method == "group_limited_greedy":
		p.Scoring, p.TopKMethod = moe.Softmax, moe.TopKGroupLimited
	default:
		supported := "sigmoid with noaux_tc"
		if v2 {
			supported = "softmax with greedy or group_limited_greedy"
		}
		return fmt.Errorf("config.json: scoring_func %q with topk_method %q is not supported for %s (only %s)",
			scoring, method, modelType, supported)
	}
	if p.TopKMethod.Grouped() {
		if err = readGroups(c, p); err != nil {
			return err
		}
	}
	return readRenorm(c, p, false)
}
