package validate

import "github.com/moeprep/moeprep/fixtures"

// The synthetic checkpoints the quantised formats', DeepSeek-V4 official
// layout's and in-out orientation's tests convert and validate, at sizes,
// seeds and group counts that none of the synth presets has (so the tests
// exercise checkpoints the presets never wrote).

func fp8ScaledSpecs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		"qwen3-channel": {Family: "qwen3_moe", Layers: 2, DenseLayers: 1, Hidden: 96, Intermediate: 48,
			Experts: 6, TopK: 2, DType: fixtures.DTypeFP8Channel, Vocab: 64, Seed: 1001},
		"deepseek-v2-channel": {Family: "deepseek_v2", Layers: 2, DenseLayers: 1, Hidden: 80, Intermediate: 24,
			Experts: 12, SharedExperts: 2, TopK: 3, RoutedScalingFactor: 1.75, DType: fixtures.DTypeFP8Channel, Vocab: 64, Seed: 1002},
		"qwen3-tensor": {Family: "qwen3_moe", Layers: 2, DenseLayers: 1, Hidden: 48, Intermediate: 40,
			Experts: 10, TopK: 3, DType: fixtures.DTypeFP8Tensor, Vocab: 64, Seed: 1003},
		"deepseek-v3-tensor": {Family: "deepseek_v3", Layers: 2, DenseLayers: 1, Hidden: 72, Intermediate: 24,
			Experts: 8, SharedExperts: 3, TopK: 2, NGroup: 2, TopKGroup: 1, RoutedScalingFactor: 2.25,
			DType: fixtures.DTypeFP8Tensor, Vocab: 64, Seed: 1004, BiasLike: "deepseek"},
	}
}

func int4Specs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		// Kimi-K2's family and ignore list, group 32: 3 groups a gate row, 2 a down row.
		"kimi-g32": {Family: "kimi_k2", Layers: 2, DenseLayers: 1, Hidden: 96, Intermediate: 64,
			Experts: 12, SharedExperts: 1, TopK: 3, RoutedScalingFactor: 2.5,
			DType: fixtures.DTypeInt4Pack, GroupSize: 32, Vocab: 64, Seed: 2001, BiasLike: "deepseek"},
		// One scale per row (strategy channel), no shared expert.
		"qwen3-channel": {Family: "qwen3_moe", Layers: 2, DenseLayers: 1, Hidden: 80, Intermediate: 40,
			Experts: 6, TopK: 2, DType: fixtures.DTypeInt4Pack, Vocab: 64, Seed: 2002},
		// Groups of 16, two shared experts (one BF16 shared MLP of 2I), grouped routing.
		"deepseek-v3-g16": {Family: "deepseek_v3", Layers: 3, DenseLayers: 1, Hidden: 64, Intermediate: 48,
			Experts: 8, SharedExperts: 2, TopK: 2, NGroup: 2, TopKGroup: 1, RoutedScalingFactor: 1.5,
			DType: fixtures.DTypeInt4Pack, GroupSize: 16, Vocab: 64, Seed: 2003},
	}
}

func mxfp4Specs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		// Three scale groups a gate row, two a down row.
		"h96-i64": {Family: "gpt_oss", Layers: 2, Hidden: 96, Intermediate: 64, Experts: 6, TopK: 2,
			DType: fixtures.DTypeMXFP4, Vocab: 64, Seed: 3001},
		// One group a gate row, four a down row; three layers.
		"h32-i128": {Family: "gpt_oss", Layers: 3, Hidden: 32, Intermediate: 128, Experts: 12, TopK: 4,
			DType: fixtures.DTypeMXFP4, Vocab: 64, Seed: 3002},
	}
}

func nvfp4Specs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		"deepseek-v3-nv": {Family: "deepseek_v3", Layers: 3, DenseLayers: 1, Hidden: 96, Intermediate: 48,
			Experts: 10, SharedExperts: 2, TopK: 3, NGroup: 2, TopKGroup: 1, RoutedScalingFactor: 2.5,
			DType: fixtures.DTypeNVFP4, Vocab: 64, Seed: 3001, BiasLike: "deepseek"},
		"qwen3-nv": {Family: "qwen3_moe", Layers: 2, DenseLayers: 1, Hidden: 80, Intermediate: 32,
			Experts: 6, TopK: 2, DType: fixtures.DTypeNVFP4, Vocab: 64, Seed: 3002},
	}
}

// requantSpecs have a plain BF16 shared expert beside quantised routed
// experts, which fuse-shared --requantize-shared quantises: Kimi's INT4
// (two of int4Specs) and FP8 per channel or per tensor whose ignore list
// names the shared expert.
func requantSpecs() map[string]fixtures.SynthSpec {
	i4 := int4Specs()
	return map[string]fixtures.SynthSpec{
		"kimi-g32":        i4["kimi-g32"],
		"deepseek-v3-g16": i4["deepseek-v3-g16"],
		// Two shared experts split per channel; compressed-tensors' ignore list.
		"deepseek-v3-channel": {Family: "deepseek_v3", Layers: 2, DenseLayers: 1, Hidden: 80, Intermediate: 24,
			Experts: 10, SharedExperts: 2, TopK: 3, NGroup: 2, TopKGroup: 1, RoutedScalingFactor: 2.5,
			DType: fixtures.DTypeFP8Channel, SharedDType: "bf16", Vocab: 64, Seed: 4001, BiasLike: "deepseek"},
		// One F32 scale per weight; quant_method fp8's modules_to_not_convert.
		"kimi-tensor": {Family: "kimi_k2", Layers: 3, DenseLayers: 1, Hidden: 56, Intermediate: 40,
			Experts: 9, SharedExperts: 1, TopK: 3, RoutedScalingFactor: 2.827,
			DType: fixtures.DTypeFP8Tensor, SharedDType: "bf16", Vocab: 64, Seed: 4002, BiasLike: "deepseek"},
	}
}

// nvfp4CTSpecs are compressed-tensors NVFP4 checkpoints (every Linear but
// the head and routers, weight_global_scale a divisor).
func nvfp4CTSpecs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		// Two shared experts (one NVFP4 shared MLP of 2I), grouped routing.
		"deepseek-v3-ct": {Family: "deepseek_v3", Layers: 3, DenseLayers: 1, Hidden: 80, Intermediate: 32,
			Experts: 12, SharedExperts: 2, TopK: 3, NGroup: 3, TopKGroup: 2, RoutedScalingFactor: 1.75,
			DType: fixtures.DTypeNVFP4CT, Vocab: 64, Seed: 4001, BiasLike: "deepseek"},
		// Three 16-groups a down row, one a gate row.
		"qwen3-ct": {Family: "qwen3_moe", Layers: 2, Hidden: 16, Intermediate: 48,
			Experts: 6, TopK: 2, DType: fixtures.DTypeNVFP4CT, Vocab: 64, Seed: 4002},
	}
}

// dsv4FP4Specs are DeepSeek-V4 checkpoints in its official precision: FP4
// routed experts (I8, F8_E8M0 scale per 32), FP8 ue8m0 shared expert.
func dsv4FP4Specs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		// Two scale groups a gate row, two a down row; a hash-routed layer.
		"h64-i64": {Family: "deepseek_v4", Layers: 2, HashLayers: 1, Hidden: 64, Intermediate: 64,
			Experts: 6, TopK: 2, DType: fixtures.DTypeFP4Experts, Vocab: 64, Seed: 5001},
		// One group a gate row, three a down row, twelve experts.
		"h32-i96": {Family: "deepseek_v4", Layers: 3, Hidden: 32, Intermediate: 96,
			Experts: 12, TopK: 3, RoutedScalingFactor: 2, DType: fixtures.DTypeFP4Experts, Vocab: 64, Seed: 5002},
	}
}

// ctMXFP4Specs are compressed-tensors mxfp4-pack-quantized checkpoints
// (llm-compressor's MXFP4A16 on the routed and shared experts).
func ctMXFP4Specs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		// Two scale groups a gate row; two shared experts of 32 (fusable
		// in two exact slices).
		"deepseek-v3-h64": {Family: "deepseek_v3", Layers: 3, DenseLayers: 1, Hidden: 64, Intermediate: 32,
			Experts: 8, SharedExperts: 2, TopK: 2, NGroup: 2, TopKGroup: 1, RoutedScalingFactor: 2.5,
			DType: fixtures.DTypeMXFP4CT, Vocab: 64, Seed: 6001, BiasLike: "deepseek"},
		// One group a gate row, two a down row, twelve experts.
		"qwen3-e12": {Family: "qwen3_moe", Layers: 2, Hidden: 32, Intermediate: 64,
			Experts: 12, TopK: 3, DType: fixtures.DTypeMXFP4CT, Vocab: 64, Seed: 6002},
	}
}

// nvfp4MixedSpecs are ModelOpt MIXED_PRECISION checkpoints: NVFP4 experts,
// FP8 attention and dense MLPs with static activation scales.
func nvfp4MixedSpecs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		"deepseek-v3-mixed": {Family: "deepseek_v3", Layers: 3, DenseLayers: 1, Hidden: 48, Intermediate: 32,
			Experts: 10, SharedExperts: 2, TopK: 3, NGroup: 2, TopKGroup: 1, RoutedScalingFactor: 2.5,
			DType: fixtures.DTypeNVFP4Mixed, Vocab: 64, Seed: 7001, BiasLike: "deepseek"},
		"qwen3-mixed": {Family: "qwen3_moe", Layers: 3, DenseLayers: 1, Hidden: 32, Intermediate: 48,
			Experts: 6, TopK: 2, DType: fixtures.DTypeNVFP4Mixed, Vocab: 64, Seed: 7002},
	}
}

// dsv4OfficialSpecs are official-layout checkpoints at sizes and seeds the
// preset small-deepseek-v4-official does not use.
func dsv4OfficialSpecs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		// Two scale groups a gate row, two a down row; a hash-routed layer.
		"h64-i64": {Family: "deepseek_v4", Layers: 2, HashLayers: 1, Hidden: 64, Intermediate: 64,
			Experts: 6, TopK: 2, DType: fixtures.DTypeFP4Experts, Vocab: 64, Seed: 5101, Layout: fixtures.LayoutDeepSeekOfficial},
		// One group a gate row, three a down row, twelve experts.
		"h32-i96": {Family: "deepseek_v4", Layers: 3, Hidden: 32, Intermediate: 96,
			Experts: 12, TopK: 3, RoutedScalingFactor: 2, DType: fixtures.DTypeFP4Experts, Vocab: 64, Seed: 5102, Layout: fixtures.LayoutDeepSeekOfficial},
	}
}

// dsv4OfficialBF16Specs: the official names with bf16 weights, whose shared
// expert fuse-shared fuses.
func dsv4OfficialBF16Specs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		"bf16": {Family: "deepseek_v4", Layers: 3, HashLayers: 1, Hidden: 48, Intermediate: 32, Experts: 8,
			SharedExperts: 1, TopK: 2, Vocab: 64, Seed: 5103, Layout: fixtures.LayoutDeepSeekOfficial},
	}
}

// inOutSpecs are synthetic checkpoints whose matrices and FP8 grids are
// not square, so that a slice or grid left untransposed cannot pass.
func inOutSpecs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		// gate [256, 384]: grid [2, 3], in-out [3, 2]; 2 shared experts split.
		"deepseek-v2-fp8": {Family: "deepseek_v2", Layers: 2, DenseLayers: 1, Hidden: 384, Intermediate: 256,
			Experts: 6, SharedExperts: 2, TopK: 2, RoutedScalingFactor: 1.5, DType: "fp8", Vocab: 64, Seed: 3001},
		"qwen3-bf16": {Family: "qwen3_moe", Layers: 2, DenseLayers: 1, Hidden: 96, Intermediate: 40,
			Experts: 6, TopK: 2, Vocab: 64, Seed: 3002},
	}
}

// mxfp8Specs are MXFP8 checkpoints as ModelOpt (x.weight_scale) and
// MiniMax-M3 (quant_method mxfp8, x.weight_scale_inv) write them.
func mxfp8Specs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		// Three scale groups a gate row, two a down row; two shared
		// experts, split at a whole group (I = 64).
		"modelopt-h96-i64": {Family: "deepseek_v3", Layers: 3, DenseLayers: 1, Hidden: 96, Intermediate: 64,
			Experts: 12, SharedExperts: 2, TopK: 3, NGroup: 2, TopKGroup: 1, RoutedScalingFactor: 2.5,
			DType: fixtures.DTypeMXFP8, Vocab: 64, Seed: 5001, BiasLike: "deepseek"},
		// One group a gate row, three a down row.
		"minimax-h32-i96": {Family: "minimax_m2", Layers: 2, Hidden: 32, Intermediate: 96, Experts: 8, TopK: 2,
			DType: fixtures.DTypeMXFP8MiniMax, Vocab: 64, Seed: 5002, BiasLike: "deepseek"},
		// quant_method mxfp8 on a model with a shared expert, which its
		// ignored_layers leaves BF16.
		"minimax-shared-bf16": {Family: "deepseek_v3", Layers: 2, DenseLayers: 1, Hidden: 64, Intermediate: 32,
			Experts: 8, SharedExperts: 1, TopK: 2, NGroup: 1, TopKGroup: 1, RoutedScalingFactor: 2.5,
			DType: fixtures.DTypeMXFP8MiniMax, SharedDType: "bf16", Vocab: 64, Seed: 5003, BiasLike: "deepseek"},
		// ModelOpt's exclude list leaves two shared experts BF16.
		"modelopt-shared-bf16": {Family: "deepseek_v3", Layers: 2, DenseLayers: 1, Hidden: 64, Intermediate: 32,
			Experts: 8, SharedExperts: 2, TopK: 2, NGroup: 1, TopKGroup: 1, RoutedScalingFactor: 2.5,
			DType: fixtures.DTypeMXFP8, SharedDType: "bf16", Vocab: 64, Seed: 5004, BiasLike: "deepseek"},
	}
}

// fp8SquareSpecs are FP8 checkpoints in square blocks other than
// DeepSeek's 128 (weight_block_size [32, 32], scale_fmt ue8m0).
func fp8SquareSpecs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		// Ragged edge blocks: 80 = 2*32 + 16 columns of a gate row.
		"b32-h80-i64": {Family: "deepseek_v3", Layers: 3, DenseLayers: 1, Hidden: 80, Intermediate: 64,
			Experts: 12, SharedExperts: 2, TopK: 3, NGroup: 2, TopKGroup: 1, RoutedScalingFactor: 2.5,
			DType: "fp8", ScaleFmt: "ue8m0", FP8Block: 32, Vocab: 64, Seed: 5101, BiasLike: "deepseek"},
		// Two 64-column blocks a hidden row, F32 scales; 96 = 64 + 32
		// intermediate rows, so each half of a gate-up stack ends in a
		// ragged block row of its own.
		"b64-h128-i96": {Family: "deepseek_v3", Layers: 2, DenseLayers: 1, Hidden: 128, Intermediate: 96,
			Experts: 8, SharedExperts: 1, TopK: 2, NGroup: 1, TopKGroup: 1, RoutedScalingFactor: 2.5,
			DType: "fp8", FP8Block: 64, Vocab: 64, Seed: 5102, BiasLike: "deepseek"},
	}
}

// dsv41Specs are DeepSeek-V4.1 as its release stores it (validate/dsv41_test.go).
func dsv41Specs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		// Three 32-column blocks a hidden row, two down the
		// intermediate rows.
		"h96-i64": {Family: "deepseek_v41", Layers: 2, Hidden: 96, Intermediate: 64,
			Experts: 6, TopK: 2, Vocab: 64, Seed: 5201},
		// Twelve experts, top-3, another routed scaling factor.
		"h64-i96": {Family: "deepseek_v41", Layers: 3, Hidden: 64, Intermediate: 96,
			Experts: 12, TopK: 3, RoutedScalingFactor: 2, Vocab: 64, Seed: 5202},
	}
}

// kimiK3Specs are Kimi K3 as its release lays it out (validate/kimik3_test.go).
func kimiK3Specs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		// Twelve experts on a 32-wide latent of a 64-wide hidden state.
		"h64-l32": {Family: "kimi_k3", Layers: 3, DenseLayers: 1, Hidden: 64, Latent: 32, Intermediate: 32,
			Experts: 12, SharedExperts: 2, TopK: 4, DType: fixtures.DTypeMXFP4CT, SharedDType: "bf16", Vocab: 64, Seed: 5301},
		// Two scale groups a gate row (latent 64), one shared expert.
		"h96-l64": {Family: "kimi_k3", Layers: 2, DenseLayers: 1, Hidden: 96, Latent: 64, Intermediate: 64,
			Experts: 8, SharedExperts: 1, TopK: 3, DType: fixtures.DTypeMXFP4CT, SharedDType: "bf16", Vocab: 64, Seed: 5302},
	}
}
