package family

import (
	"fmt"
	"reflect"
)

// kimiLinear is Moonshot's Kimi-Linear (KimiLinearMoE, transformers 5.17):
// DeepSeek-V3's MoE block under Mixtral-style names. Its conversion mapping
// renames .block_sparse_moe. to .mlp. on load (so a save writes every MLP,
// the dense ones too, under block_sparse_moe) and merges experts.E.w1/w3
// (gate, up) and w2 (down): on disk model.layers.L.block_sparse_moe.{gate,
// gate.e_score_correction_bias, experts.E.{w1,w3,w2}, shared_experts.
// {gate,up,down}_proj}. KimiLinearTopkRouter: fp32 logits, s = sigmoid, top-k
// of s + bias within the topk_group best of n_group groups (sum of their top
// 2, -inf elsewhere), weights s[ids] normalised +1e-20 when norm_topk_prob,
// times routed_scaling_factor; the ungated shared expert of
// n_shared_experts * I is added: fusable. The bias has no
// _keep_in_fp32_modules entry (a bf16 load casts it). MoE layers are
// mlp_layer_types "sparse", by default from first_k_dense_replace (1).
//
// KimiLinearConfig's attribute_map makes transformers write the hub's keys
// (num_experts, num_experts_per_token, num_shared_experts, num_expert_group,
// moe_renormalize) for the names its modules read; kimiLinearKeys reads
// either spelling.
var kimiLinear = &spec{
	name: "kimi_linear",
	names: naming{layers: "model.layers.", modules: []string{"block_sparse_moe", "mlp"}, experts: "experts",
		proj: [3]string{"w1", "w3", "w2"}, router: "gate", bias: "gate.e_score_correction_bias",
		shared: "shared_experts", sharedProj: hubProj},
	keys: configKeys{
		intermediate: "moe_intermediate_size",
		numExperts:   expertsFirst,
		sharedCount:  "n_shared_experts",
		denseKey:     "first_k_dense_replace",
		denseFixed:   1,
	},
	layers:   layerTypes,
	defaults: map[string]any{"topk_group": 1.0, "routed_scaling_factor": 2.446},
	lift:     aliasKeys(kimiLinearKeys),
	refuse:   refuseKimiK3Text,
	routing:  biasedSigmoid("routed_scaling_factor", true, "norm_topk_prob"),
}

// kimiK3Why is why moeprep does not plan Kimi K3 (model_type kimi_k3, its
// text model a kimi_linear config with K3's keys). SGLang's kimi_k3.py
// (KimiK3MoE) and vLLM's kimi_k3 model (KimiMoE,
// KimiRoutedOutputTransform) agree on its MoE block: the router reads the
// hidden state x; the routed experts run on routed_expert_down_proj(x), a
// latent of routed_expert_hidden_size; their weighted sum passes
// routed_expert_norm (an RMSNorm, where latent_moe_use_norm) and
// routed_expert_up_proj back to hidden_size; the shared experts run on x;
// every MLP applies SiTU (hidden_act "situ": beta*tanh(g/beta)*sigmoid(g)
// times linear_beta*tanh(u/linear_beta)). All of it is sourced twice; what
// moeprep lacks is a layer model with projections and a norm around the
// expert bank, and the SiTU activation, so it refuses rather than prove a
// block it does not compute.
const kimiK3Why = "Kimi K3's latent MoE runs its routed experts between routed_expert_down_proj and routed_expert_norm + routed_expert_up_proj (routed_expert_hidden_size) with the SiTU activation (hidden_act situ), a block moeprep's layer model does not hold"

// refuseKimiK3Text refuses a kimi_linear config that is Kimi K3's text
// model: a latent MoE (routed_expert_hidden_size) or the SiTU activation,
// which Kimi-Linear's block computed as SwiGLU would silently get wrong.
func refuseKimiK3Text(c config) error {
	if v, ok := c.get("routed_expert_hidden_size"); ok && v != nil {
		return c.errorf("routed_expert_hidden_size", "%v: %s", v, kimiK3Why)
	}
	if act, err := c.str("hidden_act", "silu"); err != nil {
		return err
	} else if act != "silu" {
		return c.errorf("hidden_act", "%q: moeprep computes Kimi-Linear's experts with silu (SwiGLU) only", act)
	}
	return nil
}

// keyAlias is one config key the planner reads (key), the name a config
// may write it under instead (alias), and its default where neither is set.
type keyAlias struct {
	key, alias string
	def        any
}

// kimiLinearKeys are KimiLinearConfig's attribute_map, with its defaults.
var kimiLinearKeys = []keyAlias{
	{"norm_topk_prob", "moe_renormalize", true},
	{"n_group", "num_expert_group", 1.0},
	{"num_experts_per_tok", "num_experts_per_token", 8.0},
	{"n_shared_experts", "num_shared_experts", 1.0},
}

// aliasKeys is a lift that reads each key from its alias where config.json
// writes only the alias; both written and disagreeing is refused.
func aliasKeys(aliases []keyAlias) func(config) (config, error) {
	return func(c config) (config, error) {
		for _, a := range aliases {
			va, hasA := c.get(a.alias)
			vk, hasK := c.get(a.key)
			switch {
			case hasA && hasK && !reflect.DeepEqual(va, vk):
				return c, fmt.Errorf("config.json: %s=%s and %s=%s disagree", a.key, describe(vk), a.alias, describe(va))
			case hasA && !hasK:
				c.m[a.key] = va
			case !hasA && !hasK && a.def != nil:
				c.m[a.key] = a.def
			}
		}
		return c, nil
	}
}
