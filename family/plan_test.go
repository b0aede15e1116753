package family

import (
	"fmt"
	"github.com/moeprep/moeprep/layout"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/safetensors"
)

// The base checkpoints below shrink real hub config.json files
// (deepseek-ai/DeepSeek-V3, moonshotai/Kimi-K2-Instruct, deepseek-ai/DeepSeek-V2,
// Qwen/Qwen1.5-MoE-A2.7B, Qwen/Qwen3-30B-A3B, mistralai/Mixtral-8x7B-v0.1),
// keeping their keys and value types.

func deepseekV3Gen() gen {
	return gen{
		cfg: map[string]any{
			"architectures": []any{"DeepseekV3ForCausalLM"}, "model_type": "deepseek_v3",
			"hidden_size": 32, "intermediate_size": 96, "moe_intermediate_size": 16,
			"n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
			"n_group": 2, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
			"norm_topk_prob": true, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
			"moe_layer_freq": 1, "num_hidden_layers": 4, "num_nextn_predict_layers": 1,
			"ep_size": 1, "aux_loss_alpha": 0.001, "seq_aux": true, "q_lora_rank": nil,
			"torch_dtype": "bfloat16",
		},
		layers: 4, moe: []int{1, 2, 3, 4}, mtp: []int{4},
		h: 32, i: 16, e: 8, sharedI: 16, bias: true, dtype: safetensors.BF16,
	}
}

func deepseekV3FP8Gen() gen {
	g := deepseekV3Gen()
	g.cfg["hidden_size"], g.cfg["moe_intermediate_size"] = 300, 136
	g.cfg["n_routed_experts"], g.cfg["num_hidden_layers"] = 4, 2
	g.cfg["quantization_config"] = map[string]any{
		"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
		"weight_block_size": []any{128, 128}, "scale_fmt": "ue8m0",
	}
	g.layers, g.moe, g.mtp = 2, []int{1, 2}, []int{2}
	g.h, g.i, g.e, g.sharedI, g.fp8 = 300, 136, 4, 136, true
	return g
}

func kimiK2Gen() gen {
	return gen{
		cfg: map[string]any{
			"architectures": []any{"DeepseekV3ForCausalLM"}, "model_type": "kimi_k2",
			"hidden_size": 16, "moe_intermediate_size": 8, "n_routed_experts": 384,
			"n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
			"topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
			"routed_scaling_factor": 2.827, "first_k_dense_replace": 1, "moe_layer_freq": 1,
			"num_hidden_layers": 3, "num_nextn_predict_layers": 0,
		},
		layers: 3, moe: []int{1, 2}, h: 16, i: 8, e: 384, sharedI: 8, bias: true, dtype: safetensors.BF16,
	}
}

func deepseekV2Gen() gen {
	return gen{
		cfg: map[string]any{
			"architectures": []any{"DeepseekV2ForCausalLM"}, "model_type": "deepseek_v2",
			"hidden_size": 32, "moe_intermediate_size": 16, "n_routed_experts": 8,
			"n_shared_experts": 2, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
			"topk_method": "group_limited_greedy", "scoring_func": "softmax", "norm_topk_prob": false,
			"routed_scaling_factor": 16.0, "first_k_dense_replace": 1, "moe_layer_freq": 2,
			"num_hidden_layers": 6,
		},
		layers: 6, moe: []int{2, 4}, h: 32, i: 16, e: 8, sharedI: 32, dtype: safetensors.BF16,
	}
}

func qwen2MoEGen() gen {
	return gen{
		cfg: map[string]any{
			"architectures": []any{"Qwen2MoeForCausalLM"}, "model_type": "qwen2_moe",
			"hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
			"shared_expert_intermediate_size": 64, "num_experts": 6, "num_experts_per_tok": 4,
			"decoder_sparse_step": 2, "mlp_only_layers": []any{3}, "norm_topk_prob": false,
			"num_hidden_layers": 6,
		},
		layers: 6, moe: []int{1, 5}, h: 32, i: 16, e: 6, sharedI: 64, dtype: safetensors.BF16,
	}
}

func qwen3MoEGen() gen {
	return gen{
		cfg: map[string]any{
			"architectures": []any{"Qwen3MoeForCausalLM"}, "model_type": "qwen3_moe",
			"hidden_size": 32, "moe_intermediate_size": 24, "num_local_experts": 16,
			"num_experts_per_tok": 4, "norm_topk_prob": true, "decoder_sparse_step": 1,
			"mlp_only_layers": []any{0}, "num_hidden_layers": 3,
		},
		layers: 3, moe: []int{1, 2}, h: 32, i: 24, e: 16, dtype: safetensors.BF16,
	}
}

func mixtralGen() gen {
	return gen{
		cfg: map[string]any{
			"architectures": []any{"MixtralForCausalLM"}, "model_type": "mixtral",
			"hidden_size": 32, "intermediate_size": 48, "num_local_experts": 4,
			"num_experts_per_tok": 2, "num_hidden_layers": 2, "router_aux_loss_coef": 0.02,
		},
		layers: 2, moe: []int{0, 1}, h: 32, i: 48, e: 4, dtype: safetensors.F16,
	}
}

// with applies config changes (a nil value deletes the key) to a copy of g.
func (g gen) with(changes map[string]any) gen {
	g = g.clone()
	for k, v := range changes {
		if v == nil {
			delete(g.cfg, k)
		} else {
			g.cfg[k] = v
		}
	}
	return g
}

func TestPlanFamilies(t *testing.T) {
	v3 := Plan{Family: "deepseek", ModelType: "deepseek_v3", HiddenSize: 32, MoEIntermediateSize: 16,
		NumExperts: 8, NumSharedExperts: 1, SharedIntermediateSize: 16, TopK: 2, TopKMethod: moe.TopKNoAuxTC,
		NGroup: 2, TopKGroup: 1, Scoring: moe.Sigmoid, NormTopKProb: true, RoutedScalingFactor: 2.5,
		NumHiddenLayers: 4, WeightDType: safetensors.BF16, Quantization: QuantNone}
	v3fp8 := v3
	v3fp8.HiddenSize, v3fp8.MoEIntermediateSize, v3fp8.SharedIntermediateSize = 300, 136, 136
	v3fp8.NumExperts, v3fp8.NumHiddenLayers = 4, 2
	v3fp8.WeightDType, v3fp8.Quantization, v3fp8.ScaleFmt = safetensors.F8E4M3, QuantFP8Block, "ue8m0"
	v2 := Plan{Family: "deepseek", ModelType: "deepseek_v2", HiddenSize: 32, MoEIntermediateSize: 16,
		NumExperts: 8, NumSharedExperts: 2, SharedIntermediateSize: 32, TopK: 2, TopKMethod: moe.TopKGroupLimited,
		NGroup: 2, TopKGroup: 1, Scoring: moe.Softmax, RoutedScalingFactor: 16, NumHiddenLayers: 6,
		WeightDType: safetensors.BF16, Quantization: QuantNone}
	v2lite := v2
	v2lite.TopKMethod, v2lite.NGroup, v2lite.RoutedScalingFactor = moe.TopKGreedy, 1, 1
	v3def := v3
	v3def.NumExperts, v3def.NGroup, v3def.TopKGroup, v3def.NumHiddenLayers = 16, 8, 4, 5
	qwen3 := Plan{Family: "qwen3_moe", ModelType: "qwen3_moe", HiddenSize: 32, MoEIntermediateSize: 24,
		NumExperts: 16, TopK: 4, TopKMethod: moe.TopKGreedy, NGroup: 1, TopKGroup: 1, Scoring: moe.Softmax,
		NormTopKProb: true, RoutedScalingFactor: 1, NumHiddenLayers: 3, WeightDType: safetensors.BF16,
		Quantization: QuantNone}
	qwen3fp8 := qwen3
	qwen3fp8.HiddenSize, qwen3fp8.MoEIntermediateSize = 256, 96
	qwen3fp8.WeightDType, qwen3fp8.Quantization = safetensors.F8E4M3, QuantFP8Block
	mixtral := Plan{Family: "mixtral", ModelType: "mixtral", HiddenSize: 32, MoEIntermediateSize: 48,
		NumExperts: 4, TopK: 2, TopKMethod: moe.TopKGreedy, NGroup: 1, TopKGroup: 1, Scoring: moe.Softmax,
		NormTopKProb: true, RoutedScalingFactor: 1, NumHiddenLayers: 2, WeightDType: safetensors.F16,
		Quantization: QuantNone}

	cases := []struct {
		name   string
		g      gen
		want   Plan
		layers []int
		spot   func(p *Plan) [][2]string // {got, want} literal names
	}{
		{"deepseek_v3 bf16 with MTP layer", deepseekV3Gen(), v3, []int{1, 2, 3, 4},
			func(p *Plan) [][2]string {
				return [][2]string{
					{p.Layers[0].Experts[7].Weight(layout.ProjUp), "model.layers.1.mlp.experts.7.up_proj.weight"},
					{p.Layers[3].Shared.Weight(layout.ProjDown), "model.layers.4.mlp.shared_experts.down_proj.weight"},
					{p.Layers[3].RouterBias, "model.layers.4.mlp.gate.e_score_correction_bias"},
					{fmt.Sprint(p.Layers[3].MTP), "true"},
					{fmt.Sprint(p.Layers[2].MTP), "false"},
					{fmt.Sprint(p.Layers[1].Prefix), "model.layers.2.mlp"},
				}
			}},
		{"deepseek_v3 json.Number config", func() gen { g := deepseekV3Gen(); g.useNum = true; return g }(), v3, []int{1, 2, 3, 4}, nil},
		{"deepseek_v3 fp8 ue8m0, H and I not multiples of 128", deepseekV3FP8Gen(), v3fp8, []int{1, 2},
			func(p *Plan) [][2]string {
				return [][2]string{
					{p.Layers[0].Experts[3].Get(layout.ProjDown, layout.RoleScale), "model.layers.1.mlp.experts.3.down_proj.weight_scale_inv"},
					{p.Layers[1].Shared.Get(layout.ProjGate, layout.RoleScale), "model.layers.2.mlp.shared_experts.gate_proj.weight_scale_inv"},
				}
			}},
		{"deepseek_v3 defaults from DeepseekV3Config",
			func() gen {
				g := deepseekV3Gen().with(map[string]any{"n_group": nil, "topk_group": nil, "topk_method": nil,
					"scoring_func": nil, "norm_topk_prob": nil, "routed_scaling_factor": nil,
					"first_k_dense_replace": nil, "moe_layer_freq": nil, "n_shared_experts": nil,
					"num_nextn_predict_layers": nil, "n_routed_experts": 16, "num_hidden_layers": 5})
				g.layers, g.moe, g.mtp, g.e = 5, []int{3, 4}, nil, 16
				return g
			}(), v3def, []int{3, 4}, nil},
		{"kimi_k2 384 experts, n_group 1", kimiK2Gen(),
			Plan{Family: "deepseek", ModelType: "kimi_k2", HiddenSize: 16, MoEIntermediateSize: 8,
				NumExperts: 384, NumSharedExperts: 1, SharedIntermediateSize: 8, TopK: 8, TopKMethod: moe.TopKNoAuxTC,
				NGroup: 1, TopKGroup: 1, Scoring: moe.Sigmoid, NormTopKProb: true, RoutedScalingFactor: 2.827,
				NumHiddenLayers: 3, WeightDType: safetensors.BF16, Quantization: QuantNone},
			[]int{1, 2},
			func(p *Plan) [][2]string {
				return [][2]string{
					{p.Layers[1].Experts[383].Weight(layout.ProjGate), "model.layers.2.mlp.experts.383.gate_proj.weight"},
				}
			}},
		{"deepseek_v2 S=2 group_limited_greedy moe_layer_freq 2", deepseekV2Gen(), v2, []int{2, 4},
			func(p *Plan) [][2]string {
				return [][2]string{
					{p.Layers[1].Shared.Weight(layout.ProjUp), "model.layers.4.mlp.shared_experts.up_proj.weight"},
					{p.Layers[0].RouterBias, ""},
				}
			}},
		{"deepseek_v2-lite greedy with nulls and defaults",
			func() gen {
				g := deepseekV2Gen().with(map[string]any{"n_group": nil, "topk_group": nil, "topk_method": "gready",
					"scoring_func": nil, "norm_topk_prob": nil, "routed_scaling_factor": nil,
					"first_k_dense_replace": nil, "moe_layer_freq": nil})
				g.cfg["n_group"] = nil // JSON null, as DeepSeek-V2's code writes "unset"
				g.moe = []int{0, 1, 2, 3, 4, 5}
				return g
			}(), v2lite, []int{0, 1, 2, 3, 4, 5}, nil},
		{"qwen2_moe gated shared expert, decoder_sparse_step 2, mlp_only_layers", qwen2MoEGen(),
			Plan{Family: "qwen2_moe", ModelType: "qwen2_moe", HiddenSize: 32, MoEIntermediateSize: 16,
				NumExperts: 6, NumSharedExperts: 1, SharedIntermediateSize: 64, SharedGated: true, TopK: 4,
				TopKMethod: moe.TopKGreedy, NGroup: 1, TopKGroup: 1, Scoring: moe.Softmax, RoutedScalingFactor: 1,
				NumHiddenLayers: 6, WeightDType: safetensors.BF16, Quantization: QuantNone},
			[]int{1, 5},
			func(p *Plan) [][2]string {
				return [][2]string{
					{p.Layers[1].SharedGate, "model.layers.5.mlp.shared_expert_gate.weight"},
					{p.Layers[0].Shared.Weight(layout.ProjGate), "model.layers.1.mlp.shared_expert.gate_proj.weight"},
				}
			}},
		{"qwen3_moe num_local_experts (transformers 5)", qwen3MoEGen(), qwen3, []int{1, 2}, nil},
		{"qwen3_moe num_experts and num_local_experts agree",
			qwen3MoEGen().with(map[string]any{"num_experts": 16}), qwen3, []int{1, 2}, nil},
		{"qwen3_moe fp8 (Qwen3 FP8 release format)",
			func() gen {
				g := qwen3MoEGen().with(map[string]any{"hidden_size": 256, "moe_intermediate_size": 96,
					"quantization_config": map[string]any{"quant_method": "fp8", "activation_scheme": "dynamic",
						"fmt": "e4m3", "weight_block_size": []any{128, 128}}})
				g.h, g.i, g.fp8 = 256, 96, true
				return g
			}(), qwen3fp8, []int{1, 2}, nil},
		{"mixtral f16", mixtralGen(), mixtral, []int{0, 1},
			func(p *Plan) [][2]string {
				return [][2]string{
					{p.Layers[1].Experts[2].Weight(layout.ProjUp), "model.layers.1.block_sparse_moe.experts.2.w3.weight"},
					{p.Layers[1].Experts[2].Weight(layout.ProjDown), "model.layers.1.block_sparse_moe.experts.2.w2.weight"},
				}
			}},
		{"mixtral saved under mlp", func() gen { g := mixtralGen(); g.module = "mlp"; return g }(), mixtral, []int{0, 1},
			func(p *Plan) [][2]string {
				return [][2]string{
					{p.Layers[0].Router, "model.layers.0.mlp.gate.weight"},
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, tensors := tc.g.build(t)
			p, err := Detect(cfg, tensors)
			if err != nil {
				t.Fatalf("Detect: %v", err)
			}
			var idx []int
			for _, l := range p.Layers {
				idx = append(idx, l.Index)
			}
			if !reflect.DeepEqual(idx, tc.layers) {
				t.Fatalf("MoE layers %v, want %v", idx, tc.layers)
			}
			want := tc.want
			want.Layers = tc.g.wantLayers()
			comparePlans(t, p, &want)
			if tc.spot != nil {
				for _, pair := range tc.spot(p) {
					if got, w := pair[0], pair[1]; got != w {
						t.Errorf("got %q, want %q", got, w)
					}
				}
			}
		})
	}
}

// comparePlans reports the differing fields, not just "not equal".
func comparePlans(t *testing.T, got, want *Plan) {
	t.Helper()
	gv, wv := reflect.ValueOf(*got), reflect.ValueOf(*want)
	for i := 0; i < gv.NumField(); i++ {
		name := gv.Type().Field(i).Name
		if name == "Layers" {
			continue
		}
		if !reflect.DeepEqual(gv.Field(i).Interface(), wv.Field(i).Interface()) {
			t.Errorf("%s = %v, want %v", name, gv.Field(i).Interface(), wv.Field(i).Interface())
		}
	}
	if len(got.Layers) != len(want.Layers) {
		t.Fatalf("%d layers, want %d", len(got.Layers), len(want.Layers))
	}
	for i := range got.Layers {
		if !reflect.DeepEqual(got.Layers[i], want.Layers[i]) {
			t.Errorf("layer %d:\n got %+v\nwant %+v", want.Layers[i].Index, got.Layers[i], want.Layers[i])
		}
	}
}

func TestRegistry(t *testing.T) {
	var names []string
	for _, f := range All() {
		names = append(names, f.Name())
		for _, mt := range f.ModelTypes() {
			got, err := Lookup(mt)
			if err != nil || got.Name() != f.Name() {
				t.Errorf("Lookup(%q) = %v, %v; want family %s", mt, got, err, f.Name())
			}
		}
	}
	if want := []string{"deepseek", "qwen2_moe", "qwen3_moe", "mixtral", "glm4_moe_lite", "exaone_moe", "hy_v3", "afmoe", "minimax_m2", "ernie4_5_moe", "olmoe", "jamba", "cohere2_moe", "granitemoe", "granitemoe_swa", "phimoe", "llama4", "gpt_oss", "deepseek_v4", "inkling_text", "dots1", "hunyuan_v1_moe", "flex_olmo", "lfm2_moe", "dbrx", "solar_open", "mimo_v2_flash", "mellum", "granitemoehybrid", "axk1", "axk2", "deepseek_v32", "glm_moe_dsa", "mistral4", "kimi_linear", "laguna", "hy_v4", "step3p5", "gemma4", "longcat_flash", "nemotron_h"}; !reflect.DeepEqual(names, want) {
		t.Errorf("All() = %v, want %v", names, want)
	}
	want := strings.Split("afmoe, axk1, axk2, cohere2_moe, dbrx, deepseek_v2, deepseek_v3, deepseek_v32, deepseek_v4, diffusion_gemma_text, dots1, ernie4_5_moe, exaone_moe, flex_olmo, gemma4_text, glm4_moe, glm4_moe_lite, glm_moe_dsa, gpt_oss, granitemoe, granitemoe_swa, granitemoehybrid, granitemoeshared, hunyuan_v1_moe, hy_v3, hy_v4, inkling_text, jamba, kimi_k2, kimi_linear, laguna, lfm2_moe, llama4_text, longcat_flash, mellum, mimo_v2_flash, minimax, minimax_m2, mistral4, mixtral, nemotron_h, olmoe, phimoe, qwen2_moe, qwen3_moe, qwen3_next, solar_open, step3p5", ", ")
	if got := SupportedModelTypes(); !reflect.DeepEqual(got, want) {
		t.Errorf("SupportedModelTypes() = %v, want %v", got, want)
	}
	f, _ := Lookup("deepseek_v3")
	f.ModelTypes()[0] = "changed"
	if f.ModelTypes()[0] != "deepseek_v2" {
		t.Error("ModelTypes exposes the family's own slice")
	}
	if _, err := Lookup("llama"); err == nil || err.Error() != "config.json: model_type \"llama\" is not supported; did you mean llama4 or llama4_text? (`moeprep --help` lists the 48 text model types, 19 wrappers and 7 wrappers' text models saved alone moeprep reads)" {
		t.Errorf("Lookup(llama) error = %v", err)
	}
}

// A family's own Plan refuses model types it does not handle.
func TestFamilyPlanWrongModelType(t *testing.T) {
	cfg, tensors := mixtralGen().build(t)
	f, _ := Lookup("qwen3_moe")
	_, err := f.Plan(cfg, tensors)
	if err == nil || err.Error() != `config.json: model_type "mixtral" is not handled by family qwen3_moe (it handles qwen3_moe)` {
		t.Errorf("err = %v", err)
	}
}

// CanonicalScaleShape accepts exactly the squeezed forms of a weight's
// 128x128 block grid (the same row-major bytes) and nothing else.
func TestCanonicalScaleShape(t *testing.T) {
	for _, c := range []struct {
		weight, shape, want []int64
		ok                  bool
	}{
		{[]int64{128, 256}, []int64{2}, []int64{1, 2}, true},          // transformers 5's per-expert save
		{[]int64{256, 128}, []int64{2}, []int64{2, 1}, true},          // down_proj
		{[]int64{100, 100}, []int64{}, []int64{1, 1}, true},           // one block, stored as a scalar
		{[]int64{100, 100}, []int64{1}, []int64{1, 1}, true},          //
		{[]int64{256, 7168}, []int64{1, 2, 56}, []int64{2, 56}, true}, // a leading 1 added
		{[]int64{128, 256}, []int64{1, 2}, nil, false},                // already canonical
		{[]int64{256, 384}, []int64{3, 2}, nil, false},                // transposed grid: not the same bytes
		{[]int64{256, 384}, []int64{6}, nil, false},                   // flattened 2-D grid: refused
		{[]int64{128, 256}, []int64{3}, nil, false},                   // wrong count
		{[]int64{128}, []int64{1}, nil, false},                        // not a matrix
	} {
		got, ok := CanonicalScaleShape(c.weight, c.shape)
		if ok != c.ok || !slices.Equal(got, c.want) {
			t.Errorf("CanonicalScaleShape(%v, %v) = %v, %v; want %v, %v", c.weight, c.shape, got, ok, c.want, c.ok)
		}
	}
}

// TestUnsupportedFamiliesNameTheirReason: the MoE model types transformers
// ships that moeprep refuses say why, in one line.
func TestUnsupportedFamiliesNameTheirReason(t *testing.T) {
	for mt, want := range map[string]string{"jetmoe": "attention heads"} {
		_, err := Lookup(mt)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), mt) {
			t.Errorf("%s: %v", mt, err)
		}
	}
}

// A dense model's config (no key names experts) is told so, not listed
// the 48 model types moeprep reads.
func TestDenseModelRefusal(t *testing.T) {
	for _, cfg := range []map[string]any{
		{"model_type": "llama", "hidden_size": 4096.0, "num_hidden_layers": 32.0, "intermediate_size": 11008.0},
		{"model_type": "qwen2", "hidden_size": 64.0},
	} {
		_, err := Detect(cfg, &MemTensors{})
		want := fmt.Sprintf("config.json: model_type %q is a dense model (its config names no experts): it has no MoE layers for moeprep to prepare; serve it as it is", cfg["model_type"])
		if err == nil || err.Error() != want {
			t.Errorf("%v: got %v, want %s", cfg["model_type"], err, want)
		}
	}
}
