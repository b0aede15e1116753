package validate

import (
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// DeepSeek-V4 in its official repo layout (issue 29): layers.L.ffn with no
// "model." prefix, FP4 routed experts (x.weight I8, x.scale F8_E8M0 per
// 32), the shared expert FP8 128x128 under DeepSeek's x.scale (F8_E8M0),
// hyper-connection, compressor and indexer tensors beside them: every
// layout converts and passes validate on the CPU, the contract records the
// shared expert's names, every mutation of DST fails validate, and the
// carried tensors are proven byte for byte.

func TestDSV4OfficialConversionsValidate(t *testing.T) {
	specsPass(t, dsv4OfficialSpecs(), threeLayouts, nil, quantContract{weightfmt.QuantMXFP4, "I8", "F8_E8M0", []int64{1, 32}}, func(o convert.Options, c *layout.Contract) {
		if c.Naming != weightfmt.NamingDeepSeek || c.SharedQuantization != weightfmt.QuantFP8Block || c.SharedWeightDType != "F8_E4M3" ||
			c.SharedScaleDType != "F8_E8M0" || c.SharedNaming != weightfmt.NamingDeepSeek || c.RoutedScalingFactorFolded {
			t.Errorf("%+v: contract naming %q shared %q %q scale %q %q folded %v, want deepseek, FP8 blocks F8_E4M3 under F8_E8M0 x.scale (deepseek), not folded",
				o, c.Naming, c.SharedQuantization, c.SharedWeightDType, c.SharedScaleDType, c.SharedNaming, c.RoutedScalingFactorFolded)
		}
		for i, l := range c.Layers {
			if want := "layers." + string(rune('0'+l.Index)) + ".ffn"; l.Prefix != want || l.Index != i {
				t.Errorf("%+v: layer %d prefix %q, want %q", o, i, l.Prefix, want)
			}
		}
	})
	specsPass(t, dsv4OfficialBF16Specs(), threeLayouts, fuseTwice, quantContract{weightfmt.QuantNone, "BF16", "", nil}, func(o convert.Options, c *layout.Contract) {
		if c.SharedQuantization != "" || c.SharedNaming != "" || !strings.HasPrefix(c.Layers[0].Prefix, "layers.") {
			t.Errorf("%+v: shared %q naming %q prefix %q, want none, none, layers.", o, c.SharedQuantization, c.SharedNaming, c.Layers[0].Prefix)
		}
	})
}

// dsv4OfficialSharedMutations change the FP8 shared expert DST carries
// under DeepSeek's names: the layer checks and the byte proof catch them.
func dsv4OfficialSharedMutations() []dstMutation {
	return officialSharedMutations(sharedFP8Edit{"h64-i64", "layers.1.ffn.shared_experts.w1.scale", 0},
		sharedFP8Edit{"h32-i96", "layers.1.ffn.shared_experts.w2.weight", 17})
}

// sharedFP8Edit is where a mutation of an FP8 shared expert under
// DeepSeek's names strikes: a fixture, a tensor of it, a byte offset.
type sharedFP8Edit struct {
	fixture, tensor string
	at              int
}

// officialSharedMutations double one E8M0 block scale (scale, stacked
// output) and flip the sign of the first nonzero FP8 code from code.at
// (code, gate-up output) of the FP8 shared expert DST carries.
func officialSharedMutations(scale, code sharedFP8Edit) []dstMutation {
	return []dstMutation{
		{"shared expert E8M0 block scale doubled", scale.fixture, convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, scale.tensor, func(raw []byte, _ []int64) { raw[scale.at]++ })
		}},
		{"shared expert FP8 code's sign flipped", code.fixture, convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, code.tensor, func(raw []byte, _ []int64) {
				for i := code.at; ; i++ {
					if raw[i]&0x7f != 0 {
						raw[i] ^= 0x80
						return
					}
				}
			})
		}},
	}
}

func TestDSV4OfficialMutationsFail(t *testing.T) {
	muts := append(mxfp4Mutations("layers.1.ffn", dsv4FP4, "h64-i64", "h32-i96"), dsv4OfficialSharedMutations()...)
	mutationsFail(t, dsv4OfficialSpecs(), muts, DeviceCPU, []BytesMode{BytesOff, BytesAuto})
	// Tensors outside the MoE layers no layer runs: the byte proof alone.
	mutationsFail(t, dsv4OfficialSpecs(), []dstMutation{
		{"a hyper-connection mixer value changed", "h64-i64", convert.Options{Layout: layout.UpGate}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "layers.0.hc_ffn_fn", func(raw []byte, _ []int64) { raw[5] ^= 0x10 })
		}},
		{"an attention FP8 scale changed", "h32-i96", convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "layers.2.attn.wkv.scale", func(raw []byte, _ []int64) { raw[0]-- })
		}},
	}, DeviceCPU, []BytesMode{BytesAuto})
}

// TestDSV4OfficialRefusals: what moeprep cannot carry of the official
// layout is refused with one line naming the reason.
func TestDSV4OfficialRefusals(t *testing.T) {
	refusalsHold(t, dsv4OfficialSpecs(), []refusal{
		{"fuse-shared beside an FP8 shared expert", "h64-i64", nil, nil, true,
			"routed experts MXFP4 (mxfp4, F8_E8M0 scales), shared expert F8_E4M3: fusing would requantise the shared expert"},
		{"a shared expert x.scale of a dtype no producer writes", "h64-i64", nil, func(t *testing.T, src string) {
			for _, p := range []string{"w1", "w2", "w3"} {
				editTensor(t, src, "layers.0.ffn.shared_experts."+p+".scale", func(e *safetensors.Entry, _ []byte) { e.DType = safetensors.I8 })
			}
		}, false, "FP8 128x128 scale dtype I8: want F32 (weight_scale_inv), or F8_E8M0 or U8 under DeepSeek's x.scale"},
		{"a shared expert scale missing", "h32-i96", nil, func(t *testing.T, src string) {
			const w3 = "layers.1.ffn.shared_experts.w3"
			renameTensor(t, src, w3+".scale", w3+".scales")
		}, false, "missing tensor layers.1.ffn.shared_experts.w3.scale"},
	})
}

// DeepSeek-V4.1 as its release stores it (issue 44, item 3): the composite
// config (text_config deepseek_v41_text, quantization_config at the top
// with expert_dtype fp4 and weight_block_size [32, 32]), DeepSeek's names,
// FP4 routed experts beside FP8 in 32x32 blocks under x.scale F8_E8M0,
// the shared expert's included. (MXFP4 needs hidden and intermediate
// sizes in whole 32s, so every 32x32 block of these is whole.)

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

// dsv41Mutations change one FP4 expert of V4.1's DST (mxfp4Mutations) and
// its FP8 32x32 shared expert: its own block's scale, one code's sign.
func dsv41Mutations() []dstMutation {
	return append(mxfp4Mutations("layers.1.ffn", dsv4FP4, "h96-i64", "h64-i96"),
		officialSharedMutations(sharedFP8Edit{"h96-i64", "layers.1.ffn.shared_experts.w2.scale", 2},
			sharedFP8Edit{"h64-i96", "layers.2.ffn.shared_experts.w1.weight", 40})...)
}

func TestDSV41MutationsFail(t *testing.T) {
	mutationsFail(t, dsv41Specs(), dsv41Mutations(), DeviceCPU, []BytesMode{BytesOff, BytesAuto})
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
		{"a router temperature", "h96-i64", text(func(tc map[string]any) { tc["gate_temp"] = 0.7 }), nil, false,
			"config.json: text_config: gate_temp: 0.7: a router temperature other than 1 is described by one engine only"},
		{"expert groups", "h64-i96", text(func(tc map[string]any) { tc["n_group"] = 4 }), nil, false,
			"config.json: text_config: n_group: 4: DeepSeek-V4.1 routes over all experts in one group"},
		{"hash-routed layers", "h96-i64", text(func(tc map[string]any) { tc["num_hash_layers"] = 1 }), nil, false,
			"config.json: text_config: num_hash_layers: 1: DeepSeek-V4.1 has no hash-routed layers"},
		{"128x128 blocks under V4.1", "h96-i64", quant(func(q map[string]any) { q["weight_block_size"] = []any{128, 128} }), nil, false,
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

// TestDSV41OnGPU: the GPU decodes V4.1's 32x32 FP8 shared expert to bf16
// on the device (kernels.DequantFP8Blocks) beside its FP4 routed experts,
// so --device cuda takes it at the bf16 precision and refuses f32 and fp8
// in one line, as for every format it decodes. No GPU needed.
func TestDSV41OnGPU(t *testing.T) {
	src := synthFrom(t, dsv41Specs(), "h96-i64")
	dst := convertInto(t, src, convert.Options{Layout: layout.Stacked})
	bf16OnlyOnGPU(t, src, dst, "MXFP4 expert weights (quantization mxfp4, F8_E8M0 scales)")
}

// TestGPUDSV41: on the GPU, every out-in conversion of V4.1 passes validate
// --device cuda (FP4 routed experts and the 32x32 FP8 shared expert both
// decoded on the device), and each mutation of TestDSV41MutationsFail
// fails the whole run; the layer checks alone run and log them.
func TestGPUDSV41(t *testing.T) {
	gpuDecodedPass(t, dsv41Specs(), layoutsOnly, dsv41Mutations())
}
