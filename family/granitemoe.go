package family

// Granite MoE (granitemoe, granitemoeshared, granitemoe_swa) stores its
// experts stacked on disk, model.layers.L.block_sparse_moe.input_linear
// [E, 2I, H] (each expert's gate rows, then up rows: the forward chunks the
// product in two and activates the first) and output_linear [E, H, I],
// with I = intermediate_size; granitemoe_swa names them experts.gate_up_proj
// and experts.down_proj. The router (router.layer, or router for _swa)
// takes the top-k logits and a softmax over them: the same as softmax,
// top-k and renormalised. granitemoeshared and _swa add an ungated shared
// MLP beside the MoE block, model.layers.L.shared_mlp.input_linear
// [2*Is, H] and output_linear [H, Is], when shared_intermediate_size > 0;
// the decoder layer adds it to the routed output. Every layer is MoE. The
// module transformers calls the MoE block (block_sparse_moe) returns the
// routed part alone: a golden hooked there is ModuleRouted.
// graniteTransformers is how transformers 5 holds every Granite MoE's
// experts (its conversion mapping renames input_linear and output_linear
// to experts.gate_up_proj and down_proj, under block_sparse_moe).
var graniteTransformers = TransformersForm{Module: "block_sparse_moe", Why: "transformers 5 keeps Granite's module name and renames input_linear and output_linear to experts.gate_up_proj and down_proj on load"}

var graniteNames = naming{
	layers:        "model.layers.",
	modules:       []string{"block_sparse_moe"},
	router:        "router.layer",
	stackedGateUp: "input_linear.weight",
	stackedDown:   "output_linear.weight",
	shared:        "shared_mlp",
	sharedGateUp:  "input_linear.weight",
	sharedDown:    "output_linear.weight",
	sharedAtLayer: true,
}

var graniteKeys = configKeys{
	intermediate:  "intermediate_size",
	numExperts:    localExpertsFirst,
	sharedFixed:   1,
	sharedSize:    "shared_intermediate_size",
	sharedIfSized: true,
}

var graniteMoE = &spec{
	name:         "granitemoe",
	modelTypes:   []string{"granitemoe", "granitemoeshared"},
	names:        graniteNames,
	keys:         graniteKeys,
	layers:       everyLayer,
	routing:      mixtralRouting,
	moduleOutput: ModuleRouted,
	transformers: graniteTransformers,
}

var graniteMoESWA = &spec{
	name: "granitemoe_swa",
	names: func() naming {
		n := graniteNames
		n.router, n.stackedGateUp, n.stackedDown = "router", "experts.gate_up_proj", "experts.down_proj"
		return n
	}(),
	keys:         graniteKeys,
	layers:       everyLayer,
	routing:      mixtralRouting,
	moduleOutput: ModuleRouted,
	transformers: graniteTransformers,
}
