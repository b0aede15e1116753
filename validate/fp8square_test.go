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

// FP8 in square blocks other than DeepSeek's 128 (weight_block_size
// [32, 32], scale_fmt ue8m0, as DeepSeek-V4.1 describes its FP8 weights;
// transformers' F32 weight_scale_inv per block): every layout, both
// orientations, fuse-shared (two shared experts split at a whole block)
// and --dtype pass validate on the CPU with the byte proof, the contract
// saying [32, 32]; a flipped element and a changed block scale fail it.

func TestFP8SquareBlocksValidate(t *testing.T) {
	src := synthFrom(t, fp8SquareSpecs(), "b32-h80-i64")
	runs := append(slices.Clone(threeLayouts),
		convert.Options{Layout: layout.GateUp, Orientation: layout.InOut},
		convert.Options{Layout: layout.Stacked, TP: 2, FuseShared: true},
		convert.Options{Layout: layout.UpGate, TP: 1, FuseShared: true, Orientation: layout.InOut})
	conversionsPass(t, src, DeviceCPU, runs, func(o convert.Options, c *layout.Contract) {
		quantContract{weightfmt.QuantFP8Block, "F8_E4M3", "", []int64{32, 32}}.check(t, o, c)
		if c.RoutedScalingFactorFolded {
			t.Errorf("%+v: rsf folded into UE8M0 scales", o)
		}
	})
	conversionsPass(t, src, DeviceCPU, []convert.Options{{Layout: layout.GateUp, DType: safetensors.BF16}}, func(o convert.Options, c *layout.Contract) {
		if c.Quantization != weightfmt.QuantNone || c.Dequantized == nil {
			t.Errorf("%+v: quantization %q dequantized %+v", o, c.Quantization, c.Dequantized)
		}
	})
	// 64x64 blocks with F32 scales (no scale_fmt).
	conversionsPass(t, synthFrom(t, fp8SquareSpecs(), "b64-h128-i96"), DeviceCPU, threeLayouts, func(o convert.Options, c *layout.Contract) {
		quantContract{weightfmt.QuantFP8Block, "F8_E4M3", "", []int64{64, 64}}.check(t, o, c)
	})
}

// TestFP8SquareBlocksMutationsFail: one flipped element of one expert and
// one changed block scale fail validate, the layer checks alone and the
// whole run.
func TestFP8SquareBlocksMutationsFail(t *testing.T) {
	mutationsFail(t, fp8SquareSpecs(), fp8SquareMutations(), DeviceCPU, []BytesMode{BytesOff, BytesAuto})
}

// fp8SquareMutations: one flipped element of one expert's 32x32 FP8 down
// projection and one block scale quadrupled.
func fp8SquareMutations() []dstMutation {
	const prefix = "model.layers.1.mlp"
	f := weightfmt.FP8Block(32, 32, false)
	big := func(b byte) bool { return b&0x78 >= 0x50 && b&0x7f != 0x7f }
	return []dstMutation{
		{"one flipped element in one expert", "b32-h80-i64", convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.Stacked, prefix, f).Weight(layout.ProjDown), func(raw []byte, shape []int64) {
				e := slice(raw, shape, 4)
				e[mxByte(t, e, 70, big)] ^= 0x80
			})
		}},
		{"a block scale quadrupled", "b32-h80-i64", convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.GateUp, prefix, f).Get(layout.ProjGateUp, layout.RoleScale), func(raw []byte, shape []int64) {
				e := slice(raw, shape, 6)
				e[3*4+3]++ // the high byte of entry 3 (F32): exponent + 2, four times the scale
			})
		}},
	}
}

// TestGPUFP8SquareBlocks: on the GPU, which decodes FP8 in blocks other
// than 128x128 to bf16 on the device (kernels.DequantFP8Blocks), every
// out-in conversion of the 32x32 (ragged) and 64x64 checkpoints passes
// validate --device cuda, fuse-shared included; each mutation fails the
// whole run, and the layer checks alone run and log them.
func TestGPUFP8SquareBlocks(t *testing.T) {
	gpuDecodedPass(t, fp8SquareSpecs(), func(fixtures.SynthSpec) []convert.Options {
		return append(slices.Clone(threeLayouts), convert.Options{Layout: layout.Stacked, TP: 2, FuseShared: true})
	}, fp8SquareMutations())
}
