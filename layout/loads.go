package layout

import "slices"

// TransformersLoads are the model types whose output in the form
// transformers 5 holds their experts in (convert --layout transformers,
// or the layout and orientation that resolves to; not fuse-shared, not
// dequantised, not per rank) transformers 5.17 loaded as the original
// model on the H200: every parameter equal, identical logits, no missing,
// unexpected or mismatched key (fixtures/hf/interop.py on every fixture
// transformers wrote, 29 Nov 2026, quantised experts written as stored:
// a type is listed where one of its fixtures was identical and none
// failed; FP8 ones loaded with FP8 dequantised on the CPU).
// docs/OUTPUT.md has the table. The rest are not claimed.
var TransformersLoads = []string{
	"afmoe", "aria", "aria_text", "cohere2_moe", "deepseek_ocr2", "deepseek_v2", "deepseek_v3",
	"deepseek_v32", "deepseek_v4", "diffusion_gemma", "dots1", "ernie4_5_moe", "ernie4_5_vl_moe",
	"exaone_moe", "flex_olmo", "gemma4", "gemma4_text", "glm4_moe", "glm5_next", "glm5_next_text",
	"glm_moe_dsa", "gpt_oss", "granitemoe", "granitemoe_swa", "granitemoehybrid", "granitemoeshared",
	"hunyuan_v1_moe", "hy_v3", "hy_v4", "inkling_mm_model", "inkling_text", "jamba", "kimi_k25",
	"kimi_linear", "laguna", "lfm2_moe", "llama4", "llama4_text", "longcat_flash", "mellum",
	"mimo_v2_flash", "minimax", "minimax_m2", "minimax_m3_vl", "minimax_m3_vl_text", "mistral4",
	"mixtral", "nemotron_h", "olmoe", "phimoe", "qwen2_moe", "qwen3_5_moe", "qwen3_5_moe_text",
	"qwen3_moe", "qwen3_next", "qwen3_omni_moe", "qwen3_omni_moe_thinker", "qwen3_vl_moe",
	"qwen3_vl_moe_text", "qwen4_exp", "qwen4_exp_text", "solar_open",
}

// LoadsInTransformers reports whether modelType is one of them.
func LoadsInTransformers(modelType string) bool {
	return slices.Contains(TransformersLoads, modelType)
}
