package family

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// FuzzDetect: any config.json, planned against the tensors of one of the
// real checkpoints transformers wrote, plans or fails with an error: never
// a panic, and a hostile config's lists (moe_layers_enum, per-layer limits,
// layer types) cost bounded time. The seeds are those checkpoints' own
// configs (each plans against its tensors) plus hub-style Step-3.5 keys
// a Gemma 4 config with a bad epsilon and activation, and a LongCat-Flash
// one with a huge zero_expert_num, and ERNIE-4.5-VL's per-bank lists
// (widths, the hub's expert counts) malformed and well formed.
func FuzzDetect(f *testing.F) {
	dirs := []string{"deepseek-v3-bf16", "step3p7", "hy-v4", "gpt-oss", "llama4", "glm5-next", "gemma4", "diffusion-gemma", "longcat-flash", "nemotron-h", "ernie4-5-vl-moe"}
	sets := make([]*MemTensors, len(dirs))
	for i, dir := range dirs {
		d := filepath.Join("..", "fixtures", "hf", dir)
		ts := &MemTensors{}
		shards, _ := filepath.Glob(filepath.Join(d, "*.safetensors"))
		for _, s := range shards {
			sf, err := safetensors.Open(s)
			if err != nil {
				f.Fatal(err)
			}
			for _, ti := range sf.Tensors {
				ts.Add(ti.Name, ti.DType, ti.Shape...)
			}
			sf.Close()
		}
		sets[i] = ts
		b, err := os.ReadFile(filepath.Join(d, "config.json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(i))
		// The per-expert checkpoint plans against its own tensors: the
		// seeds reach the planner's tensor checks (the stacked ones need
		// views, which these metadata-only tensors do not resolve).
		var cfg map[string]any
		if dir == "deepseek-v3-bf16" || dir == "ernie4-5-vl-moe" {
			if json.Unmarshal(b, &cfg) != nil {
				f.Fatalf("%s: config.json", dir)
			}
			if p, err := Detect(cfg, ts); err != nil || len(p.Layers) == 0 {
				f.Fatalf("%s does not plan against its own tensors: %v", dir, err)
			}
		}
	}
	f.Add([]byte(`{"model_type":"step3p5","hidden_size":64,"num_hidden_layers":4,"moe_intermediate_size":32,"n_routed_experts":8,`+
		`"moe_top_k":2,"moe_layers_enum":"1,2,3,99999999999999999999","num_nextn_predict_layers":1,"share_expert_dim":64,`+
		`"swiglu_limits":[0,0,null,7,7],"swiglu_limits_shared":[0,0,16,16,16]}`), uint8(1))
	f.Add([]byte(`{"model_type":"step3p7","text_config":{"model_type":"step3p5","moe_layers_enum":[1,2,-3]}}`), uint8(1))
	f.Add([]byte(`{"model_type":"gemma4_text","hidden_size":64,"num_hidden_layers":3,"moe_intermediate_size":32,"num_experts":8,`+
		`"top_k_experts":2,"enable_moe_block":true,"rms_norm_eps":-1,"hidden_activation":"gelu"}`), uint8(6))
	f.Add([]byte(`{"model_type":"longcat_flash","hidden_size":64,"num_layers":2,"num_hidden_layers":4,"expert_ffn_hidden_size":32,`+
		`"n_routed_experts":8,"zero_expert_num":999999999,"moe_topk":3}`), uint8(8))
	f.Add([]byte(`{"model_type":"nemotron_h","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":16,"num_experts_per_tok":4,`+
		`"n_group":4,"topk_group":2,"moe_shared_expert_intermediate_size":64,"hybrid_override_pattern":"MEM*E-"}`), uint8(9))
	f.Add([]byte(`{"model_type":"nemotron_h","layers_block_type":["moe","mamba2"],"moe_latent_size":null,"mlp_hidden_act":"relu2"}`), uint8(9))
	f.Add([]byte(`{"model_type":"ernie4_5_vl_moe","text_config":{"model_type":"ernie4_5_vl_moe_text","hidden_size":64,"num_hidden_layers":3,`+
		`"moe_intermediate_size":[32,0,16],"moe_num_experts":[8,9],"moe_k":2,"mlp_layer_types":["dense","sparse","sparse"]}}`), uint8(10))
	f.Add([]byte(`{"model_type":"ernie4_5_vl_moe","text_config":{"hidden_size":64,"num_hidden_layers":3,"moe_intermediate_size":[32,16],`+
		`"moe_num_experts":[8,8],"moe_k":2,"moe_num_shared_experts":1}}`), uint8(10))
	// Issue 41's ignore lists against the DeepSeek-V3 tensors: explicit
	// names past layer 1, a lookahead, patterns RE2 compiled to gigabytes,
	// a backtracking one, ModelOpt globs.
	dsv3, err := os.ReadFile(filepath.Join("..", "fixtures", "hf", "deepseek-v3-bf16", "config.json"))
	if err != nil {
		f.Fatal(err)
	}
	for _, q := range []string{
		`{"quant_method":"compressed-tensors","format":"pack-quantized","config_groups":{"g":{"weights":{"num_bits":4,"type":"int","strategy":"group","group_size":32}}},` +
			`"ignore":["lm_head","model.layers.3.mlp.shared_experts.gate_proj","model.layers.1.self_attn.q_proj","re:.*mlp\\.(?!experts)(gate|up|down)_proj.*"]}`,
		`{"quant_method":"compressed-tensors","format":"pack-quantized","config_groups":{"g":{"weights":{"num_bits":4,"type":"int"}}},` +
			`"ignore":["re:` + strings.Repeat(".{1000}", 145) + `mlp","re:.*.*.*.*.*.*[z]","re:(?<=a|bc)x","re:(a)\\1"]}`,
		`{"quant_method":"modelopt","quant_algo":"NVFP4","group_size":16,"exclude_modules":["re:.*self_attn.*","model.layers.[!0].mlp.*","*.gate"]}`,
	} {
		var cfg map[string]any
		if err := json.Unmarshal(dsv3, &cfg); err != nil {
			f.Fatal(err)
		}
		var qc any
		if err := json.Unmarshal([]byte(q), &qc); err != nil {
			f.Fatalf("%s: %v", q, err)
		}
		cfg["quantization_config"] = qc
		b, _ := json.Marshal(cfg)
		f.Add(b, uint8(0))
	}
	f.Fuzz(func(t *testing.T, b []byte, which uint8) {
		var cfg map[string]any
		if json.Unmarshal(b, &cfg) != nil {
			return
		}
		p, err := Detect(cfg, sets[int(which)%len(sets)])
		if err == nil && (p == nil || len(p.Layers) == 0) {
			t.Fatalf("planned without an error but with no MoE layer: %+v", p)
		}
	})
}
