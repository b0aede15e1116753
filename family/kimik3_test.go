package family_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
)

// TestKimiK3Refused: Kimi K3, as its release names it or as its text
// model's kimi_linear config, is refused in one line naming the latent MoE
// or the activation moeprep does not compute; Kimi-Linear itself is not.
func TestKimiK3Refused(t *testing.T) {
	dir := cktest.WriteSpec(t, filepath.Join(t.TempDir(), "src"), cktest.Preset(t, "small-kimi-k3-mxfp4"))
	ck := cktest.Open(t, dir)
	base := testkit.ReadJSON(t, filepath.Join(dir, "config.json"))
	with := func(k string, v any) map[string]any {
		c := map[string]any{}
		for kk, vv := range base {
			c[kk] = vv
		}
		c[k] = v
		return c
	}
	for _, tc := range []struct {
		name   string
		config map[string]any
		want   string // "" : planned
	}{
		{"kimi_linear as it is", base, ""},
		{"the release's model type", map[string]any{"model_type": "kimi_k3", "text_config": base},
			`config.json: model_type "kimi_k3" is not supported: Kimi K3's latent MoE runs its routed experts between routed_expert_down_proj and routed_expert_norm + routed_expert_up_proj (routed_expert_hidden_size) with the SiTU activation (hidden_act situ), a block moeprep's layer model does not hold`},
		{"a latent width", with("routed_expert_hidden_size", 32),
			"config.json: routed_expert_hidden_size: 32: Kimi K3's latent MoE runs its routed experts between routed_expert_down_proj"},
		{"a null latent width is Kimi-Linear's", with("routed_expert_hidden_size", nil), ""},
		{"SiTU", with("hidden_act", "situ"), `config.json: hidden_act: "situ": moeprep computes Kimi-Linear's experts with silu (SwiGLU) only`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := family.Detect(tc.config, ck)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "" && (p.Quantization != family.QuantMXFP4 || p.NumExperts != 32 || p.SharedQuantization != family.QuantNone):
				t.Errorf("plan %s, %d experts, shared %q", p.Quantization, p.NumExperts, p.SharedQuantization)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "\n")):
				t.Errorf("got %v, want one line starting %q", err, tc.want)
			}
		})
	}
}
