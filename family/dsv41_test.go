package family_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// TestDeepSeekV41Plan: DeepSeek-V4.1's release (preset small-deepseek-v41:
// the composite config, DeepSeek's names, FP4 experts beside FP8 32x32)
// plans its text model inside the wrapper: every layer routed by top-k (no
// hash table), the routed experts MXFP4 in DeepSeek's names, the shared
// expert FP8 in 32x32 blocks under x.scale F8_E8M0, whose format says so.
func TestDeepSeekV41Plan(t *testing.T) {
	dir := cktest.WriteSpec(t, filepath.Join(t.TempDir(), "src"), cktest.Preset(t, "small-deepseek-v41"))
	p, err := family.Detect(testkit.ReadJSON(t, filepath.Join(dir, "config.json")), cktest.Open(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	if p.Family != "deepseek_v41_text" || p.Wrapper == nil || p.Wrapper.ModelType != "deepseek_v41" || p.Wrapper.Layers != "layers." {
		t.Fatalf("plan family %s wrapper %+v", p.Family, p.Wrapper)
	}
	if p.Quantization != family.QuantMXFP4 || p.Naming != weightfmt.NamingDeepSeek || p.FP8Block != 32 || len(p.Layers) != 3 ||
		p.RoutedScalingFactor != 1.5 || p.Scoring != moe.SqrtSoftplus || p.Act.Limit != 10 {
		t.Fatalf("plan %s %q block %d, %d layers, rsf %g scoring %v limit %g", p.Quantization, p.Naming, p.FP8Block, len(p.Layers), p.RoutedScalingFactor, p.Scoring, p.Act.Limit)
	}
	for _, l := range p.Layers {
		if l.HashTable != "" || l.RouterBias != l.Prefix+".gate.bias" || !strings.HasPrefix(l.Prefix, "layers.") {
			t.Errorf("layer %d: prefix %q hash %q bias %q", l.Index, l.Prefix, l.HashTable, l.RouterBias)
		}
	}
	if s := p.Layers[2].Shared; s == nil || s.Get(layout.ProjDown, layout.RoleScale) != "layers.2.ffn.shared_experts.w2.scale" {
		t.Fatalf("layer 2 shared %+v", s)
	}
	if p.SharedQuantization != family.QuantFP8Block || p.SharedScaleDType != safetensors.F8E8M0 || !slices.Equal(p.SharedBlock(), []int64{32, 32}) {
		t.Errorf("shared %s scale %s block %v", p.SharedQuantization, p.SharedScaleDType, p.SharedBlock())
	}
	sf, err := p.SharedFormat()
	if err != nil {
		t.Fatal(err)
	}
	if sc, _ := sf.Scale(); sc.Block != [2]int64{32, 32} || sc.DType != safetensors.F8E8M0 || sc.Suffix != ".scale" {
		t.Errorf("shared format scale %+v, want 32x32 F8_E8M0 .scale", sc)
	}
}

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
