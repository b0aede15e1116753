package family

import (
	"encoding/json"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit/handwrap"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/safetensors"
)

// hand is one of handwrap's wrapper checkpoints as Detect reads it: the
// config through JSON (numbers as float64), the tensors from their shapes,
// views resolved; edit changes the config, rename the tensor names.
func hand(t *testing.T, mt string, edit func(cfg, text map[string]any), rename func(string) string) (map[string]any, viewTensors) {
	t.Helper()
	h, ok := handwrap.Wrappers()[mt]
	if !ok {
		t.Fatalf("no hand-built %s", mt)
	}
	b, err := json.Marshal(h.Config)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		text, _ := cfg["text_config"].(map[string]any)
		if th, ok := cfg["thinker_config"].(map[string]any); ok {
			text = th["text_config"].(map[string]any)
		}
		edit(cfg, text)
	}
	ts := &MemTensors{}
	for _, n := range slices.Sorted(maps.Keys(h.Tensors)) {
		dt := safetensors.BF16
		if strings.Contains(n, "correction_bias") {
			dt = safetensors.F32
		}
		if rename != nil {
			n2 := rename(n)
			ts.Add(n2, dt, h.Tensors[n]...)
			continue
		}
		ts.Add(n, dt, h.Tensors[n]...)
	}
	return cfg, viewTensors{ts}
}

// Issue 30's second set of wrappers, planned from checkpoints built by hand
// as transformers 5.17 saves them: where the text config and layers are,
// which layers are MoE, the routing and the names of every MoE tensor.
func TestPlanWrappers2(t *testing.T) {
	cases := []struct {
		mt     string
		rename func(string) string
		edit   func(cfg, text map[string]any)
		check  func(t *testing.T, p *Plan)
	}{
		{mt: "qwen3_omni_moe", check: func(t *testing.T, p *Plan) {
			w := p.Wrapper
			if w.TextConfig != "thinker_config.text_config" || w.Layers != "thinker.model.layers." || p.Family != "qwen3_omni_moe" ||
				!slices.Equal(w.Text, []string{"thinker.model.", "thinker.lm_head."}) {
				t.Errorf("wrapper %+v, family %s", w, p.Family)
			}
			l := p.Layers[0]
			if len(p.Layers) != 1 || l.Index != 1 || l.Router != "thinker.model.layers.1.mlp.gate.weight" || l.Shared != nil ||
				l.Experts[3].Weight(layout.ProjDown) != "thinker.model.layers.1.mlp.experts.3.down_proj.weight" {
				t.Errorf("layers %+v", p.Layers)
			}
			if p.Scoring != moe.Softmax || !p.NormTopKProb || p.TopK != 2 || p.NumExperts != 4 || p.NumSharedExperts != 0 {
				t.Errorf("routing %+v", p)
			}
		}},
		// Qwen3OmniMoeTextConfig renormalises by default (Qwen3-MoE's does not).
		{mt: "qwen3_omni_moe", edit: func(_, text map[string]any) { delete(text, "norm_topk_prob") }, check: func(t *testing.T, p *Plan) {
			if !p.NormTopKProb {
				t.Error("norm_topk_prob absent: not renormalised")
			}
		}},
		{mt: "aria", check: func(t *testing.T, p *Plan) {
			if p.Wrapper.Layers != "language_model.model.layers." || p.Family != "aria" || len(p.Layers) != 2 {
				t.Fatalf("wrapper %+v, family %s, %d layers", p.Wrapper, p.Family, len(p.Layers))
			}
			l := p.Layers[1]
			pre := "language_model.model.layers.1.mlp."
			if l.Router != pre+"router.weight" || l.Experts[2].Weight(layout.ProjGate) != pre+"experts.fc1.weight[2][T:0:8:1]" ||
				l.Experts[2].Weight(layout.ProjUp) != pre+"experts.fc1.weight[2][T:8:8:1]" || l.Experts[2].Weight(layout.ProjDown) != pre+"experts.fc2.weight[2][T:0:16:1]" ||
				l.Shared == nil || l.Shared.Weight(layout.ProjDown) != pre+"shared_experts.down_proj.weight" {
				t.Errorf("layer 1 %+v", l)
			}
			if p.Scoring != moe.Softmax || !p.NormTopKProb || p.NumSharedExperts != 2 || p.SharedIntermediateSize != 16 || p.RoutedScalingFactor != 1 {
				t.Errorf("routing %+v", p)
			}
		}},
		// transformers' in-memory names (model.language_model.layers.L): the same plan there.
		{mt: "aria", rename: func(n string) string {
			return strings.Replace(strings.Replace(n, "language_model.model.", "model.language_model.", 1), "language_model.lm_head", "lm_head", 1)
		}, check: func(t *testing.T, p *Plan) {
			if p.Wrapper.Layers != "model.language_model.layers." || p.Layers[0].Router != "model.language_model.layers.0.mlp.router.weight" {
				t.Errorf("wrapper %+v, router %s", p.Wrapper, p.Layers[0].Router)
			}
		}},
		// the llava mapping reversed on save (^model.language_model -> language_model): language_model.layers.L.
		{mt: "aria", rename: func(n string) string {
			return strings.Replace(n, "language_model.model.", "language_model.", 1)
		}, check: func(t *testing.T, p *Plan) {
			if p.Wrapper.Layers != "language_model.layers." || p.Layers[1].Experts[0].Weight(layout.ProjDown) != "language_model.layers.1.mlp.experts.fc2.weight[0][T:0:16:1]" {
				t.Errorf("wrapper %+v, expert 0 %+v", p.Wrapper, p.Layers[1].Experts[0])
			}
		}},
		{mt: "minimax_m3_vl", check: func(t *testing.T, p *Plan) {
			pre := "language_model.model.layers.1.block_sparse_moe."
			if p.ModelType != "minimax_m3_vl_text" || p.Family != "minimax_m3" || len(p.Layers) != 1 || p.Layers[0].Index != 1 {
				t.Fatalf("planned %s (%s), %d layers", p.ModelType, p.Family, len(p.Layers))
			}
			l := p.Layers[0]
			if l.Router != pre+"gate.weight" || l.RouterBias != pre+"e_score_correction_bias" || l.Experts[1].Weight(layout.ProjUp) != pre+"experts.1.w3.weight" ||
				l.Shared == nil || l.Shared.Weight(layout.ProjGate) != pre+"shared_experts.gate_proj.weight" {
				t.Errorf("layer %+v", l)
			}
			if p.Scoring != moe.Sigmoid || p.TopKMethod != moe.TopKNoAuxTC || !p.NormTopKProb || p.RoutedScalingFactor != 2 ||
				p.Act != (layout.Activation{Alpha: 1.702, Limit: 0.5, UpOffset: 1}) || p.NumSharedExperts != 1 {
				t.Errorf("routing %+v", p)
			}
		}},
		// mlp_layer_types wins over moe_layer_freq; without either every layer is MoE.
		{mt: "minimax_m3_vl", edit: func(_, text map[string]any) {
			text["mlp_layer_types"] = []any{"sparse", "dense"}
		}, rename: func(n string) string { // layer 1's MoE becomes layer 0's, layer 0's dense MLP layer 1's
			n = strings.Replace(n, ".layers.1.", ".layers.x.", 1)
			n = strings.Replace(n, ".layers.0.", ".layers.1.", 1)
			return strings.Replace(n, ".layers.x.", ".layers.0.", 1)
		}, check: func(t *testing.T, p *Plan) {
			if len(p.Layers) != 1 || p.Layers[0].Index != 0 {
				t.Errorf("MoE layers %+v", p.Layers)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.mt, func(t *testing.T) {
			cfg, ts := hand(t, c.mt, c.edit, c.rename)
			p, err := Detect(cfg, ts)
			if err != nil {
				t.Fatal(err)
			}
			if p.Wrapper == nil || p.Wrapper.ModelType != c.mt {
				t.Fatalf("wrapper %+v", p.Wrapper)
			}
			c.check(t, p)
		})
	}
}

// What the second set of wrappers cannot carry exactly is refused in one
// line naming the model type (or the key) and why.
func TestRefuseWrappers2(t *testing.T) {
	top := func(mt string) func(cfg, _ map[string]any) {
		return func(cfg, _ map[string]any) { cfg["model_type"] = mt }
	}
	cases := []struct {
		name, mt string
		edit     func(cfg, text map[string]any)
		rename   func(string) string
		want     string
	}{
		{"cosmos3_omni", "aria", top("cosmos3_omni"), nil, `model_type "cosmos3_omni" is not supported: Cosmos3-Omni is not a MoE model`},
		{"aria hidden_act", "aria", func(_, text map[string]any) { text["hidden_act"] = "gelu" },
			nil, `config.json: text_config: hidden_act "gelu" is not supported for aria_text`},
		{"aria text type", "aria", func(_, text map[string]any) { text["model_type"] = "llama" },
			nil, `config.json: text_config.model_type "llama": a aria wrapper holds aria_text`},
		{"omni without thinker", "qwen3_omni_moe", func(cfg, _ map[string]any) { delete(cfg, "thinker_config") },
			nil, `config.json: model_type "qwen3_omni_moe" keeps its language model's config under thinker_config.text_config, which is missing`},
		{"minimax moe_layer_freq", "minimax_m3_vl", func(_, text map[string]any) { text["moe_layer_freq"] = []any{0.0, 2.0} },
			nil, `config.json: text_config: moe_layer_freq[1] = 2 (want 0 or 1)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, ts := hand(t, c.mt, c.edit, c.rename)
			_, err := Detect(cfg, ts)
			if err == nil || !strings.HasPrefix(err.Error(), c.want) && !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") ||
				strings.Contains(err.Error(), "except the multimodal wrappers") {
				t.Errorf("got %v\nwant %s", err, c.want)
			}
		})
	}
}

// Inkling's multimodal model as transformers 5.17 saves it, in the hub's
// layout (fixtures/hf/inkling-mm-model): model.llm.layers.L, each routed
// and shared expert's gate and up the even and odd rows of its w13 slice
// (transformers loads them with Interleave(dim=1)), down its w2 slice, the
// correction bias gate.bias.
func TestPlanInklingHub(t *testing.T) {
	cfg, ts := wrapperFixture(t, "inkling-mm-model")
	p, err := Detect(cfg, ts)
	if err != nil {
		t.Fatal(err)
	}
	if w := p.Wrapper; w == nil || w.ModelType != "inkling_mm_model" || w.Layers != "model.llm.layers." || p.Family != "inkling_text" ||
		!slices.Equal(w.Text, []string{"model.language_model.", "model.llm.", "lm_head."}) {
		t.Fatalf("plan %s, wrapper %+v", p.Family, p.Wrapper)
	}
	if len(p.Layers) != 2 || p.Layers[0].Index != 1 || !p.SharedRouted || p.NumSharedExperts != 2 || p.RoutedScalingFactor != 2.5 {
		t.Fatalf("plan %+v", p)
	}
	pre := "model.llm.layers.2.mlp."
	l := p.Layers[1]
	if l.Router != pre+"gate.weight" || l.RouterBias != pre+"gate.bias" || l.RouterScale != pre+"gate.global_scale" || l.Shared != nil {
		t.Errorf("router %s, bias %s, scale %s, shared %+v", l.Router, l.RouterBias, l.RouterScale, l.Shared)
	}
	if e, want := l.Experts[5], (MLPOf(pre+"experts.w13_weight[5][R:0:32:2]", pre+"experts.w13_weight[5][R:1:32:2]", pre+"experts.w2_weight[5]")); e != want {
		t.Errorf("expert 5 %+v\nwant     %+v", e, want)
	}
	sh := pre + "shared_experts."
	if len(l.SharedExperts) != 2 || l.SharedExperts[1] != (MLPOf(sh+"shared_w13_weight[1][R:0:32:2]", sh+"shared_w13_weight[1][R:1:32:2]", sh+"shared_w2_weight[1]")) {
		t.Errorf("shared experts %+v", l.SharedExperts)
	}
}

// The layout transformers 5.17 holds in memory (model.language_model.layers.L,
// experts.gate_up_proj gate rows then up rows, shared gate_proj/up_proj/
// down_proj) is still planned as it was: the hub's names apply under the
// hub's prefix only.
func TestPlanInklingInMemory(t *testing.T) {
	cfg, _ := wrapperFixture(t, "inkling-mm-model")
	saved := readHeaders(t, filepath.Join("..", "fixtures", "hf", "inkling-text"))
	ts := viewTensors{&MemTensors{}}
	for _, n := range saved.Names() {
		m, _ := saved.Lookup(n)
		ts.Add(strings.Replace(n, "model.", "model.language_model.", 1), m.DType, m.Shape...)
	}
	p, err := Detect(cfg, ts)
	if err != nil {
		t.Fatal(err)
	}
	pre := "model.language_model.layers.1.mlp."
	l := p.Layers[0]
	if p.Wrapper.Layers != "model.language_model.layers." || l.RouterBias != pre+"gate.e_score_correction_bias" ||
		l.Experts[3] != (MLPOf(pre+"experts.gate_up_proj[3][0:32]", pre+"experts.gate_up_proj[3][32:64]", pre+"experts.down_proj[3]")) ||
		l.SharedExperts[0] != (MLPOf(pre+"shared_experts.gate_proj[0]", pre+"shared_experts.up_proj[0]", pre+"shared_experts.down_proj[0]")) {
		t.Errorf("wrapper %+v, layer %+v", p.Wrapper, l)
	}
}

// A hub-layout Inkling whose w13/w2 tensors are missing or misshapen is
// refused in one line naming the tensor and the shape it needs.
func TestRefuseInklingHub(t *testing.T) {
	pre := "model.llm.layers.1.mlp."
	cases := []struct {
		name string
		edit func(t *testing.T, ts viewTensors)
		want string
	}{
		{"w13 rows", func(t *testing.T, ts viewTensors) { ts.Add(pre+"experts.w13_weight", safetensors.BF16, 8, 32, 64) },
			pre + "experts.w13_weight shape [8,32,64], expected [8,64,64] (E=8, H=64, I=32: experts stacked on disk)"},
		{"w2 missing", func(t *testing.T, ts viewTensors) { del(t, ts.MemTensors, pre+"experts.w2_weight") }, pre + "experts.w2_weight"},
		{"shared w13 rows", func(t *testing.T, ts viewTensors) {
			ts.Add(pre+"shared_experts.shared_w13_weight", safetensors.BF16, 2, 32, 64)
		},
			pre + "shared_experts.shared_w13_weight shape [2,32,64], expected [2,64,64] (S=2, H=64, I=32: shared experts stacked on disk)"},
		{"shared w2 missing", func(t *testing.T, ts viewTensors) { del(t, ts.MemTensors, pre+"shared_experts.shared_w2_weight") },
			"missing tensor " + pre + "shared_experts.shared_w2_weight"},
		{"bias missing", func(t *testing.T, ts viewTensors) { del(t, ts.MemTensors, pre+"gate.bias") }, pre + "gate.bias"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, ts := wrapperFixture(t, "inkling-mm-model")
			c.edit(t, ts)
			_, err := Detect(cfg, ts)
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("got %v\nwant one line naming %s", err, c.want)
			}
		})
	}
}
