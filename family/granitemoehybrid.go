package family

import "fmt"

// graniteMoEHybrid is IBM's Granite 4.0 hybrid (GraniteMoeHybridMoE =
// GraniteMoeSharedMoE, transformers 5.17): Mamba-2 and attention layers
// (layer_types), every one with the Granite MoE block and the shared MLP
// beside it. transformers saves it through the granitemoe conversion
// pattern, so on disk it is granitemoeshared's layout: stacked
// block_sparse_moe.input_linear.weight [E, 2I, H] (gate rows, then up) and
// output_linear.weight [E, H, I], router block_sparse_moe.router.layer [E,H],
// shared model.layers.L.shared_mlp.input_linear [2Is, H] and
// output_linear [H, Is] (Is = shared_intermediate_size, default 1024),
// ungated and added by the decoder layer: fusable when Is is a multiple of
// I. Routing (GraniteMoeSharedTopKGating): the top-k logits, softmax over
// them. A config with num_local_experts 0 (the dense Granite 4.0 models)
// has no MoE block: the decoder layer runs the shared MLP alone.
var graniteMoEHybrid = &spec{
	name:         "granitemoehybrid",
	names:        graniteNames,
	keys:         graniteKeys,
	layers:       everyLayer,
	defaults:     map[string]any{"num_local_experts": 8.0, "num_experts_per_tok": 2.0, "shared_intermediate_size": 1024.0},
	lift:         graniteDense,
	routing:      mixtralRouting,
	moduleOutput: ModuleRouted, // block_sparse_moe's output: the shared MLP is added by the decoder layer
	transformers: graniteTransformers,
}

// graniteDense refuses the dense Granite 4.0 models by name: with no
// experts the decoder layers hold the shared MLP only.
func graniteDense(c config) (config, error) {
	if n, ok := asInt(c.m["num_local_experts"]); ok && n == 0 {
		return c, fmt.Errorf("config.json: num_local_experts=0: this granitemoehybrid model is dense (its layers run the shared MLP alone), there are no experts to convert")
	}
	return c, nil
}
