package family

import (
	"errors"
	"github.com/moeprep/moeprep/layout"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/quantwrap"
	"github.com/moeprep/moeprep/quantdesc"
	"github.com/moeprep/moeprep/safetensors"
)

// wrapperFixture reads one of fixtures/hf/export_wrappers.py's checkpoints.
func wrapperFixture(t *testing.T, name string) (map[string]any, viewTensors) {
	t.Helper()
	dir := filepath.Join("..", "fixtures", "hf", name)
	return testkit.ReadJSON(t, filepath.Join(dir, "config.json")), viewTensors{readHeaders(t, dir)}
}

// viewTensors resolves the views a plan of stacked experts names (view.go)
// to their 2-D shapes, as checkpoint does, from the stored tensor's shape.
type viewTensors struct{ *MemTensors }

var viewRE = regexp.MustCompile(`^(.+)\[(\d+)\](?:\[(\d+):(\d+)\]|\[T:(\d+):(\d+):(\d+)\]|\[R:(\d+):(\d+):(\d+)\])?$`)

func (v viewTensors) Lookup(name string) (TensorMeta, bool) {
	if m, ok := v.MemTensors.Lookup(name); ok {
		return m, true
	}
	g := viewRE.FindStringSubmatch(name)
	if g == nil {
		return TensorMeta{}, false
	}
	m, ok := v.MemTensors.Lookup(g[1])
	if !ok || len(m.Shape) != 3 {
		return TensorMeta{}, false
	}
	n := func(s string) int64 { x, _ := strconv.ParseInt(s, 10, 64); return x }
	switch {
	case g[3] != "":
		return TensorMeta{DType: m.DType, Shape: []int64{n(g[4]) - n(g[3]), m.Shape[2]}}, true
	case g[5] != "":
		return TensorMeta{DType: m.DType, Shape: []int64{n(g[6]), m.Shape[1]}}, true
	case g[8] != "":
		if r0, k, step := n(g[8]), n(g[9]), n(g[10]); k < 1 || step < 1 || r0+(k-1)*step >= m.Shape[1] {
			return TensorMeta{}, false
		}
		return TensorMeta{DType: m.DType, Shape: []int64{n(g[9]), m.Shape[2]}}, true
	}
	return TensorMeta{DType: m.DType, Shape: m.Shape[1:]}, true
}

// The wrappers transformers 5.17 wrote: the text model planned under its
// prefix, the wrapper recorded, every MoE tensor under the text layers.
func TestPlanWrapperFixtures(t *testing.T) {
	cases := []struct {
		dir, family, text, layers string
		moe                       []int
	}{
		{"qwen3-5-moe", "qwen3_5_moe", "qwen3_5_moe_text", "model.language_model.layers.", []int{0, 1}},
		{"llama4", "llama4", "llama4_text", "language_model.model.layers.", []int{1, 3}},
		{"kimi-k25", "deepseek", "deepseek_v3", "language_model.model.blocks.", []int{1, 2}},
		{"qwen3-vl-moe", "qwen3_vl_moe", "qwen3_vl_moe_text", "model.language_model.layers.", []int{1, 2}},
		{"glm4v-moe", "deepseek", "glm4v_moe_text", "model.language_model.layers.", []int{1, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.dir, func(t *testing.T) {
			cfg, ts := wrapperFixture(t, tc.dir)
			p, err := Detect(cfg, ts)
			if err != nil {
				t.Fatal(err)
			}
			w := p.Wrapper
			if w == nil || w.ModelType != cfg["model_type"] || w.TextConfig != "text_config" || w.TextModelType != tc.text ||
				w.Layers != tc.layers || p.Family != tc.family || p.ModelType != tc.text {
				t.Fatalf("plan %s (%s), wrapper %+v", p.Family, p.ModelType, w)
			}
			var idx []int
			for _, l := range p.Layers {
				idx = append(idx, l.Index)
				if !strings.HasPrefix(l.Router, tc.layers) || !strings.HasPrefix(BaseName(l.Experts[0].Weight(layout.ProjDown)), tc.layers) {
					t.Errorf("layer %d: router %s, expert 0 %s outside %s", l.Index, l.Router, l.Experts[0].Weight(layout.ProjDown), tc.layers)
				}
			}
			if !slices.Equal(idx, tc.moe) {
				t.Errorf("MoE layers %v, want %v", idx, tc.moe)
			}
		})
	}
}

// Kimi-K2.5 as its hub release names its text layers
// (language_model.model.layers.L), not as transformers 5.17 saves them
// (language_model.model.blocks.L): the same plan under the other prefix.
func TestKimiK25HubPrefix(t *testing.T) {
	cfg, saved := wrapperFixture(t, "kimi-k25")
	hub := &MemTensors{}
	for _, n := range saved.Names() {
		m, _ := saved.Lookup(n)
		hub.Add(strings.Replace(n, "language_model.model.blocks.", "language_model.model.layers.", 1), m.DType, m.Shape...)
	}
	text := maps.Clone(cfg["text_config"].(map[string]any))
	text["model_type"] = "kimi_k2" // as the hub's config.json says
	cfg["text_config"] = text
	p, err := Detect(cfg, hub)
	if err != nil {
		t.Fatal(err)
	}
	if p.Wrapper.Layers != "language_model.model.layers." || p.ModelType != "kimi_k2" || len(p.Layers) != 2 ||
		p.Layers[1].Router != "language_model.model.layers.2.mlp.gate.weight" {
		t.Errorf("planned %s under %s: %+v", p.ModelType, p.Wrapper.Layers, p.Layers[1])
	}
}

// Qwen3-VL-MoE's experts are planned in the orientation their shapes say:
// transformers' save [E, 2I, H] / [E, H, I], the hub's [E, H, 2I] / [E, I,
// H]; shapes that disagree are refused naming both.
func TestQwen3VLMoEOrientation(t *testing.T) {
	cfg, ts := wrapperFixture(t, "qwen3-vl-moe") // H 64 = 2I: only down tells
	p, err := Detect(cfg, ts)
	if err != nil {
		t.Fatal(err)
	}
	if g := p.Layers[0].Experts[3].Weight(layout.ProjGate); g != "model.language_model.layers.1.mlp.experts.gate_up_proj[3][0:32]" {
		t.Errorf("untransposed gate view %s", g)
	}
	bf := safetensors.BF16
	for l := 1; l <= 2; l++ {
		pre := "model.language_model.layers." + string(rune('0'+l)) + ".mlp.experts."
		ts.Add(pre+"down_proj", bf, 8, 32, 64)
	}
	if p, err = Detect(cfg, ts); err != nil {
		t.Fatal(err)
	}
	if g := p.Layers[0].Experts[3].Weight(layout.ProjGate); g != "model.language_model.layers.1.mlp.experts.gate_up_proj[3][T:0:32:1]" {
		t.Errorf("transposed gate view %s", g)
	}
	text := maps.Clone(cfg["text_config"].(map[string]any))
	text["moe_intermediate_size"] = 16.0 // 2I = 32: gate-up [8,64,64] now fits neither
	c2 := maps.Clone(cfg)
	c2["text_config"] = text
	ts.Add("model.language_model.layers.1.mlp.experts.gate_up_proj", bf, 8, 32, 64)
	ts.Add("model.language_model.layers.1.mlp.experts.down_proj", bf, 8, 16, 64)
	want := "layer 1: model.language_model.layers.1.mlp.experts.gate_up_proj is stored as [out, in] but model.language_model.layers.1.mlp.experts.down_proj transposed (x @ W) (E=8, H=64, I=16: experts stacked on disk)"
	if _, err = Detect(c2, ts); err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
}

// What a wrapper cannot be: each refused in one line naming why.
func TestWrapperRefusals(t *testing.T) {
	cfg, ts := wrapperFixture(t, "qwen3-5-moe")
	with := func(top map[string]any, text map[string]any) map[string]any {
		c := maps.Clone(cfg)
		tc := maps.Clone(cfg["text_config"].(map[string]any))
		maps.Copy(tc, text)
		c["text_config"] = tc
		for k, v := range top {
			if v == nil {
				delete(c, k)
			} else {
				c[k] = v
			}
		}
		return c
	}
	fp8 := map[string]any{"quant_method": "fp8", "weight_block_size": []any{128.0, 128.0}, "fmt": "e4m3", "activation_scheme": "dynamic"}
	cases := []struct {
		name string
		cfg  map[string]any
		want string
	}{
		{"unknown wrapper", with(map[string]any{"model_type": "llava_next"}, nil),
			`config.json: model_type "llava_next" is not supported; did you mean llama4_text? (` + "`moeprep --help`" + ` lists the 48 text model types, 19 wrappers and 7 wrappers' text models saved alone moeprep reads); configs with the language model under text_config are not supported except the multimodal wrappers`},
		{"no text config", with(map[string]any{"text_config": nil}, nil),
			`config.json: model_type "qwen3_5_moe" keeps its language model's config under text_config, which is missing`},
		{"text config not an object", with(map[string]any{"text_config": 3.0}, nil),
			"config.json: text_config: want an object, got 3"},
		{"other text model", with(nil, map[string]any{"model_type": "qwen3_moe"}),
			`config.json: text_config.model_type "qwen3_moe": a qwen3_5_moe wrapper holds qwen3_5_moe_text`},
		{"text size broken", with(nil, map[string]any{"hidden_size": "64"}),
			`config.json: text_config: hidden_size: want an integer, got "64"`},
		// The description applies to the text model wherever it stands;
		// these bf16 tensors do not match it.
		{"quantised at the top", with(map[string]any{"quantization_config": fp8}, nil),
			"layer 0: expert 0: model.language_model.layers.0.mlp.experts.0.gate_proj.weight is BF16 but config.json quantization_config says fp8"},
		{"quantised text config", with(nil, map[string]any{"quantization_config": fp8}),
			"model.language_model.layers.0.mlp.experts.0.gate_proj.weight is BF16 but config.json quantization_config says fp8"},
		{"two descriptions", with(map[string]any{"quantization_config": fp8}, map[string]any{"quantization_config": map[string]any{"quant_method": "fp8"}}),
			"config.json: quantization_config and text_config.quantization_config describe the quantisation differently; moeprep reads one description"},
		{"format not carried", with(nil, map[string]any{"quantization_config": map[string]any{"quant_method": "awq", "bits": 4.0}}),
			`config.json: text_config: quantization_config.quant_method: "awq" is not supported`},
		{"format not carried at the top", with(map[string]any{"quantization_config": map[string]any{"quant_method": "fp8", "weight_block_size": []any{64.0, 128.0}}}, nil),
			"config.json: quantization_config.weight_block_size: [64 128] is not supported (only square blocks [b, b]: DeepSeek's [128, 128], DeepSeek-V4.1's [32, 32])"},
		{"converted", with(map[string]any{"moeprep": map[string]any{"version": 1.0}}, nil), "already converted by moeprep"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Detect(tc.cfg, ts)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("got %v, want one line with %q", err, tc.want)
			}
			if tc.name == "converted" && !errors.Is(err, ErrAlreadyConverted) {
				t.Errorf("%v is not ErrAlreadyConverted", err)
			}
		})
	}
}

// A wrapper's ignore lists are resolved under its text layer prefix: a
// plain module name with the prefix leaves its group unquantised, the
// same name without it (which names nothing in a wrapper) does not.
func TestWrapperIgnorePrefix(t *testing.T) {
	cfg, _ := wrapperFixture(t, "qwen3-5-moe")
	for _, tc := range []struct {
		name      string
		attention bool // left unquantised
	}{
		{"model.language_model.layers.1.self_attn", true},
		{"re:model\\.language_model\\.layers\\.\\d+\\.self_attn.*", true},
		{"model.layers.1.self_attn", false},
	} {
		c := maps.Clone(cfg)
		c["quantization_config"] = map[string]any{"quant_method": "fp8", "weight_block_size": []any{128.0, 128.0},
			"modules_to_not_convert": []any{tc.name}}
		descs, err := DetectQuantOf(c, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := descs[0].Groups[quantdesc.GroupAttention] == ""; got != tc.attention || descs[0].Groups[quantdesc.GroupExperts] == "" {
			t.Errorf("%s: groups %v, want attention unquantised %v", tc.name, descs[0].Groups, tc.attention)
		}
	}
}

// Qwen3-VL-MoE's experts are stacked on disk: FP8 ones are not carried,
// and the refusal names the tensor.
func TestQwen3VLMoEFP8Refused(t *testing.T) {
	cfg, ts := wrapperFixture(t, "qwen3-vl-moe")
	cfg["quantization_config"] = map[string]any{"quant_method": "fp8", "weight_block_size": []any{128.0, 128.0}, "activation_scheme": "dynamic"}
	for l := 1; l <= 2; l++ {
		pre := "model.language_model.layers." + strconv.Itoa(l) + ".mlp.experts."
		ts.Add(pre+"gate_up_proj", safetensors.F8E4M3, 8, 64, 64)
		ts.Add(pre+"down_proj", safetensors.F8E4M3, 8, 64, 32)
	}
	_, err := Detect(cfg, ts)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "model.language_model.layers.1.mlp.experts.gate_up_proj") {
		t.Errorf("got %v, want one line naming the stacked FP8 experts", err)
	}
	t.Log(err)
}

// Kimi-K2.5's INT4 release, its description in text_config (as the hub
// has it), at the top level, or in both alike: the same INT4 plan, its
// BF16 shared expert stated apart.
func TestQuantisedKimiK25Placements(t *testing.T) {
	dir := quantwrap.Write(t, filepath.Join("..", "fixtures", "hf"), quantwrap.KimiK25Int4())
	cfg := testkit.ReadJSON(t, filepath.Join(dir, "config.json"))
	ts := viewTensors{readHeaders(t, dir)}
	desc := cfg["text_config"].(map[string]any)["quantization_config"]
	top := maps.Clone(cfg)
	top["quantization_config"] = desc
	text := maps.Clone(cfg["text_config"].(map[string]any))
	delete(text, "quantization_config")
	top["text_config"] = text
	both := maps.Clone(cfg)
	both["quantization_config"] = desc
	for name, c := range map[string]map[string]any{"text_config": cfg, "top level": top, "both": both} {
		p, err := Detect(c, ts)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if p.Quantization != QuantInt4Pack || p.GroupSize != 32 || p.SharedQuantization != QuantNone || p.Wrapper == nil ||
			p.Layers[0].Experts[0].Weight(layout.ProjGate) != "language_model.model.blocks.1.mlp.experts.0.gate_proj.weight_packed" {
			t.Errorf("%s: planned %s group %d shared %q, expert 0 %+v", name, p.Quantization, p.GroupSize, p.SharedQuantization, p.Layers[0].Experts[0])
		}
	}
}

// TestWrapperTextTypesSavedAlone: a bare config.json whose model_type is
// a wrapper's text model (transformers' *ForCausalLM saved alone) is
// planned by the family that plans it inside the wrapper, and every such
// type is listed by SupportedTextAlone.
func TestWrapperTextTypesSavedAlone(t *testing.T) {
	checked := map[string]bool{}
	for _, w := range wrappers {
		for _, mt := range w.textTypes {
			if slices.Contains(SupportedModelTypes(), mt) {
				continue
			}
			if _, ok := notSavedAlone[mt]; ok {
				// transformers has no class that saves it alone: refused, naming the wrapper
				if _, err := Lookup(mt); err == nil || !strings.Contains(err.Error(), "text model of the "+wrapperHolding(mt).modelType+" wrapper") || strings.Contains(err.Error(), "\n") {
					t.Errorf("%s: %v", mt, err)
				}
				continue
			}
			checked[mt] = true
			f, err := Lookup(mt)
			if err != nil || f.Name() != textFamily(mt).Name() || !slices.Contains(SupportedTextAlone(), mt) {
				t.Errorf("%s (in %s): %v, %v", mt, w.modelType, f, err)
			}
		}
	}
	if len(checked) < 7 || len(SupportedTextAlone()) != len(checked) {
		t.Errorf("%d wrapper-only text types checked, SupportedTextAlone lists %v", len(checked), SupportedTextAlone())
	}
}
