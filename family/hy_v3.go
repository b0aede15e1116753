package family

// hyV3 is Hunyuan HY-V3 (HYV3MoE): router model.layers.L.mlp.router.gate,
// correction bias on the MoE module (mlp.expert_bias on disk; transformers
// holds it as e_score_correction_bias), plain
// top-k of sigmoid + bias (no groups), weights always normalised +1e-20 and
// times router_scaling_factor, plus an ungated shared expert mlp.shared_mlp
// of num_shared_experts * I. MoE layers: mlp_layer_types, else all but the
// first.
var hyV3 = &spec{
	name:  "hy_v3",
	names: hubLayoutNames("mlp", "router.gate", "expert_bias", "shared_mlp"),
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		sharedCount:  "num_shared_experts",
		denseFixed:   1,
	},
	layers:   layerTypes,
	defaults: map[string]any{"router_scaling_factor": 2.826, "num_shared_experts": 1.0},
	routing:  biasedSigmoid("router_scaling_factor", false, ""),
}
