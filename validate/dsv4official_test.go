package validate

import (
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
	return []dstMutation{
		{"shared expert E8M0 block scale doubled", "h64-i64", convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "layers.1.ffn.shared_experts.w1.scale", func(raw []byte, _ []int64) { raw[0]++ })
		}},
		{"shared expert FP8 code's sign flipped", "h32-i96", convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "layers.1.ffn.shared_experts.w2.weight", func(raw []byte, _ []int64) {
				for i := 17; ; i++ {
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
