package layout

import "slices"

// TransformersLoads are the model types whose output in the form
// transformers 5 holds their experts in (convert --layout transformers,
// or the layout and orientation that resolves to; not fuse-shared, not
// dequantised, not per rank) transformers 5 loads as the original model,
// checked with identical logits and no missing, unexpected or mismatched
// key (scripts/gpu-transformers-load.sh, fixtures/hf/interop.py, on the
// fixtures transformers wrote). The rest are not claimed.
var TransformersLoads = []string{"deepseek_v2", "deepseek_v3", "mixtral", "qwen2_moe", "qwen3_moe"}

// LoadsInTransformers reports whether modelType is one of them.
func LoadsInTransformers(modelType string) bool {
	return slices.Contains(TransformersLoads, modelType)
}
