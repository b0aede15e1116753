package family_test

import (
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
)

// TestKimiK3Plan: Kimi K3 as its release lays it out (model_type kimi_k3,
// a kimi_linear text config, language_model.layers.L) is planned as a
// latent MoE: the bank at routed_expert_hidden_size, the router and shared
// experts at hidden_size, the three latent tensors named per layer, SiTU
// with the config's betas. What the two engines read from the config
// without a default is refused when absent, in one line.
func TestKimiK3Plan(t *testing.T) {
	dir := cktest.WriteSpec(t, filepath.Join(t.TempDir(), "src"), cktest.Preset(t, "small-kimi-k3"))
	ck := cktest.Open(t, dir)
	base := testkit.ReadJSON(t, filepath.Join(dir, "config.json"))
	text := base["text_config"].(map[string]any)
	with := func(k string, v any, drop bool) map[string]any {
		c, tc := maps.Clone(base), maps.Clone(text)
		if drop {
			delete(tc, k)
		} else {
			tc[k] = v
		}
		c["text_config"] = tc
		return c
	}
	p, err := family.Detect(base, ck)
	if err != nil {
		t.Fatal(err)
	}
	if p.Latent == nil || p.Latent.Hidden != 64 || p.HiddenSize != 32 || p.ModelHidden() != 64 || !p.Latent.Norm || p.Latent.Eps != 1e-6 {
		t.Fatalf("latent %+v, HiddenSize %d: want H 64, bank 32, norm eps 1e-6", p.Latent, p.HiddenSize)
	}
	if p.Act != layout.SiTU(4, 25) || p.Quantization != family.QuantMXFP4 || p.SharedQuantization != family.QuantNone || p.NumSharedExperts != 2 {
		t.Errorf("act %+v quant %s shared %q x%d", p.Act, p.Quantization, p.SharedQuantization, p.NumSharedExperts)
	}
	l := p.Layers[0]
	pre := "language_model.layers.1.block_sparse_moe."
	if l.LatentDown != pre+"routed_expert_down_proj.weight" || l.LatentNorm != pre+"routed_expert_norm.weight" || l.LatentUp != pre+"routed_expert_up_proj.weight" {
		t.Errorf("latent tensors %q %q %q", l.LatentDown, l.LatentNorm, l.LatentUp)
	}
	for _, tc := range []struct {
		name   string
		config map[string]any
		want   string
	}{
		{"no latent_moe_use_norm", with("latent_moe_use_norm", nil, true),
			"config.json: text_config: routed_expert_hidden_size 32 (a latent MoE) without latent_moe_use_norm, which the latent norm reads"},
		{"no rms_norm_eps", with("rms_norm_eps", nil, true),
			"config.json: text_config: routed_expert_hidden_size 32 (a latent MoE) without rms_norm_eps, which the latent norm reads"},
		{"a norm the config turns off", with("latent_moe_use_norm", false, false),
			"layer 1: holds language_model.layers.1.block_sparse_moe.routed_expert_norm.weight but config.json's latent_moe_use_norm is false"},
		{"latent tensors without a latent width", with("routed_expert_hidden_size", nil, false),
			"layer 1: holds language_model.layers.1.block_sparse_moe.routed_expert_down_proj.weight, a latent MoE's, but config.json gives no routed_expert_hidden_size"},
		{"another latent width", with("routed_expert_hidden_size", 16, false),
			"layer 1: latent down projection language_model.layers.1.block_sparse_moe.routed_expert_down_proj.weight shape [32,64], expected [16,64] (H=64, latent L=16)"},
		{"another activation", with("hidden_act", "gelu", false),
			`config.json: text_config: hidden_act: "gelu": moeprep computes Kimi-Linear's and Kimi K3's experts with silu or situ only`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := family.Detect(tc.config, ck)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("got %v, want one line starting %q", err, tc.want)
			}
		})
	}
	// Kimi-Linear itself is planned as before: no latent, SwiGLU.
	kl := cktest.WriteSpec(t, filepath.Join(t.TempDir(), "kl"), cktest.Preset(t, "small-kimi-k3-mxfp4"))
	q, err := planEditedDir(t, kl, nil)
	if err != nil || q.Latent != nil || !q.Act.SwiGLU() || q.HiddenSize != 64 {
		t.Errorf("kimi_linear: %v, latent %+v act %+v H %d", err, q.Latent, q.Act, q.HiddenSize)
	}
}
