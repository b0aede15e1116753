package family

import (
	"fmt"

	"github.com/moeprep/moeprep/layout"
)

// nemotronH is NVIDIA's Nemotron-H (nemotron_h: Nemotron 3 Nano and its
// kin), a hybrid whose decoder blocks each hold one mixer: Mamba-2
// ("linear_attention", M), attention ("full_attention", *), a dense MLP
// ("mlp", -) or a MoE block ("moe", E), as layers_block_type lists them
// (the hub's configs spell the list as hybrid_override_pattern,
// "MEMEM*E..."). transformers 5.17 holds the model under model.* and its
// conversion mapping renames it back on save, so checkpoints name
// backbone.layers.L.mixer.{gate, gate.e_score_correction_bias,
// experts.E.{up,down}_proj, shared_experts.{up,down}_proj}.
//
// NemotronHMoE: the router (NemotronHTopkRouter) is DeepSeek-V3's: fp32
// logits, s = sigmoid, top-k of s + correction bias within the topk_group
// best of n_group groups, weights s[ids] renormalised (+1e-20) when
// norm_topk_prob, times routed_scaling_factor. The experts are ungated:
// down(relu2(up x)), relu2 = square(relu) (mlp_hidden_act), with no gate
// projection, and the shared MLP (NemotronHMLP, moe_shared_expert_
// intermediate_size wide) is the same ungated relu2 MLP added unweighted:
// fusable, a whole number of experts wide. The optional latent projection
// (moe_latent_size: the experts run between fc1_latent_proj and
// fc2_latent_proj) is refused.
var nemotronH = &spec{
	name: "nemotron_h",
	names: naming{layers: "backbone.layers.", layersAlt: []string{"model.layers."}, modules: []string{"mixer"},
		experts: "experts", proj: [3]string{"", "up_proj", "down_proj"}, router: "gate",
		bias: "gate.e_score_correction_bias", shared: "shared_experts"},
	keys: configKeys{
		intermediate:  "moe_intermediate_size",
		numExperts:    routedExperts,
		sharedFixed:   1,
		sharedSize:    "moe_shared_expert_intermediate_size",
		sharedIfSized: true,
	},
	layers: layerTypes,
	// NemotronHConfig's defaults
	defaults: map[string]any{"n_group": 1.0, "topk_group": 1.0, "norm_topk_prob": true, "routed_scaling_factor": 1.0,
		"mlp_hidden_act": "relu2", "mlp_bias": false, "moe_shared_expert_intermediate_size": 7688.0},
	lift:         nemotronHLift,
	refuse:       nemotronHRefuse,
	routing:      nemotronHRouting,
	transformers: TransformersForm{AsStored: true, Why: "transformers 5 stacks the ungated experts into mixer.experts.up_proj [E, I, H] and down_proj [E, H, I] on load, names moeprep's stacked layout does not write; the checkpoint's own tensors load as they are"},
}

// nemotronHBlocks maps hybrid_override_pattern's characters and the
// legacy names of hub configs to NemotronHConfig's block types.
var nemotronHBlocks = map[string]string{
	"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp",
	"linear_attention": "linear_attention", "moe": "moe", "full_attention": "full_attention", "mlp": "mlp",
	"mamba": "linear_attention", "attention": "full_attention",
}

// nemotronHLift reads the block types as NemotronHConfig does
// (layers_block_type, or its alias layer_types, else the pattern string,
// else the class's default) into the keys the planner reads: the layer
// count is the list's length (transformers ignores num_hidden_layers), and
// the MoE blocks are the "sparse" entries of mlp_layer_types.
func nemotronHLift(c config) (config, error) {
	var types []string
	key := ""
	for _, k := range []string{"layers_block_type", "layer_types"} {
		if c.has(k) {
			l, err := c.strs(k)
			if err != nil {
				return c, err
			}
			types, key = l, k
			break
		}
	}
	if key == "" && c.has("hybrid_override_pattern") {
		pat, err := c.str("hybrid_override_pattern", "")
		if err != nil {
			return c, err
		}
		if len(pat) > maxLayers { // count before splitting: a hostile string costs no more
			return c, fmt.Errorf("config.json: hybrid_override_pattern has %d blocks, over the limit of %d", len(pat), maxLayers)
		}
		for _, r := range pat {
			types = append(types, string(r))
		}
		key = "hybrid_override_pattern"
	}
	if key == "" {
		types, key = []string{"linear_attention", "moe", "full_attention", "mlp"}, "layers_block_type (NemotronHConfig's default)"
	}
	if len(types) == 0 || len(types) > maxLayers {
		return c, fmt.Errorf("config.json: %s has %d blocks: want 1 to %d", key, len(types), maxLayers)
	}
	mlp := make([]any, len(types))
	for i, t := range types {
		b, ok := nemotronHBlocks[t]
		if !ok {
			return c, fmt.Errorf("config.json: %s[%d] = %q: not a Nemotron-H block (want linear_attention, full_attention, mlp or moe; in the pattern M, *, - or E)", key, i, t)
		}
		mlp[i] = "dense"
		if b == "moe" {
			mlp[i] = "sparse"
		}
	}
	c.m["num_hidden_layers"] = float64(len(types))
	c.m["mlp_layer_types"] = mlp
	return c, nil
}

// nemotronHRefuse is what moeprep cannot carry exactly.
func nemotronHRefuse(c config) error {
	if v, ok := c.get("moe_latent_size"); ok && v != nil {
		return fmt.Errorf("config.json: moe_latent_size=%s: Nemotron-H's latent MoE runs its experts between fc1_latent_proj and fc2_latent_proj, a projection moeprep's layer model does not hold", describe(v))
	}
	act, err := c.str("mlp_hidden_act", "relu2")
	if err != nil {
		return err
	}
	if act != "relu2" {
		return fmt.Errorf("config.json: mlp_hidden_act %q: moeprep computes Nemotron-H's ungated experts with relu2 only", act)
	}
	if b, err := c.boolean("mlp_bias", false); err != nil {
		return err
	} else if b {
		return fmt.Errorf("config.json: mlp_bias is true: Nemotron-H's shared MLP would carry biases its routed experts lack, which moeprep does not plan")
	}
	if c.has("quantization_config") {
		return fmt.Errorf("config.json: quantization_config: moeprep carries Nemotron-H's ungated experts unquantised (bf16, f16, f32) only")
	}
	return nil
}

func nemotronHRouting(c config, mt string, p *Plan) error {
	p.Act = layout.ReLU2()
	return biasedSigmoid("routed_scaling_factor", true, "norm_topk_prob")(c, mt, p)
}
