package family_test

import (
	"github.com/moeprep/moeprep/layout"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
)

// without hides some tensors of a checkpoint (views of them still resolve
// through the checkpoint, as the planner checks the names first).
type without struct {
	*checkpoint.Checkpoint
	drop []string
}

func (w without) Lookup(name string) (family.TensorMeta, bool) {
	if slices.Contains(w.drop, family.BaseName(name)) {
		return family.TensorMeta{}, false
	}
	return w.Checkpoint.Lookup(name)
}

func (w without) Names() []string {
	return slices.DeleteFunc(w.Checkpoint.Names(), func(n string) bool { return slices.Contains(w.drop, n) })
}

// DBRX's config keeps its MoE options under ffn_config: each is read, and
// what transformers computes otherwise than moeprep can is refused.
func TestDbrxConfig(t *testing.T) {
	ffn := func(key string, v any) func(map[string]any) {
		return func(c map[string]any) { c["ffn_config"].(map[string]any)[key] = v }
	}
	cases := []struct {
		name string
		edit func(map[string]any)
		want string // error substring; "" plans, "nonorm" plans unnormalised
	}{
		{"as written", func(map[string]any) {}, ""},
		{"null norm leaves the weights", ffn("moe_normalize_expert_weights", nil), "nonorm"},
		{"a 2-norm", ffn("moe_normalize_expert_weights", 2.0), "moe_normalize_expert_weights=2 is not supported"},
		{"gelu experts", ffn("ffn_act_fn", map[string]any{"name": "gelu"}), `ffn_act_fn.name="gelu" is not supported`},
		{"ffn_config not an object", func(c map[string]any) { c["ffn_config"] = 3.0 }, "ffn_config: want an object"},
		{"hidden sizes disagree", ffn("hidden_size", 96.0), "ffn_config.hidden_size=96 but d_model=64"},
		{"top-level hidden_size disagrees", func(c map[string]any) { c["hidden_size"] = 32.0 }, "d_model=64 and hidden_size=32 disagree"},
		{"too many experts picked", ffn("moe_top_k", 9.0), "exceeds the 8 routed experts"},
		{"no expert width", func(c map[string]any) { delete(c["ffn_config"].(map[string]any), "ffn_hidden_size") }, "ffn_hidden_size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := planEdited(t, "dbrx", tc.edit)
			switch {
			case tc.want == "" || tc.want == "nonorm":
				if err != nil {
					t.Fatal(err)
				}
				if p.NormTopKProb != (tc.want == "") || p.TopK != 2 || p.NumExperts != 8 || p.MoEIntermediateSize != 32 || p.HiddenSize != 64 {
					t.Errorf("plan: norm %v, top-%d of %d, I %d, H %d", p.NormTopKProb, p.TopK, p.NumExperts, p.MoEIntermediateSize, p.HiddenSize)
				}
				if got := p.Layers[1].Experts[3].Weight(layout.ProjDown); got != "transformer.blocks.1.ffn.experts.mlp.w2[96:128][T:0:64:1]" {
					t.Errorf("expert 3's down = %s", got)
				}
			case err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n"):
				t.Errorf("err = %v, want one line with %q", err, tc.want)
			}
		})
	}
	if _, err := planEdited(t, "dbrx", func(map[string]any) {}, "transformer.blocks.1.ffn.experts.mlp.v1"); err == nil ||
		!strings.Contains(err.Error(), "missing tensor transformer.blocks.1.ffn.experts.mlp.v1") {
		t.Errorf("a missing flat tensor: %v", err)
	}
}

// LFM2-MoE's correction bias exists only with use_expert_bias; a bias the
// config turns off is a disagreement, refused.
func TestLfm2ExpertBias(t *testing.T) {
	p, err := planEdited(t, "lfm2-moe", func(map[string]any) {})
	if err != nil || p.Layers[0].RouterBias != "model.layers.1.feed_forward.expert_bias" || p.RoutedScalingFactor != 1.5 {
		t.Fatalf("as written: %v, %+v", err, p)
	}
	off := func(c map[string]any) { c["use_expert_bias"] = false }
	p, err = planEdited(t, "lfm2-moe", off, "model.layers.1.feed_forward.expert_bias", "model.layers.2.feed_forward.expert_bias")
	if err != nil || p.Layers[0].RouterBias != "" || p.Layers[1].RouterBias != "" {
		t.Fatalf("use_expert_bias false: %v, %+v", err, p)
	}
	if _, err := planEdited(t, "lfm2-moe", off); err == nil || !strings.Contains(err.Error(), "use_expert_bias=false") {
		t.Errorf("a bias the config turns off: %v", err)
	}
	if _, err := planEdited(t, "lfm2-moe", func(map[string]any) {}, "model.layers.2.feed_forward.expert_bias"); err == nil {
		t.Error("a missing bias planned")
	}
}

// Hunyuan-A13B gives moe_topk per layer: one value for all is planned,
// differing values are refused, and so is a num_experts list.
func TestHunyuanPerLayerTopK(t *testing.T) {
	p, err := planEdited(t, "hunyuan-v1-moe", func(c map[string]any) { c["moe_topk"] = []any{2.0, 2.0} })
	if err != nil || p.TopK != 2 {
		t.Errorf("moe_topk [2 2]: %v", err)
	}
	for _, tc := range []struct {
		key  string
		v    any
		want string
	}{
		{"moe_topk", []any{2.0, 3.0}, "moe_topk [2 3]: a top-k that differs between layers is not supported"},
		{"moe_topk", []any{}, "moe_topk []"},
		{"moe_topk", []any{"2"}, "moe_topk: element 0"},
		{"num_experts", []any{8.0, 8.0}, "num_experts"},
	} {
		_, err := planEdited(t, "hunyuan-v1-moe", func(c map[string]any) { c[tc.key] = tc.v })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v: %v, want %q", tc.key, tc.v, err, tc.want)
		}
	}
}
