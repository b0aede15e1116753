package validate

import (
	"slices"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// DeepSeek-V4.1 as its release stores it (issue 44, item 3): the composite
// config (text_config deepseek_v41_text, quantization_config at the top
// with expert_dtype fp4 and weight_block_size [32, 32]), DeepSeek's names,
// FP4 routed experts beside FP8 in 32x32 blocks under x.scale F8_E8M0,
// the shared expert's included. Sizes whose 32x32 grids have a partial
// last block (I 48) and several blocks a row (H 96).

func dsv41Specs() map[string]fixtures.SynthSpec {
	return map[string]fixtures.SynthSpec{
		// Three 32-column blocks a hidden row, a partial block down the
		// intermediate rows.
		"h96-i48": {Family: "deepseek_v41", Layers: 2, Hidden: 96, Intermediate: 64,
			Experts: 6, TopK: 2, Vocab: 64, Seed: 5201},
		// Twelve experts, top-3, another routed scaling factor.
		"h64-i96": {Family: "deepseek_v41", Layers: 3, Hidden: 64, Intermediate: 96,
			Experts: 12, TopK: 3, RoutedScalingFactor: 2, Vocab: 64, Seed: 5202},
	}
}

func TestDSV41ConversionsValidate(t *testing.T) {
	specsPass(t, dsv41Specs(), threeLayouts, nil, quantContract{weightfmt.QuantMXFP4, "I8", "F8_E8M0", []int64{1, 32}}, func(o convert.Options, c *layout.Contract) {
		if c.Family != "deepseek_v41_text" || c.SharedQuantization != weightfmt.QuantFP8Block || c.SharedScaleDType != "F8_E8M0" ||
			c.SharedNaming != weightfmt.NamingDeepSeek || !slices.Equal(c.SharedWeightBlockSize, []int64{32, 32}) {
			t.Errorf("%+v: contract family %q shared %q scale %q naming %q block %v, want deepseek_v41_text, FP8 blocks under F8_E8M0 x.scale (deepseek), [32 32]",
				o, c.Family, c.SharedQuantization, c.SharedScaleDType, c.SharedNaming, c.SharedWeightBlockSize)
		}
	})
	// --dtype dequantises the FP4 experts and every FP8 32x32 weight, each
	// by its own format, and fuse-shared then fuses the shared expert.
	dq := []convert.Options{{Layout: layout.Stacked, DType: safetensors.BF16}, {Layout: layout.GateUp, DType: safetensors.F32},
		{Layout: layout.Stacked, DType: safetensors.BF16, FuseShared: true, Replicas: 1}}
	for name := range dsv41Specs() {
		t.Run(name+"/dtype", func(t *testing.T) {
			conversionsPass(t, synthFrom(t, dsv41Specs(), name), DeviceCPU, dq, func(o convert.Options, c *layout.Contract) {
				if c.Dequantized == nil || len(c.SharedWeightBlockSize) != 0 || c.SharedQuantization != "" {
					t.Errorf("%+v: dequantized %v, shared %q block %v: want a dequantised record and no shared format apart", o, c.Dequantized, c.SharedQuantization, c.SharedWeightBlockSize)
				}
			})
		})
	}
}

// dsv41SharedMutations change DST's FP8 32x32 shared expert: its own
// block's scale, and one code's sign.
func dsv41SharedMutations() []dstMutation {
	return []dstMutation{
		{"shared expert 32x32 E8M0 block scale doubled", "h96-i48", convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "layers.1.ffn.shared_experts.w2.scale", func(raw []byte, _ []int64) { raw[2]++ })
		}},
		{"shared expert FP8 code's sign flipped", "h64-i96", convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "layers.2.ffn.shared_experts.w1.weight", func(raw []byte, _ []int64) {
				for i := 40; ; i++ {
					if raw[i]&0x7f != 0 {
						raw[i] ^= 0x80
						return
					}
				}
			})
		}},
	}
}

func TestDSV41MutationsFail(t *testing.T) {
	muts := append(mxfp4Mutations("layers.1.ffn", dsv4FP4, "h96-i48", "h64-i96"), dsv41SharedMutations()...)
	mutationsFail(t, dsv41Specs(), muts, DeviceCPU, []BytesMode{BytesOff, BytesAuto})
	// An attention weight's 32x32 scale no layer runs: the byte proof alone.
	mutationsFail(t, dsv41Specs(), []dstMutation{
		{"an attention 32x32 FP8 scale changed", "h64-i96", convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "layers.2.attn.wkv.scale", func(raw []byte, _ []int64) { raw[1]-- })
		}},
	}, DeviceCPU, []BytesMode{BytesAuto})
}

// TestDSV41Refusals: what the two sources do not describe alike is refused
// in one line naming the key; so is V4.1's precision under V4's config and
// the reverse.
func TestDSV41Refusals(t *testing.T) {
	text := func(edit func(tc map[string]any)) func(c map[string]any) {
		return func(c map[string]any) { edit(c["text_config"].(map[string]any)) }
	}
	quant := func(edit func(q map[string]any)) func(c map[string]any) {
		return func(c map[string]any) { edit(c["quantization_config"].(map[string]any)) }
	}
	refusalsHold(t, dsv41Specs(), []refusal{
		{"a router temperature", "h96-i48", text(func(tc map[string]any) { tc["gate_temp"] = 0.7 }), nil, false,
			"config.json: text_config: gate_temp: 0.7: a router temperature other than 1 is described by one engine only"},
		{"expert groups", "h64-i96", text(func(tc map[string]any) { tc["n_group"] = 4 }), nil, false,
			"config.json: text_config: n_group: 4: DeepSeek-V4.1 routes over all experts in one group"},
		{"hash-routed layers", "h96-i48", text(func(tc map[string]any) { tc["num_hash_layers"] = 1 }), nil, false,
			"config.json: text_config: num_hash_layers: 1: DeepSeek-V4.1 has no hash-routed layers"},
		{"128x128 blocks under V4.1", "h96-i48", quant(func(q map[string]any) { q["weight_block_size"] = []any{128, 128} }), nil, false,
			"fp4 beside FP8 128x128 blocks under model_type deepseek_v41: DeepSeek-V4.1 ships its FP8 weights in [32, 32] blocks"},
		{"fuse-shared beside the FP8 shared expert", "h64-i96", nil, nil, true,
			"routed experts MXFP4 (mxfp4, F8_E8M0 scales), shared expert F8_E4M3: fusing would requantise the shared expert"},
	})
	refusalsHold(t, dsv4OfficialSpecs(), []refusal{
		{"32x32 blocks under V4", "h64-i64", func(c map[string]any) {
			c["quantization_config"].(map[string]any)["weight_block_size"] = []any{32, 32}
		}, nil, false, "fp4 beside FP8 in 32x32 blocks under model_type deepseek_v4: DeepSeek-V4 ships 128x128 blocks"},
	})
}

// TestDSV41GPURefused: the GPU's FP8 kernels take 128x128 blocks, so V4.1's
// 32x32 shared expert is refused under --device cuda in one line naming the
// block, and --device auto runs the CPU. No GPU needed.
func TestDSV41GPURefused(t *testing.T) {
	src := synthFrom(t, dsv41Specs(), "h96-i48")
	dst := convertInto(t, src, convert.Options{Layout: layout.Stacked})
	cudaRefused(t, src, dst, PrecisionBF16,
		"the shared expert is stored as fp8_block_128x128 in 32x32 blocks (F8_E8M0 scales) beside mxfp4 routed experts; the GPU's FP8 kernels take 128x128 blocks only",
		"running on the CPU")
}
