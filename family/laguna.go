package family

import "fmt"

// laguna is Poolside's Laguna (LagunaSparseMoeBlock, transformers 5.17). Its
// conversion mapping (qwen2_moe's plus two renames) saves
// model.layers.L.mlp.{gate, experts.E.*_proj, experts.e_score_correction_bias
// (the router's, kept beside the experts on disk; no _keep_in_fp32 entry),
// shared_expert.*_proj} (shared_experts in memory).
//
// LagunaTopKRouter: logits in the model dtype, then f32; tanh softcapping
// when moe_router_logit_softcapping > 0 (refused: moeprep's routers have no
// softcap); s = sigmoid; ids = top-k of s + bias (no groups); w = s[ids] /
// sum (no epsilon; moeprep adds 1e-20, nothing at f32 next to a sum of
// sigmoids), cast to the model dtype. The block multiplies the routed sum by
// moe_routed_scaling_factor and adds the ungated shared expert of
// shared_expert_intermediate_size: fusable, split into that many experts of
// I when a multiple of it. MoE layers are mlp_layer_types "sparse", by
// default all but the first. moe_apply_router_weight_on_input (input
// scaling, which transformers refuses too) is refused.
var laguna = &spec{
	name:  "laguna",
	names: hubLayoutNames("mlp", "gate", "experts.e_score_correction_bias", "shared_expert"),
	keys: configKeys{
		intermediate:  "moe_intermediate_size",
		sharedFixed:   1,
		sharedSize:    "shared_expert_intermediate_size",
		sharedIfSized: true,
		denseFixed:    1,
	},
	layers: layerTypes,
	defaults: map[string]any{
		"num_experts_per_tok": 8.0, "shared_expert_intermediate_size": 512.0, "moe_routed_scaling_factor": 1.0,
		"moe_router_logit_softcapping": 0.0, "moe_apply_router_weight_on_input": false,
	},
	refuse:  lagunaRefuse,
	routing: biasedSigmoid("moe_routed_scaling_factor", false, ""),
}

func lagunaRefuse(c config) error {
	softcap, err := c.float("moe_router_logit_softcapping", 0)
	if err != nil {
		return err
	}
	if softcap > 0 {
		return fmt.Errorf("config.json: moe_router_logit_softcapping=%g is not supported for laguna (tanh softcapping of the router logits; moeprep's routers have none)", softcap)
	}
	onInput, err := c.boolean("moe_apply_router_weight_on_input", false)
	if err != nil {
		return err
	}
	if onInput {
		return fmt.Errorf("config.json: moe_apply_router_weight_on_input=true is not supported for laguna (router weights scaling the experts' input; transformers refuses it too)")
	}
	return nil
}
