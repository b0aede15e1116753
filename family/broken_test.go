package family

import (
	"errors"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// qwenBig is a Qwen3-MoE with 32 experts and 6 layers, the shape of the
// error examples in the foundation issue (H=32, I=64).
func qwenBig() gen {
	g := qwen3MoEGen().with(map[string]any{"num_local_experts": 32, "moe_intermediate_size": 64,
		"num_hidden_layers": 6, "mlp_only_layers": []any{}})
	g.layers, g.moe, g.e, g.i = 6, []int{0, 1, 2, 3, 4, 5}, 32, 64
	return g
}

func TestPlanRefusesBrokenCheckpoints(t *testing.T) {
	bf, f16, f32 := safetensors.BF16, safetensors.F16, safetensors.F32
	cases := []struct {
		name   string
		g      gen
		mutate func(t *testing.T, f *MemTensors)
		want   string // substring of the error; exact when it starts with "="
	}{
		// Experts and projections.
		{"missing projection", qwenBig(), func(t *testing.T, f *MemTensors) {
			del(t, f, "model.layers.3.mlp.experts.17.up_proj.weight")
		}, "=layer 3: expert 17: missing tensor model.layers.3.mlp.experts.17.up_proj.weight"},
		{"missing expert", deepseekV3Gen(), func(t *testing.T, f *MemTensors) {
			for _, p := range []string{"gate_proj", "up_proj", "down_proj"} {
				del(t, f, "model.layers.2.mlp.experts.5."+p+".weight")
			}
		}, "=layer 2: expert 5: missing tensor model.layers.2.mlp.experts.5.gate_proj.weight"},
		{"down_proj transposed", qwenBig(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.5.mlp.experts.2.down_proj.weight", bf, 64, 32)
		}, "=layer 5: expert 2: down_proj shape [64,32], expected [32,64] (H=32, I=64)"},
		{"one expert with other intermediate size", mixtralGen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.1.block_sparse_moe.experts.3.w1.weight", f16, 40, 32)
		}, "=layer 1: expert 3: w1 shape [40,32], expected [48,32] (H=32, I=48)"},
		{"mixed dtype", deepseekV3Gen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.2.mlp.experts.1.up_proj.weight", f16, 16, 32)
		}, "=layer 2: expert 1: up_proj dtype F16, expected BF16 like model.layers.1.mlp.experts.0.gate_proj.weight"},
		{"shared expert dtype differs from experts", deepseekV3Gen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.1.mlp.shared_experts.gate_proj.weight", f32, 16, 32)
		}, "layer 1: shared expert: gate_proj dtype F32, expected BF16"},
		{"unsupported weight dtype", mixtralGen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.0.block_sparse_moe.experts.0.w1.weight", safetensors.I8, 48, 32)
		}, "layer 0: expert 0: model.layers.0.block_sparse_moe.experts.0.w1.weight dtype I8 is not supported"},
		{"expert index beyond num_experts", deepseekV3Gen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.3.mlp.experts.300.up_proj.weight", bf, 16, 32)
		}, "=layer 3: expert 300: tensor model.layers.3.mlp.experts.300.up_proj.weight is beyond num_experts=8"},
		{"unexpected tensor in an expert", mixtralGen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.0.block_sparse_moe.experts.1.w1.bias", f16, 48)
		}, "=layer 0: expert 1: unexpected tensor model.layers.0.block_sparse_moe.experts.1.w1.bias"},
		{"expert id with leading zero", mixtralGen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.0.block_sparse_moe.experts.01.w1.weight", f16, 48, 32)
		}, "already converted: tensor model.layers.0.block_sparse_moe.experts.01.w1.weight holds stacked experts"},

		// Routers, biases, shared experts.
		{"missing router", qwenBig(), func(t *testing.T, f *MemTensors) {
			del(t, f, "model.layers.4.mlp.gate.weight")
		}, "=layer 4: router: missing tensor model.layers.4.mlp.gate.weight (E=32, H=32)"},
		{"router shape", mixtralGen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.1.block_sparse_moe.gate.weight", bf, 8, 32)
		}, "layer 1: router model.layers.1.block_sparse_moe.gate.weight shape [8,32], expected [4,32]"},
		{"router quantised", deepseekV3Gen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.1.mlp.gate.weight", safetensors.F8E4M3, 8, 32)
		}, "dtype F8_E4M3, expected BF16, F16 or F32"},
		{"missing correction bias on deepseek_v3", deepseekV3Gen(), func(t *testing.T, f *MemTensors) {
			del(t, f, "model.layers.4.mlp.gate.e_score_correction_bias")
		}, "=layer 4 (MTP): router bias: missing tensor model.layers.4.mlp.gate.e_score_correction_bias (E=8; sigmoid routing needs e_score_correction_bias)"},
		{"bias shape", kimiK2Gen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.1.mlp.gate.e_score_correction_bias", f32, 1, 384)
		}, "layer 1: router bias model.layers.1.mlp.gate.e_score_correction_bias shape [1,384], expected [384]"},
		{"missing shared projection", deepseekV3Gen(), func(t *testing.T, f *MemTensors) {
			del(t, f, "model.layers.3.mlp.shared_experts.down_proj.weight")
		}, "=layer 3: shared expert: missing tensor model.layers.3.mlp.shared_experts.down_proj.weight"},
		{"shared expert of S=1 size where S=2", deepseekV2Gen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.2.mlp.shared_experts.gate_proj.weight", bf, 16, 32)
		}, "=layer 2: shared expert: gate_proj shape [16,32], expected [32,32] (H=32, shared I=32)"},
		{"missing qwen2 shared expert gate", qwen2MoEGen(), func(t *testing.T, f *MemTensors) {
			del(t, f, "model.layers.5.mlp.shared_expert_gate.weight")
		}, "=layer 5: shared expert gate: missing tensor model.layers.5.mlp.shared_expert_gate.weight (H=32)"},
		{"qwen2 shared expert gate shape", qwen2MoEGen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.1.mlp.shared_expert_gate.weight", bf, 32)
		}, "shape [32], expected [1,32]"},
		{"shared tensors but no n_shared_experts",
			deepseekV2Gen().with(map[string]any{"n_shared_experts": nil}), nil,
			"=layer 2: holds shared expert tensors under model.layers.2.mlp.shared_experts but config.json gives no shared experts"},

		// FP8.
		{"missing scale", deepseekV3FP8Gen(), func(t *testing.T, f *MemTensors) {
			del(t, f, "model.layers.1.mlp.experts.2.down_proj.weight_scale_inv")
		}, "=layer 1: expert 2: missing tensor model.layers.1.mlp.experts.2.down_proj.weight_scale_inv (FP8 weights need their block scales)"},
		{"scale shape transposed", deepseekV3FP8Gen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv", f32, 3, 2)
		}, "=layer 1: expert 0: model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv shape [3,2], expected [2,3] (128x128 blocks of gate_proj weight [136,300])"},
		{"scale in bf16", deepseekV3FP8Gen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.2.mlp.shared_experts.up_proj.weight_scale_inv", bf, 2, 3)
		}, "layer 2 (MTP): shared expert: model.layers.2.mlp.shared_experts.up_proj.weight_scale_inv dtype BF16, expected F32"},
		{"scale without fp8", mixtralGen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.1.block_sparse_moe.experts.0.w2.weight_scale_inv", f32, 1, 1)
		}, "=layer 1: expert 0: block scale model.layers.1.block_sparse_moe.experts.0.w2.weight_scale_inv present but model.layers.1.block_sparse_moe.experts.0.w2.weight is F16, not F8_E4M3"},
		{"fp8 without quantization_config",
			deepseekV3FP8Gen().with(map[string]any{"quantization_config": nil}), nil,
			"=layer 1: expert 0: model.layers.1.mlp.experts.0.gate_proj.weight is F8_E4M3 but config.json has no fp8 quantization_config"},
		{"quantization_config fp8 but bf16 weights",
			deepseekV3Gen().with(map[string]any{"quantization_config": map[string]any{
				"quant_method": "fp8", "weight_block_size": []any{128, 128}}}), nil,
			"=layer 1: expert 0: model.layers.1.mlp.experts.0.gate_proj.weight is BF16 but config.json quantization_config says fp8"},
		{"gptq", mixtralGen().with(map[string]any{"quantization_config": map[string]any{"quant_method": "gptq", "bits": 4}}), nil,
			`=config.json: quantization_config.quant_method: "gptq" is not supported (only fp8 with 128x128 block scales)`},
		{"awq", qwen3MoEGen().with(map[string]any{"quantization_config": map[string]any{"quant_method": "awq"}}), nil,
			`quant_method: "awq" is not supported`},
		{"compressed-tensors", deepseekV3Gen().with(map[string]any{"quantization_config": map[string]any{"quant_method": "compressed-tensors"}}), nil,
			"=config.json: quantization_config: compressed-tensors (no config_groups) on the routed experts, shared expert, attention, dense MLP (unquantised: router): not carried yet; moeprep reads bf16/f16/f32, FP8 (128x128 blocks, per-channel, per-tensor), compressed-tensors INT4 pack-quantized, MXFP4 (gpt-oss, compressed-tensors, DeepSeek-V4), ModelOpt NVFP4 and compressed-tensors NVFP4, MXFP8 (ModelOpt, quant_method mxfp8) experts"},
		{"fp8 block 64x128", deepseekV3FP8Gen().with(map[string]any{"quantization_config": map[string]any{
			"quant_method": "fp8", "weight_block_size": []any{64, 128}}}), nil,
			"=config.json: quantization_config.weight_block_size: [64 128] is not supported (only square blocks [b, b]: DeepSeek's [128, 128], DeepSeek-V4.1's [32, 32])"},
		{"fp8 block 64: the scales are 128x128", deepseekV3FP8Gen().with(map[string]any{"quantization_config": map[string]any{
			"quant_method": "fp8", "weight_block_size": []any{64, 64}}}), nil,
			"weight_scale_inv shape [2,3], expected [3,5] (64x64 blocks of gate_proj weight [136,300])"},
		{"fp8 per-tensor (no block size)", deepseekV3FP8Gen().with(map[string]any{"quantization_config": map[string]any{
			"quant_method": "fp8"}}), nil,
			"=layer 1: expert 0: missing tensor model.layers.1.mlp.experts.0.gate_proj.weight_scale (FP8 per-tensor weights need their scales)"},
		{"fp8 per-tensor, static activations (Hy3)", deepseekV3FP8Gen().with(map[string]any{"quantization_config": map[string]any{
			"quant_method": "fp8", "activation_scheme": "static"}}), nil,
			`activation_scheme: "static" is not supported (only dynamic: static activation scales, input_scale, are not carried)`},
		{"fp8 static activations", deepseekV3FP8Gen().with(map[string]any{"quantization_config": map[string]any{
			"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": []any{128, 128}}}), nil,
			`activation_scheme: "static" is not supported`},

		// Layers.
		{"dense layer holding experts",
			deepseekV3Gen().with(map[string]any{"first_k_dense_replace": 2}), nil,
			"=layer 1: dense by config.json but holds MoE tensor model.layers.1.mlp.gate.weight"},
		{"mlp_only layer holding experts",
			qwen3MoEGen().with(map[string]any{"mlp_only_layers": []any{0, 2}}), nil,
			"=layer 2: dense by config.json but holds MoE tensor model.layers.2.mlp.gate.weight"},
		{"experts past num_hidden_layers in qwen",
			func() gen { g := qwen3MoEGen(); g.moe = append(g.moe, 3); return g }(), nil,
			"=layer 3: beyond num_hidden_layers=3 but holds MoE tensor model.layers.3.mlp.gate.weight"},
		{"more MTP layers than num_nextn_predict_layers",
			func() gen { g := deepseekV3Gen(); g.moe = append(g.moe, 5); g.mtp = append(g.mtp, 5); return g }(), nil,
			"=layer 5 (MTP): holds MoE tensor model.layers.5.mlp.gate.weight but config.json num_nextn_predict_layers=1"},
		{"MTP experts on kimi with num_nextn_predict_layers 0",
			func() gen { g := kimiK2Gen(); g.moe = append(g.moe, 3); g.mtp = []int{3}; return g }(), nil,
			"num_nextn_predict_layers=0"},
		{"no MoE layers", deepseekV3Gen().with(map[string]any{"first_k_dense_replace": 4}), nil,
			"=config.json: none of the 4 layers is a MoE layer"},
		{"missing MoE layer entirely", qwenBig().with(map[string]any{"num_hidden_layers": 7}), nil,
			"=config.json: num_hidden_layers=7, but the checkpoint holds no tensor of layer 6 (none named model.layers.6.*): truncated, or the config.json of another model"},
		{"missing MoE layer in the middle", qwenBig(), func(t *testing.T, f *MemTensors) {
			for _, n := range f.Names() {
				if strings.HasPrefix(n, "model.layers.4.") {
					del(t, f, n)
				}
			}
		}, "=layer 4: router: missing tensor model.layers.4.mlp.gate.weight (E=32, H=32)"},

		// Already converted.
		{"moeprep section", deepseekV3Gen().with(map[string]any{"moeprep": map[string]any{"version": "0.1"}}), nil,
			"=already converted by moeprep (config.json has a moeprep section); use the original checkpoint"},
		{"stacked experts", deepseekV3Gen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.1.mlp.experts.all_gate.weight", bf, 8, 16, 32)
		}, "=already converted: tensor model.layers.1.mlp.experts.all_gate.weight holds stacked experts (moeprep or another converter's layout); use the original per-expert checkpoint"},
		{"transformers fused experts", qwen3MoEGen(), func(t *testing.T, f *MemTensors) {
			f.Add("model.layers.2.mlp.experts.gate_up_proj", bf, 16, 48, 32)
		}, "already converted: tensor model.layers.2.mlp.experts.gate_up_proj holds stacked experts"},

		// config.json values.
		{"unknown model_type", mixtralGen().with(map[string]any{"model_type": "llama"}), nil,
			"=config.json: model_type \"llama\" is not supported; did you mean llama4 or llama4_text? (`moeprep --help` lists the 48 text model types, 19 wrappers and 7 wrappers' text models saved alone moeprep reads)"},
		{"multimodal text_config", mixtralGen().with(map[string]any{"model_type": "kimi_vl", "text_config": map[string]any{"model_type": "deepseek_v3"}}), nil,
			"configs with the language model under text_config are not supported"},
		{"missing model_type", mixtralGen().with(map[string]any{"model_type": nil}), nil,
			"=config.json: model_type is missing"},
		{"model_type not a string", mixtralGen().with(map[string]any{"model_type": 3}), nil,
			"=config.json: model_type: want a string, got 3"},
		{"num_experts vs num_local_experts", qwen3MoEGen().with(map[string]any{"num_experts": 8}), nil,
			"=config.json: num_experts=8 and num_local_experts=16 disagree"},
		{"no expert count", mixtralGen().with(map[string]any{"num_local_experts": nil}), nil,
			"=config.json: routed expert count is missing (want one of [num_local_experts num_experts])"},
		{"hidden_size as string", mixtralGen().with(map[string]any{"hidden_size": "32"}), nil,
			`=config.json: hidden_size: want an integer, got "32"`},
		{"fractional top-k", qwen2MoEGen().with(map[string]any{"num_experts_per_tok": 2.5}), nil,
			"=config.json: num_experts_per_tok: want an integer, got 2.5"},
		{"negative size", qwen2MoEGen().with(map[string]any{"moe_intermediate_size": -16}), nil,
			"=config.json: moe_intermediate_size: -16 is out of range [1, 2147483647]"},
		{"huge size", qwen2MoEGen().with(map[string]any{"hidden_size": 1e300}), nil,
			"=config.json: hidden_size: want an integer, got 1e+300"},
		{"norm_topk_prob as string", qwen3MoEGen().with(map[string]any{"norm_topk_prob": "true"}), nil,
			`=config.json: norm_topk_prob: want true or false, got "true"`},
		{"routed_scaling_factor as string", deepseekV3Gen().with(map[string]any{"routed_scaling_factor": "2.5"}), nil,
			`=config.json: routed_scaling_factor: want a number, got "2.5"`},
		{"routed_scaling_factor zero", deepseekV3Gen().with(map[string]any{"routed_scaling_factor": 0}), nil,
			"routed_scaling_factor=0 must be positive"},
		{"mlp_only_layers not a list", qwen3MoEGen().with(map[string]any{"mlp_only_layers": 1}), nil,
			"=config.json: mlp_only_layers: want a list of integers, got 1"},
		{"mlp_only_layers element", qwen3MoEGen().with(map[string]any{"mlp_only_layers": []any{"0"}}), nil,
			`=config.json: mlp_only_layers: element 0: want a non-negative integer, got "0"`},
		{"quantization_config not an object", deepseekV3Gen().with(map[string]any{"quantization_config": "fp8"}), nil,
			`=config.json: quantization_config: want an object, got "fp8"`},
		{"decoder_sparse_step 0", qwen3MoEGen().with(map[string]any{"decoder_sparse_step": 0}), nil,
			"=config.json: decoder_sparse_step: 0 is out of range [1, 2147483647]"},
		{"moe_layer_freq 0", deepseekV2Gen().with(map[string]any{"moe_layer_freq": 0}), nil,
			"moe_layer_freq: 0 is out of range"},

		// Routing.
		{"deepseek_v3 with softmax", deepseekV3Gen().with(map[string]any{"scoring_func": "softmax"}), nil,
			`=config.json: scoring_func "softmax" with topk_method "noaux_tc" is not supported for deepseek_v3 (only sigmoid with noaux_tc)`},
		{"deepseek_v2 with noaux_tc", deepseekV2Gen().with(map[string]any{"topk_method": "noaux_tc"}), nil,
			"is not supported for deepseek_v2 (only softmax with greedy or group_limited_greedy)"},
		{"top-k above experts", mixtralGen().with(map[string]any{"num_experts_per_tok": 5}), nil,
			"=config.json: num_experts_per_tok=5 exceeds the 4 routed experts"},
		{"experts not divisible into groups", deepseekV3Gen().with(map[string]any{"n_group": 3}), nil,
			"=config.json: 8 routed experts do not split into n_group=3 groups"},
		{"topk_group above n_group", deepseekV3Gen().with(map[string]any{"topk_group": 3}), nil,
			"=config.json: topk_group=3 must be between 1 and n_group=2"},
		{"top-k above the kept groups", deepseekV3Gen().with(map[string]any{"num_experts_per_tok": 5}), nil,
			"=config.json: num_experts_per_tok=5 exceeds the 4 experts in topk_group=1 groups"},
		{"single-expert groups under noaux_tc", deepseekV3Gen().with(map[string]any{"n_group": 8, "topk_group": 2, "num_experts_per_tok": 1}), nil,
			"noaux_tc scores a group by its top 2"},
		{"deepseek_v3 defaults that do not fit", deepseekV3Gen().with(map[string]any{"n_group": nil}), nil,
			"=config.json: n_group=8 leaves 1 expert per group; noaux_tc scores a group by its top 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, tensors := tc.g.build(t)
			if tc.mutate != nil {
				tc.mutate(t, tensors)
			}
			p, err := Detect(cfg, tensors)
			if err == nil {
				t.Fatalf("planned %d layers, want an error containing %q", len(p.Layers), tc.want)
			}
			if exact, ok := strings.CutPrefix(tc.want, "="); ok {
				if err.Error() != exact {
					t.Fatalf("error\n got %q\nwant %q", err.Error(), exact)
				}
			} else if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err.Error(), tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
		})
	}
}

// A BF16 correction bias is legal in a file and planned as it is.
func TestBF16BiasAccepted(t *testing.T) {
	cfg, tensors := deepseekV3Gen().build(t)
	tensors.Add("model.layers.2.mlp.gate.e_score_correction_bias", safetensors.BF16, 8)
	p, err := Detect(cfg, tensors)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Layers[1].RouterBias; got != "model.layers.2.mlp.gate.e_score_correction_bias" {
		t.Errorf("RouterBias = %q", got)
	}
}

func TestAlreadyConvertedIsDetectable(t *testing.T) {
	g := deepseekV3Gen().with(map[string]any{"moeprep": map[string]any{}})
	cfg, tensors := g.build(t)
	if _, err := Detect(cfg, tensors); !errors.Is(err, ErrAlreadyConverted) {
		t.Errorf("Detect error %v does not wrap ErrAlreadyConverted", err)
	}
	f, _ := Lookup("deepseek_v3")
	if _, err := f.Plan(cfg, tensors); !errors.Is(err, ErrAlreadyConverted) {
		t.Errorf("Family.Plan error %v does not wrap ErrAlreadyConverted", err)
	}
}
