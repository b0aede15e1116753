package family

import (
	"fmt"
	"github.com/moeprep/moeprep/layout"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// dsWrapperCheckpoint is a multimodal wrapper's checkpoint as transformers
// 5.17 saves it: the text model's decoder layers under layers (gen's
// model.layers. moved there), a vision tower beside them.
func dsWrapperCheckpoint(t *testing.T, top map[string]any, text map[string]any, layers string, hub string, bias bool) (map[string]any, *MemTensors) {
	t.Helper()
	g := gen{cfg: text, layers: 3, moe: []int{1, 2}, h: 64, i: 32, e: 8, sharedI: 64, bias: bias,
		dtype: safetensors.BF16, modelTyp: hub}
	_, f := g.build(t)
	out := &MemTensors{}
	for _, n := range f.Names() {
		m, _ := f.Lookup(n)
		out.Add(strings.Replace(n, "model.layers.", layers, 1), m.DType, m.Shape...)
	}
	// vision towers whose own layers must not be taken for the text model's
	out.Add("model.qwen2_model.model.model.layers.0.mlp.gate_proj.weight", safetensors.BF16, 96, 64)
	out.Add("model.visual.blocks.0.mlp.gate_proj.weight", safetensors.BF16, 96, 64)
	cfg := map[string]any{}
	for k, v := range top {
		cfg[k] = v
	}
	cfg["text_config"] = text
	return decodeConfig(t, cfg, false), out
}

// DeepSeek-OCR-2 (DeepSeek-V2's MoE text model, saved as model.layers.L)
// and GLM-5.3-Flash (DeepSeek-V3's router, clamped experts, under
// model.language_model.layers.L) planned inside their wrappers.
func TestDSWrappers(t *testing.T) {
	ocr := func(kv ...any) map[string]any {
		m := map[string]any{"model_type": "deepseek_ocr2_text", "hidden_size": 64, "num_hidden_layers": 3,
			"moe_intermediate_size": 32, "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 2,
			"topk_method": "greedy", "mlp_layer_types": []any{"dense", "sparse", "sparse"}, "routed_scaling_factor": 1.0}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	glm := func(kv ...any) map[string]any {
		m := map[string]any{"model_type": "glm5_next_text", "hidden_size": 64, "num_hidden_layers": 3,
			"moe_intermediate_size": 32, "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 2,
			"n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5, "swiglu_limit": 7.0,
			"mlp_layer_types": []any{"dense", "sparse", "sparse"}}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	ocrTop := map[string]any{"model_type": "deepseek_ocr2"}
	glmTop := map[string]any{"model_type": "glm5_next"}
	cases := []struct {
		name        string
		top, text   map[string]any
		layers, hub string
		bias        bool
		want        string // plan summary, or an error substring
	}{
		{"ocr2 greedy", ocrTop, ocr(), "model.layers.", "deepseek_v2", false,
			"deepseek_ocr2/deepseek_ocr2_text in deepseek_ocr2 at model.layers. [1 2] E8 k2 S2 softmax greedy g1/1 nonorm rsf 1 limit 0 bias \"\""},
		{"ocr2 group limited", ocrTop, ocr("topk_method", "group_limited_greedy", "n_group", 2, "topk_group", 1, "routed_scaling_factor", 2.0),
			"model.layers.", "deepseek_v2", false,
			"deepseek_ocr2/deepseek_ocr2_text in deepseek_ocr2 at model.layers. [1 2] E8 k2 S2 softmax group_limited_greedy g2/1 nonorm rsf 2 limit 0 bias \"\""},
		{"ocr2 norm_topk_prob is not read", ocrTop, ocr("norm_topk_prob", true), "model.layers.", "deepseek_v2", false,
			"deepseek_ocr2/deepseek_ocr2_text in deepseek_ocr2 at model.layers. [1 2] E8 k2 S2 softmax greedy g1/1 nonorm rsf 1 limit 0 bias \"\""},
		{"ocr2 noaux_tc", ocrTop, ocr("topk_method", "noaux_tc"), "model.layers.", "deepseek_v2", false,
			`config.json: text_config: topk_method "noaux_tc" is not supported for deepseek_ocr2_text`},
		{"glm5 next", glmTop, glm(), "model.language_model.layers.", "deepseek_v3", true,
			"glm5_next/glm5_next_text in glm5_next at model.language_model.layers. [1 2] E8 k2 S2 sigmoid noaux_tc g2/1 norm rsf 2.5 limit 7 bias \"model.language_model.layers.1.mlp.gate.e_score_correction_bias\""},
		{"glm5 next default limit", glmTop, glm("swiglu_limit", nil), "model.language_model.layers.", "deepseek_v3", true,
			"glm5_next/glm5_next_text in glm5_next at model.language_model.layers. [1 2] E8 k2 S2 sigmoid noaux_tc g2/1 norm rsf 2.5 limit 10 bias \"model.language_model.layers.1.mlp.gate.e_score_correction_bias\""},
		{"glm5 next no bias", glmTop, glm(), "model.language_model.layers.", "deepseek_v3", false,
			"layer 1: router bias: missing tensor model.language_model.layers.1.mlp.gate.e_score_correction_bias"},
		{"glm5 next limit 0", glmTop, glm("swiglu_limit", 0.0), "model.language_model.layers.", "deepseek_v3", true,
			"config.json: text_config: swiglu_limit=0 must be positive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, ts := dsWrapperCheckpoint(t, tc.top, tc.text, tc.layers, tc.hub, tc.bias)
			p, err := Detect(cfg, ts)
			if err != nil {
				if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") || !strings.Contains(tc.want, ":") {
					t.Errorf("err = %v, want one line with %q", err, tc.want)
				}
				return
			}
			var moe []int
			for _, l := range p.Layers {
				moe = append(moe, l.Index)
			}
			got := fmt.Sprintf("%s/%s in %s at %s %v E%d k%d S%d %s %s g%d/%d %s rsf %v limit %v bias %q", p.Family, p.ModelType,
				p.Wrapper.ModelType, p.Wrapper.Layers, moe, p.NumExperts, p.TopK, p.NumSharedExperts, p.Scoring, p.TopKMethod,
				p.NGroup, p.TopKGroup, map[bool]string{true: "norm", false: "nonorm"}[p.NormTopKProb], p.RoutedScalingFactor,
				p.Act.Limit, p.Layers[0].RouterBias)
			if got != tc.want {
				t.Errorf("plan\n got %s\nwant %s", got, tc.want)
			}
			if e := p.Layers[1].Experts[7].Weight(layout.ProjDown); e != tc.layers+"2.mlp.experts.7.down_proj.weight" {
				t.Errorf("expert 7 of layer 2: %s", e)
			}
			if s := p.Layers[0].Shared; s == nil || s.Weight(layout.ProjGate) != tc.layers+"1.mlp.shared_experts.gate_proj.weight" {
				t.Errorf("shared expert %+v", s)
			}
		})
	}
	fusable := FuseSharedModelTypes()
	for _, w := range []string{"deepseek_ocr2", "glm5_next"} {
		if !slices.Contains(SupportedWrappers(), w) || !slices.Contains(fusable, w) {
			t.Errorf("%s: wrappers %v, fusable %v", w, SupportedWrappers(), fusable)
		}
	}
	// A flat GLM-5.3-Flash config.json (text keys at the top level) is refused naming text_config.
	_, ts := dsWrapperCheckpoint(t, glmTop, glm(), "model.language_model.layers.", "deepseek_v3", true)
	flat := glm()
	flat["model_type"] = "glm5_next"
	if _, err := Detect(decodeConfig(t, flat, false), ts); err == nil ||
		err.Error() != `config.json: model_type "glm5_next" keeps its language model's config under text_config, which is missing` {
		t.Errorf("flat config: %v", err)
	}
}
