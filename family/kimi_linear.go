package family

import (
	"fmt"
	"reflect"

	"github.com/moeprep/moeprep/layout"
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
		shared: "shared_experts", sharedProj: hubProj,
		latent: [3]string{"routed_expert_down_proj", "routed_expert_norm", "routed_expert_up_proj"}},
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
	routing:  kimiLinearRouting,
}

// Kimi K3's text model is a kimi_linear config with a latent MoE, read as
// SGLang's kimi_k3.py (KimiK3MoE, KimiK3MLP) and vLLM's kimi_k3 model
// (KimiMoE, KimiRoutedOutputTransform, KimiMLP) both compute it: the router
// reads the hidden state x (H = hidden_size); the routed experts run on
// routed_expert_down_proj(x), a latent of routed_expert_hidden_size (L);
// their weighted sum (times routed_scaling_factor) passes
// routed_expert_norm, an RMSNorm of rms_norm_eps present where
// latent_moe_use_norm, then routed_expert_up_proj back to H; the shared
// experts (num_shared_experts * moe_intermediate_size) run on x and are
// added. Every MLP applies hidden_act: silu, or situ with
// activation_situ_beta (the engines take 1 when it is unset or 0) and
// activation_situ_linear_beta (none when unset). On disk, under the MoE
// module: routed_expert_down_proj.weight [L,H], routed_expert_norm.weight
// [L], routed_expert_up_proj.weight [H,L], all BF16.
//
// moeprep plans the bank at the latent width (Plan.HiddenSize = L, so every
// path over the routed experts sees the width they compute in) and keeps H
// in Plan.Latent for the router, the shared experts and the block's input
// and output. convert carries the three latent tensors byte for byte;
// fuse-shared is refused (the shared experts run on x, the bank on the
// latent); validate computes the layer on the CPU both ways with SRC's
// down projection, norm and up projection around the routed sums.
func kimiLinearRouting(c config, mt string, p *Plan) error {
	if err := biasedSigmoid("routed_scaling_factor", true, "norm_topk_prob")(c, mt, p); err != nil {
		return err
	}
	act, err := c.str("hidden_act", "silu")
	if err != nil {
		return err
	}
	switch act {
	case "silu":
	case "situ":
		// Both engines: beta = activation_situ_beta or 1.0; linear_beta
		// None leaves the up projection as it is.
		beta, err := c.float("activation_situ_beta", 0)
		if err != nil {
			return err
		}
		if beta == 0 {
			beta = 1
		}
		lin, err := c.float("activation_situ_linear_beta", 0)
		if err != nil {
			return err
		}
		p.Act = layout.SiTU(beta, lin)
		if err := p.Act.Check(); err != nil {
			return c.errorf("activation_situ_beta", "%v", err)
		}
	default:
		return c.errorf("hidden_act", "%q: moeprep computes Kimi-Linear's and Kimi K3's experts with silu or situ only", act)
	}
	v, ok := c.get("routed_expert_hidden_size")
	if !ok || v == nil {
		return nil
	}
	l, err := c.sizeAtMost("routed_expert_hidden_size", MaxHidden, "Kimi K3's latent is 3,584 wide")
	if err != nil {
		return err
	}
	// Neither engine defaults these for a latent MoE: both read them from
	// the config, so a config without them is refused, not guessed.
	for _, k := range []string{"latent_moe_use_norm", "rms_norm_eps"} {
		if v, ok := c.get(k); !ok || v == nil {
			return fmt.Errorf("config.json: routed_expert_hidden_size %d (a latent MoE) without %s, which the latent norm reads", l, k)
		}
	}
	norm, err := c.boolean("latent_moe_use_norm", false)
	if err != nil {
		return err
	}
	eps, err := c.float("rms_norm_eps", 0)
	if err != nil {
		return err
	}
	if norm && (eps <= 0 || eps >= 1) {
		return c.errorf("rms_norm_eps", "%g: an RMSNorm's epsilon is positive and small", eps)
	}
	p.Latent = &Latent{Hidden: p.HiddenSize, Norm: norm, Eps: eps}
	p.HiddenSize = l
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

// latent names and checks a latent MoE's projections and norm (rel:
// down, norm, up, relative to the MoE module prefix) in out: down [L,H],
// norm [L] where the plan has one, up [H,L], float each. A checkpoint
// holding them under a config that makes no latent MoE is refused: the
// experts would be computed on the wrong input.
func (k *checker) latent(where, prefix string, rel [3]string, out *Layer) error {
	if rel[0] == "" {
		return nil
	}
	p := k.p
	if p.Latent == nil {
		for _, r := range rel {
			if n := prefix + "." + r + ".weight"; k.has(n) {
				return fmt.Errorf("%s: holds %s, a latent MoE's, but config.json gives no routed_expert_hidden_size", where, n)
			}
		}
		return nil
	}
	h, l := int64(p.Latent.Hidden), int64(p.HiddenSize)
	hint := fmt.Sprintf("(H=%d, latent L=%d)", h, l)
	for _, v := range []struct {
		rel, role string
		dst       *string
		shape     []int64
	}{{rel[0], "latent down projection", &out.LatentDown, []int64{l, h}},
		{rel[1], "latent norm", &out.LatentNorm, []int64{l}},
		{rel[2], "latent up projection", &out.LatentUp, []int64{h, l}}} {
		name := prefix + "." + v.rel + ".weight"
		if v.dst == &out.LatentNorm && !p.Latent.Norm {
			if k.has(name) {
				return fmt.Errorf("%s: holds %s but config.json's latent_moe_use_norm is false", where, name)
			}
			continue
		}
		*v.dst = name
		if err := k.small(where, v.role, name, v.shape, hint); err != nil {
			return err
		}
	}
	return nil
}

// has reports whether the checkpoint holds tensor name.
func (k *checker) has(name string) bool {
	_, ok := k.t.Lookup(name)
	return ok
}
