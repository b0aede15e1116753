package family_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/layout"
)

// TestGemma4Config: Gemma 4's checkpoints written by transformers plan with
// the MoE block on the decoder layer (its router, stacked experts, the
// per-expert scale and both input norms named), GeGLU and rms_norm_eps; a
// dense Gemma 4, another activation and a bad epsilon are refused naming
// the key.
func TestGemma4Config(t *testing.T) {
	for _, c := range []struct{ dir, layer string }{
		{"gemma4-text", "model.layers.1"},
		{"gemma4", "model.language_model.layers.1"},
		{"diffusion-gemma", "model.decoder.layers.1"},
	} {
		t.Run(c.dir, func(t *testing.T) {
			dir := filepath.Join("..", "fixtures", "hf", c.dir)
			p, err := planEditedDir(t, dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			l := p.Layers[1]
			want := [...]string{c.layer, c.layer + ".router.proj.weight", c.layer + ".router.per_expert_scale",
				c.layer + ".router.scale", c.layer + ".pre_feedforward_layernorm_2.weight"}
			if got := [...]string{l.Prefix, l.Router, l.ExpertScale, l.RouterInputScale, l.ExpertInputNorm}; got != want {
				t.Fatalf("layer 1 names %q, want %q", got, want)
			}
			if p.Act != layout.GeGLUTanh() || p.InputNormEps != 1e-6 || !p.NormTopKProb || len(p.Layers) != 3 || l.Experts[7].Weight(layout.ProjGate) == "" {
				t.Fatalf("plan: act %+v eps %g renorm %v, %d layers", p.Act, p.InputNormEps, p.NormTopKProb, len(p.Layers))
			}
		})
	}
	for _, bad := range []struct {
		edit func(map[string]any)
		want string
	}{
		{func(c map[string]any) { c["enable_moe_block"] = false }, "enable_moe_block is false: this Gemma 4 is dense"},
		{func(c map[string]any) { delete(c, "enable_moe_block") }, "enable_moe_block is false"},
		{func(c map[string]any) { c["hidden_activation"] = "gelu" }, `hidden_activation "gelu"`},
		{func(c map[string]any) { c["rms_norm_eps"] = -1.0 }, "rms_norm_eps=-1"},
		{func(c map[string]any) { c["top_k_experts"] = 9.0 }, "exceeds the 8 routed experts"},
	} {
		_, err := planEdited(t, "gemma4-text", bad.edit)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("edited config: error %v, want one naming %q", err, bad.want)
		}
	}
}
