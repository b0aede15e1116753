package family

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/quantdesc"
)

const notCarried = ": not carried yet; moeprep reads bf16/f16/f32, FP8 (128x128 blocks, per-channel, per-tensor), compressed-tensors INT4 pack-quantized, MXFP4 (gpt-oss, compressed-tensors, DeepSeek-V4), ModelOpt NVFP4 and compressed-tensors NVFP4, MXFP8 (ModelOpt, quant_method mxfp8) experts"

// kimiIgnore is Kimi-K2-Thinking's ignore list: routed experts INT4, the
// rest bf16.
const kimiIgnore = `["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]`

const int4Group = `{"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": true}}}`

// TestDetectQuant: each format in each place its description lives is
// classified, its ignore list resolved per tensor group, and refused with
// one exact line (FP8 128x128 blocks pass to readQuant).
func TestDetectQuant(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config string // config.json
		hf     string // hf_quant_config.json, "" for none
		kind   quantdesc.Kind
		want   string // the refusal; "" when supported
	}{
		{"none", `{}`, "", "", ""},
		{"fp8 block", `{"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}`, "", quantdesc.KindFP8Block, ""},
		{"int4 kimi top-level",
			`{"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": ` + int4Group + `, "ignore": ` + kimiIgnore + `}}`, "",
			quantdesc.KindInt4Pack,
			""}, // carried: quantdesc.Int4Group reads the rest

		{"int4 kimi-k2.5 text_config",
			`{"model_type": "kimi_k25", "text_config": {"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": ` + int4Group + `, "ignore": ` + kimiIgnore + `}}}`, "",
			quantdesc.KindInt4Pack,
			""}, // carried wherever config.json holds it (quantdesc.Config); the kimi_k25 wrapper itself is refused by Detect
		{"int4 compression_config asymmetric",
			`{"compression_config": {"format": "pack-quantized", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": false}}}, "ignore": ["lm_head"]}}`, "",
			quantdesc.KindInt4Pack,
			""}, // quantdesc.Int4Group refuses the zero point (TestQuantConfigPlaces)
		{"int4 in hf_quant_config.json",
			`{}`, `{"quantization": {"quant_algo": "W4A16_AWQ"}}`,
			quantdesc.KindUnknown,
			"hf_quant_config.json: quantization: modelopt w4a16_awq on the routed experts, shared expert, attention, dense MLP (unquantised: router)" + notCarried},
		{"mxfp4 gpt-oss",
			`{"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}`, "",
			quantdesc.KindMXFP4, ""}, // carried (gpt-oss: family/mxfp4.go)
		{"nvfp4 modelopt quantization_config",
			`{"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head", "model.layers.*.self_attn*", "model.layers.0.mlp*"]}}`, "",
			quantdesc.KindNVFP4,
			""},
		{"nvfp4 hf_quant_config.json",
			`{"model_type": "deepseek_v3"}`,
			`{"producer": {"name": "modelopt", "version": "0.29.0"}, "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16, "exclude_modules": ["lm_head", "re:.*self_attn.*"]}}`,
			quantdesc.KindNVFP4,
			""},
		{"modelopt MIXED_PRECISION",
			`{}`,
			`{"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
				"model.layers.1.mlp.experts.0.gate_proj": {"quant_algo": "NVFP4", "group_size": 16},
				"model.layers.1.mlp.shared_experts.gate_proj": {"quant_algo": "FP8"},
				"model.layers.1.self_attn.q_proj": {"quant_algo": "FP8"}}}}`,
			quantdesc.KindMixed,
			"hf_quant_config.json: quantization: modelopt MIXED_PRECISION (nvfp4 (group 16) on the routed experts; fp8 per-tensor on the shared expert, attention) (unquantised: router, dense MLP): not carried: the shared expert is fp8 per-tensor beside NVFP4 routed experts; moeprep carries NVFP4 shared experts only (fusing or validating a shared expert of another format beside them is not built)"},
		{"modelopt MIXED_PRECISION, NVFP4 experts, FP8 attention and dense MLP",
			`{"quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": {
				"model.layers.1.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16},
				"model.layers.2.mlp.experts": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
				"model.layers.1.mlp.shared_experts.gate_proj": {"quant_algo": "NVFP4", "group_size": 16},
				"model.layers.0.mlp.down_proj": {"quant_algo": "FP8"},
				"model.layers.1.self_attn.q_proj": {"quant_algo": "FP8"}}}}`, "",
			quantdesc.KindMixed, ""}, // carried as nvfp4_modelopt (the tensors say whether input_scale is there)
		{"modelopt MIXED_PRECISION, experts of two formats",
			`{}`,
			`{"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
				"model.layers.1.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16},
				"model.layers.2.mlp.experts": {"quant_algo": "FP8"}}}}`,
			quantdesc.KindMixed,
			"hf_quant_config.json: quantization: modelopt MIXED_PRECISION (nvfp4 (group 16) on the routed experts) (unquantised: shared expert, router, attention, dense MLP): not carried: quantized_layers: model.layers.1.mlp.experts is nvfp4 (group 16) but model.layers.2.mlp.experts is fp8 per-tensor; moeprep plans one routed expert format per checkpoint"},
		{"nvfp4 compressed-tensors",
			`{"quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}}, "ignore": ["lm_head", "re:.*mlp.gate$"]}}`, "",
			quantdesc.KindNVFP4,
			""}, // carried: readCTNVFP4 reads the rest
		{"mxfp4 compressed-tensors",
			`{"quantization_config": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32}}}, "ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp.gate$"]}}`, "",
			quantdesc.KindMXFP4,
			""}, // carried: quantdesc.Read reads the rest
		{"mxfp4 compressed-tensors group 16",
			`{"compression_config": {"format": "mxfp4-pack-quantized", "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 16}}}}}`, "",
			quantdesc.KindMXFP4,
			"config.json: compression_config: compressed-tensors mxfp4-pack-quantized (group 16) on the routed experts, shared expert, attention, dense MLP (unquantised: router): not carried yet: moeprep reads MXFP4 experts in groups of 32 only (gpt-oss quant_method mxfp4, compressed-tensors mxfp4-pack-quantized, DeepSeek-V4 expert_dtype fp4)"},
		{"nvfp4 compressed-tensors group 32",
			`{"quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 32}}}}}`, "",
			quantdesc.KindNVFP4,
			"config.json: quantization_config: compressed-tensors nvfp4-pack-quantized (group 32) on the routed experts, shared expert, attention, dense MLP (unquantised: router): not carried yet: moeprep reads NVFP4 experts in groups of 16 only (ModelOpt quant_algo NVFP4, compressed-tensors nvfp4-pack-quantized)"},
		{"fp8 per-channel compressed-tensors",
			`{"quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}, "ignore": ["lm_head"]}}`, "",
			quantdesc.KindFP8Channel,
			"" /* supported: readQuant checks the rest, and refuses a static activation scheme */},
		{"fp8 per-tensor compressed-tensors",
			`{"quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}}}`, "",
			quantdesc.KindFP8Tensor,
			"" /* supported: readQuant checks the rest, and refuses a static activation scheme */},
		{"fp8 per-tensor (Hy3)",
			`{"quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}}`, "",
			quantdesc.KindFP8Tensor,
			"" /* supported: readQuant checks the rest, and refuses a static activation scheme */},
		{"fp8 block compressed-tensors",
			`{"quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}}}, "ignore": ["re:.*self_attn.*"]}}`, "",
			quantdesc.KindFP8BlockCT,
			"config.json: quantization_config: compressed-tensors float-quantized fp8 block [128 128] (weight_scale, not weight_scale_inv) on the routed experts, shared expert, dense MLP (unquantised: router, attention)" + notCarried},
		{"compressed-tensors mixed schemes",
			`{"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"a": {"format": "pack-quantized", "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}, "b": {"format": "float-quantized", "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}}`, "",
			quantdesc.KindMixed,
			"config.json: quantization_config: compressed-tensors (several schemes) on the routed experts, shared expert, attention, dense MLP (unquantised: router)" + notCarried},
		{"mxfp8 modelopt, both files",
			`{"quantization_config": {"quant_method": "modelopt", "quant_algo": "MXFP8", "ignore": ["lm_head", "*mlp.gate"], "producer": {"name": "modelopt"}}}`,
			`{"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "MXFP8", "group_size": 32, "exclude_modules": ["lm_head", "*mlp.gate"], "kv_cache_quant_algo": null}}`,
			quantdesc.KindMXFP8, ""},
		{"mxfp8 modelopt group 16",
			`{}`, `{"quantization": {"quant_algo": "MXFP8", "group_size": 16}}`,
			quantdesc.KindMXFP8,
			"hf_quant_config.json: quantization: modelopt mxfp8 (group 16) on the routed experts, shared expert, attention, dense MLP (unquantised: router): not carried yet: moeprep reads MXFP8 experts in groups of 32 only (ModelOpt quant_algo MXFP8 group_size 32, quant_method mxfp8 described by config.json)"},
		{"mxfp8 minimax",
			`{"quantization_config": {"quant_method": "mxfp8", "activation_scheme": "dynamic", "weight_block_size": [1, 32], "ignored_layers": ["lm_head", "re:.*mlp.gate$"]}}`, "",
			quantdesc.KindMXFP8, ""},
		{"fp8 block with nvfp4 hf_quant_config.json",
			`{"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}`,
			`{"quantization": {"quant_algo": "NVFP4"}}`,
			quantdesc.KindNVFP4,
			""}, // carried alone; the plan refuses it beside config.json's FP8 (TestConflictingQuantFiles)
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg, hf map[string]any
			if err := json.Unmarshal([]byte(tc.config), &cfg); err != nil {
				t.Fatal(err)
			}
			if tc.hf != "" {
				if err := json.Unmarshal([]byte(tc.hf), &hf); err != nil {
					t.Fatal(err)
				}
			}
			descs, err := DetectQuantOf(cfg, hf, nil)
			if err != nil {
				t.Fatal(err)
			}
			var kind quantdesc.Kind
			var refusal string
			for _, d := range descs {
				if !d.Supported() {
					kind, refusal = d.Kind, d.Refusal().Error()
					break
				}
				kind = d.Kind
			}
			if kind != tc.kind {
				t.Errorf("kind %q, want %q", kind, tc.kind)
			}
			if refusal != tc.want {
				t.Errorf("refusal\n got %q\nwant %q", refusal, tc.want)
			}
			if strings.Contains(refusal, "\n") {
				t.Errorf("refusal spans lines")
			}
		})
	}
}

// hfTensors hands Detect an hf_quant_config.json as checkpoint does.
type hfTensors struct {
	*MemTensors
	hf map[string]any
}

func (h hfTensors) HFQuantConfig() map[string]any { return h.hf }

// The plan refuses through Detect, from config.json or hf_quant_config.json,
// before any tensor is read as bf16.
func TestDetectRefusesQuantFormats(t *testing.T) {
	cfg, tensors := deepseekV3Gen().with(map[string]any{"quantization_config": map[string]any{
		"quant_method": "mxfp4"}}).build(t)
	_, err := Detect(cfg, tensors)
	want := "config.json: quantization_config: quant_method mxfp4 is carried for gpt-oss (experts stacked on disk as *_blocks and *_scales) only, not deepseek_v3"
	if err == nil || err.Error() != want {
		t.Errorf("mxfp4: %v\nwant %s", err, want)
	}
	cfg, tensors = deepseekV3Gen().build(t)
	_, err = Detect(cfg, hfTensors{tensors, map[string]any{"quantization": map[string]any{"quant_algo": "NVFP4", "exclude_modules": []any{"lm_head"}}}})
	// NVFP4 is carried now: BF16 experts contradict it.
	want = "model.layers.1.mlp.experts.0.gate_proj.weight is BF16 but the quantisation config says NVFP4"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("hf_quant_config.json: %v\nwant %s", err, want)
	}
	if _, err := Detect(cfg, hfTensors{tensors, nil}); err != nil {
		t.Errorf("no hf_quant_config.json: %v", err)
	}
}
