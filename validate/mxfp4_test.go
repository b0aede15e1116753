package validate

import (
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// gpt-oss's MXFP4 checkpoints (issue 29: openai/gpt-oss-20b's layout,
// experts stacked on disk as *_blocks and *_scales, gate and up rows
// interleaved) at sizes and seeds that the small-gpt-oss-mxfp4 preset does
// not use: convert in every layout passes validate on the CPU (exact
// dequantisation on both paths, byte proof), each mutation of DST fails
// it, and what cannot be carried is refused in one line.

var gptOssMXFP4 = weightfmt.MXFP4(weightfmt.NamingGptOss, safetensors.U8, safetensors.U8)

func TestMXFP4ConversionsValidate(t *testing.T) {
	specsPass(t, mxfp4Specs(), threeLayouts, nil, quantContract{weightfmt.QuantMXFP4, "U8", "", []int64{1, 32}}, func(o convert.Options, c *layout.Contract) {
		if c.RoutedScalingFactorFolded {
			t.Errorf("%+v: rsf folded into E8M0 scales", o)
		}
	})
}

// TestMXFP4DeinterleavesExactly: expert e's gate in DST is SRC's even rows
// of gate_up_proj_blocks[e] and their scales, its up the odd ones, byte for
// byte, decoded to what SRC's rows decode to.
func TestMXFP4DeinterleavesExactly(t *testing.T) {
	src := synthFrom(t, mxfp4Specs(), "h96-i64")
	dst := convertInto(t, src, convert.Options{Layout: layout.Stacked})
	const prefix = "model.layers.0.mlp"
	h, i := 96, 64
	sb := readTensor(t, src, prefix+".experts.gate_up_proj_blocks")
	ss := readTensor(t, src, prefix+".experts.gate_up_proj_scales")
	n := layout.NamesFor(layout.Stacked, prefix, gptOssMXFP4)
	gb, ub := readTensor(t, dst, n.Weight(layout.ProjGate)), readTensor(t, dst, n.Weight(layout.ProjUp))
	gs, us := readTensor(t, dst, n.Get(layout.ProjGate, layout.RoleScale)), readTensor(t, dst, n.Get(layout.ProjUp, layout.RoleScale))
	rowB, rowS := h/2, h/32
	for e := 0; e < mxfp4Specs()["h96-i64"].Experts; e++ {
		for r := 0; r < i; r++ {
			for half, dstB := range [][]byte{gb, ub} {
				dstS := [][]byte{gs, us}[half]
				sr := e*2*i + 2*r + half
				dr := e*i + r
				if string(sb[sr*rowB:(sr+1)*rowB]) != string(dstB[dr*rowB:(dr+1)*rowB]) ||
					string(ss[sr*rowS:(sr+1)*rowS]) != string(dstS[dr*rowS:(dr+1)*rowS]) {
					t.Fatalf("expert %d row %d half %d: bytes differ from SRC's interleaved row %d", e, r, half, 2*r+half)
				}
			}
		}
	}
	// The decode: element 1 of a row is the high nibble of its first byte.
	w := make([]float32, h)
	if err := gptOssMXFP4.Dequantise(gb[:rowB], 1, h, gs[:rowS], w); err != nil {
		t.Fatal(err)
	}
	want := numfmt.E2M1ToF32(gb[0]>>4) * numfmt.E8M0ToF32(gs[0])
	if w[1] != want {
		t.Fatalf("element 1 = %v, want e2m1(high nibble) * 2^(e-127) = %v", w[1], want)
	}
}

// mxByte finds, from byte at of buf on, one byte for which pick holds.
func mxByte(t *testing.T, buf []byte, at int, pick func(b byte) bool) int {
	t.Helper()
	for j := at; j < len(buf); j++ {
		if pick(buf[j]) {
			return j
		}
	}
	t.Fatal("no byte to mutate")
	return 0
}

// TestMXFP4MutationsFail: one flipped nibble in one expert, two scale
// entries of a row swapped, the two nibbles of one byte swapped (nibble
// order) and one scale byte changed each fail validate: the layer checks
// alone (--skip-bytes) and the whole run.
func TestMXFP4MutationsFail(t *testing.T) {
	mutationsFail(t, mxfp4Specs(), mxfp4Mutations("model.layers.1.mlp", gptOssMXFP4, "h96-i64", "h32-i128"), DeviceCPU, []BytesMode{BytesOff, BytesAuto})
}

// mxfp4Mutations are the corruptions of conversions of two fixtures whose
// MoE module at prefix holds MXFP4 experts in format f: wide, with at
// least two scale groups a gate row, and with at least 12 experts.
func mxfp4Mutations(prefix string, f weightfmt.Format, wide, many string) []dstMutation {
	nz := func(n byte) bool { return n&7 != 0 } // a nonzero E2M1 magnitude
	return []dstMutation{
		{"one flipped nibble in one expert", wide, convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.Stacked, prefix, f)
			rewriteTensor(t, dst, n.Weight(layout.ProjDown), func(raw []byte, shape []int64) {
				e := slice(raw, shape, 4)
				j := mxByte(t, e, 40, func(b byte) bool { return nz(b >> 4) })
				e[j] ^= 0x80 // the high nibble's sign
			})
		}},
		{"two scale entries swapped", wide, convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.GateUp, prefix, f)
			rewriteTensor(t, dst, n.Get(layout.ProjGateUp, layout.RoleScale), func(raw []byte, shape []int64) {
				swapRowScales(slice(raw, shape, 2), int(shape[2]), 7)
			})
		}},
		{"nibble order reversed within one byte", many, convert.Options{Layout: layout.UpGate}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.UpGate, prefix, f)
			rewriteTensor(t, dst, n.Weight(layout.ProjGateUp), func(raw []byte, shape []int64) {
				e := slice(raw, shape, 9)
				j := mxByte(t, e, 5, func(b byte) bool { return numfmt.E2M1ToF32(b&0xF) != numfmt.E2M1ToF32(b>>4) })
				e[j] = e[j]<<4 | e[j]>>4
			})
		}},
		{"a scale byte changed", many, convert.Options{Layout: layout.Stacked, TP: 2}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.Stacked, prefix, f)
			rewriteTensor(t, dst, n.Get(layout.ProjUp, layout.RoleScale), func(raw []byte, shape []int64) {
				e := slice(raw, shape, 11)
				e[3]++ // twice the scale: one group of one row
			})
		}},
	}
}

// TestMXFP4Refusals: what moeprep cannot carry of MXFP4 is refused with one
// line naming the reason.
func TestMXFP4Refusals(t *testing.T) {
	qc := func(c map[string]any) map[string]any { return c["quantization_config"].(map[string]any) }
	// gpt-oss's bf16 experts under an mxfp4 quantization_config.
	specs := mxfp4Specs()
	bf16 := specs["h96-i64"]
	bf16.DType = "bf16"
	specs["bf16"] = bf16
	refusalsHold(t, specs, []refusal{
		{"routed experts left unconverted", "h96-i64", func(c map[string]any) {
			qc(c)["modules_to_not_convert"] = []any{"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.layers.*.mlp.experts", "lm_head"}
		}, nil, false, "the routed experts are left unquantised by modules_to_not_convert"},
		{"compressed-tensors mxfp4-pack-quantized", "h96-i64", func(c map[string]any) {
			c["quantization_config"] = map[string]any{"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
				"config_groups": map[string]any{"group_0": map[string]any{"targets": []any{"Linear"},
					"weights": map[string]any{"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, "symmetric": true}}}}
		}, nil, false, "MXFP4 experts stacked on disk are carried as gpt-oss stores them (quant_method mxfp4, *_blocks and *_scales) only, not gpt_oss's model.layers.0.mlp.experts.gate_up_proj_packed"},
		{"another family", "h96-i64", func(c map[string]any) { c["model_type"] = "mixtral" }, nil, false, "quant_method mxfp4 is carried for gpt-oss"},
		{"bf16 experts under mxfp4", "bf16", func(c map[string]any) {
			c["quantization_config"] = map[string]any{"quant_method": "mxfp4", "modules_to_not_convert": []any{"lm_head"}}
		}, nil, false, "is stored unquantised but config.json's quantization_config says mxfp4"},
	})
}

// TestGPUMXFP4: on the GPU, which decodes MXFP4 to bf16 on the device
// (gpt-oss's interleaved gate and up rows read through the same strided
// views as on the CPU), every conversion of mxfp4Specs passes validate
// --device cuda, and every mutation fails the whole run. The layer checks
// alone must catch two swapped scale entries of a row (two groups of 32
// weights off by their scales' ratio: 3x gpu-bf16's 2e-2 on an H100);
// one nibble, a nibble pair or one doubled group scale moves these
// fixtures' output by 0.1x to 0.9x of it, and is logged.
func TestGPUMXFP4(t *testing.T) {
	gpuDecodedPass(t, mxfp4Specs(), layoutsOnly, mxfp4Mutations("model.layers.1.mlp", gptOssMXFP4, "h96-i64", "h32-i128"), "two scale entries swapped")
}
