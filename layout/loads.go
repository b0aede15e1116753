package layout

import "slices"

// TransformersLoads are the model types whose output in the form
// transformers 5 holds their experts in (convert --layout transformers,
// or the layout and orientation that resolves to; not fuse-shared, not
// dequantised, not per rank) transformers 5.17 loaded as the original
// model on the H200: every parameter equal, identical logits, no missing,
// unexpected or mismatched key (scripts/gpu-transformers-load.sh,
// fixtures/hf/interop.py, on the fixtures transformers wrote; the bf16
// ones where a model type has FP8 fixtures too, whose forward needs a
// kernel package that machine lacks). docs/OUTPUT.md has the table. The
// rest are not claimed.
var TransformersLoads = []string{
	"afmoe", "aria", "cohere2_moe", "deepseek_ocr2", "deepseek_v2", "deepseek_v3", "deepseek_v32",
	"deepseek_v4", "dots1", "ernie4_5_moe", "ernie4_5_vl_moe", "exaone_moe", "flex_olmo", "gemma4",
	"gemma4_text", "glm4_moe", "glm5_next", "glm_moe_dsa", "gpt_oss", "hunyuan_v1_moe", "hy_v3",
	"hy_v4", "inkling_mm_model", "inkling_text", "jamba", "kimi_k25", "kimi_linear", "laguna",
	"lfm2_moe", "llama4", "llama4_text", "mellum", "mimo_v2_flash", "minimax", "minimax_m2",
	"minimax_m3_vl", "mistral4", "mixtral", "nemotron_h", "olmoe", "phimoe", "qwen2_moe",
	"qwen3_5_moe", "qwen3_moe", "qwen3_next", "qwen3_vl_moe", "qwen4_exp", "solar_open",
}

// LoadsInTransformers reports whether modelType is one of them.
func LoadsInTransformers(modelType string) bool {
	return slices.Contains(TransformersLoads, modelType)
}
