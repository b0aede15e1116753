package family

// jamba is Jamba (JambaSparseMoeBlock): MoE layers are those with
// L % expert_layer_period == expert_layer_offset, their module
// model.layers.L.feed_forward with router feed_forward.router and experts
// feed_forward.experts.E.*_proj of intermediate_size; softmax top-k, never
// renormalised. The mamba mixers and attention are copied byte for byte.
var jamba = &spec{
	name:    "jamba",
	names:   hubLayoutNames("feed_forward", "router", "", ""),
	keys:    configKeys{intermediate: "intermediate_size"},
	layers:  periodOffset,
	routing: softmaxNorm(false),
}
