package family

// hunyuanV1MoE is Hunyuan-A13B (HunYuanMoEV1Moe, transformers 5.17): every
// layer is MoE, model.layers.L.mlp with the router mlp.gate.wg [E,H] (an
// F32 nn.Linear in memory), experts.E.{gate,up,down}_proj and one ungated
// shared MLP mlp.shared_mlp; transformers sizes the routed experts and the
// shared MLP both by intermediate_size. Routing (HunYuanMoEV1Gate): softmax
// of the logits in f32, top-k (moe_topk), always renormalised, no scaling
// factor; output = routed + shared(x): fusable with slot weight 1.
// num_experts and moe_topk given per layer (lists) are read as numbers
// only, so such a config is refused by name.
var hunyuanV1MoE = &spec{
	name:  "hunyuan_v1_moe",
	names: hubLayoutNames("mlp", "gate.wg", "", "shared_mlp"),
	keys: configKeys{
		intermediate: "intermediate_size",
		topK:         "moe_topk",
		sharedFixed:  1,
	},
	layers:   everyLayer,
	defaults: map[string]any{"moe_topk": 1.0},
	routing:  mixtralRouting,
}
