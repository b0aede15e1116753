package layout

import "slices"

// TransformersLoadsGateUp are the model types whose --layout gate-up output
// (out-in, convert, not fuse-shared) transformers 5 loads as the original
// model, checked with identical logits and no missing or unexpected key
// (scripts/gpu-interop.sh, fixtures/hf/interop.py). Others are not
// claimed: transformers holds aria's, dbrx's, GraniteMoeHybrid's, Llama 4's
// and gpt-oss's experts in other forms, and the rest are unchecked here.
var TransformersLoadsGateUp = []string{"deepseek_v2", "deepseek_v3", "mixtral", "qwen2_moe", "qwen3_moe"}

// LoadsInTransformers reports whether modelType is one of them.
func LoadsInTransformers(modelType string) bool {
	return slices.Contains(TransformersLoadsGateUp, modelType)
}
