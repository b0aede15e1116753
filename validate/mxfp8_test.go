package validate

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// MXFP8 checkpoints as ModelOpt exports them (x.weight_scale) and as
// MiniMax-M3-MXFP8 writes them (quant_method mxfp8, x.weight_scale_inv),
// at sizes and seeds the small-*-mxfp8 presets do not use: every layout,
// both orientations (one byte an element: the transpose is exact),
// fuse-shared, --dtype and a BF16 shared expert requantised by ModelOpt's
// rule pass validate on the CPU with the byte proof; one flipped element
// of one expert and one changed scale byte fail it.

// mxfp8Runs: each layout, both orientations, one prepared for --tp 2.
var mxfp8Runs = append(slices.Clone(threeLayouts),
	convert.Options{Layout: layout.Stacked, Orientation: layout.InOut},
	convert.Options{Layout: layout.GateUp, Orientation: layout.InOut, TP: 2})

func TestMXFP8ConversionsValidate(t *testing.T) {
	specs := mxfp8Specs()
	for _, name := range []string{"modelopt-h96-i64", "minimax-h32-i96"} {
		t.Run(name, func(t *testing.T) {
			src := synthFrom(t, specs, name)
			runs := mxfp8Runs
			if specs[name].SharedExperts > 0 {
				runs = append(slices.Clone(runs), convert.Options{Layout: layout.GateUp, TP: 2, FuseShared: true},
					convert.Options{Layout: layout.Stacked, TP: 1, FuseShared: true, Orientation: layout.InOut})
			}
			naming := ""
			if specs[name].DType == fixtures.DTypeMXFP8MiniMax {
				naming = weightfmt.NamingMiniMax
			}
			conversionsPass(t, src, DeviceCPU, runs, func(o convert.Options, c *layout.Contract) {
				quantContract{weightfmt.QuantMXFP8, "F8_E4M3", "", []int64{1, 32}}.check(t, o, c)
				if c.Naming != naming {
					t.Errorf("%+v: naming %q, want %q", o, c.Naming, naming)
				}
				if c.RoutedScalingFactorFolded {
					t.Errorf("%+v: rsf folded into E8M0 scales", o)
				}
			})
		})
	}
}

// TestMXFP8HFQuantConfigAlone: ModelOpt's MXFP8 described by
// hf_quant_config.json alone (config.json without quantization_config)
// is read as the same format, and a config.json saying FP8 blocks beside
// it is refused naming both files.
func TestMXFP8HFQuantConfigAlone(t *testing.T) {
	src := synthFrom(t, mxfp8Specs(), "modelopt-h96-i64")
	testkit.EditJSON(t, filepath.Join(src, "config.json"), func(c map[string]any) { delete(c, "quantization_config") })
	conversionsPass(t, src, DeviceCPU, []convert.Options{{Layout: layout.GateUp}, {Layout: layout.Stacked, TP: 2, FuseShared: true}},
		func(o convert.Options, c *layout.Contract) {
			quantContract{weightfmt.QuantMXFP8, "F8_E4M3", "", []int64{1, 32}}.check(t, o, c)
		})
	testkit.EditJSON(t, filepath.Join(src, "config.json"), func(c map[string]any) {
		c["quantization_config"] = map[string]any{"quant_method": "fp8", "weight_block_size": []any{128, 128}}
	})
	convertRefused(t, src, convert.Options{Layout: layout.Stacked}, "the two files describe the weights differently")
}

// TestMXFP8DequantisedValidate: --dtype bf16, f16 and f32 dequantise every
// MXFP8 weight (attention and dense MLPs too) and pass validate, the byte
// proof holding each value to one rounding of the exact decode.
func TestMXFP8DequantisedValidate(t *testing.T) {
	src := synthFrom(t, mxfp8Specs(), "modelopt-h96-i64")
	var runs []convert.Options
	for _, d := range []safetensors.DType{safetensors.BF16, safetensors.F16, safetensors.F32} {
		runs = append(runs, convert.Options{Layout: layout.GateUp, DType: d})
	}
	runs = append(runs, convert.Options{Layout: layout.Stacked, TP: 2, FuseShared: true, DType: safetensors.BF16})
	conversionsPass(t, src, DeviceCPU, runs, func(o convert.Options, c *layout.Contract) {
		if c.Quantization != weightfmt.QuantNone || c.Dequantized == nil || c.Dequantized.DType != string(o.DType) {
			t.Errorf("%+v: quantization %q dequantized %+v", o, c.Quantization, c.Dequantized)
		}
	})
}

// TestMXFP8RequantSharedValidates: a BF16 shared expert beside MXFP8
// routed experts (either producer's exclusion list) fuses only
// requantised, by ModelOpt's rule, which the contract records and validate
// checks exactly and measures; convert leaves it BF16 and says so.
func TestMXFP8RequantSharedValidates(t *testing.T) {
	record := layout.Requantization{SourceDType: "BF16", Quantization: weightfmt.QuantMXFP8, Rule: "mxfp8-e8m0",
		ScaleDivisor: 448, MinScale: 0x1p-127, ScalePowerOfTwo: true, CodeRange: [2]float64{-448, 448}, Rounding: "nearest-even"}
	// requantRuns without --fold-scaling down, which E8M0 scales refuse.
	var runs []convert.Options
	for _, o := range requantRuns() {
		if o.FoldScaling == layout.FoldDown {
			o.FoldScaling = ""
		}
		runs = append(runs, o)
	}
	for _, name := range []string{"minimax-shared-bf16", "modelopt-shared-bf16"} {
		t.Run(name, func(t *testing.T) {
			src := synthFrom(t, mxfp8Specs(), name)
			reps := conversionsPass(t, src, DeviceCPU, runs, func(o convert.Options, c *layout.Contract) {
				quantContract{weightfmt.QuantMXFP8, "F8_E4M3", "", []int64{1, 32}}.check(t, o, c)
				if c.SharedRequantized == nil || *c.SharedRequantized != record {
					t.Errorf("%+v: shared_requantized %+v, want %+v", o, c.SharedRequantized, record)
				}
			})
			for i, rep := range reps {
				checkRequantRows(t, runs[i], weightfmt.QuantMXFP8, rep)
			}
			conversionsPass(t, src, DeviceCPU, []convert.Options{{Layout: layout.GateUp}}, func(o convert.Options, c *layout.Contract) {
				if c.SharedQuantization != "none" || c.SharedWeightDType != "BF16" || c.SharedRequantized != nil {
					t.Errorf("convert: shared_quantization %q shared_weight_dtype %q shared_requantized %+v", c.SharedQuantization, c.SharedWeightDType, c.SharedRequantized)
				}
			})
		})
	}
}

// TestMXFP8MutationsFail: one flipped element (an E4M3 sign) of one
// expert, one scale byte changed, three rows' scales 32 times larger and
// two scale entries of a row swapped each fail validate: the layer checks alone (--skip-bytes) and the whole
// run.
func TestMXFP8MutationsFail(t *testing.T) {
	mutationsFail(t, mxfp8Specs(), mxfp8Mutations(), DeviceCPU, []BytesMode{BytesOff, BytesAuto})
}

func mxfp8Mutations() []dstMutation {
	const prefix = "model.layers.1.mlp"
	mo := weightfmt.MXFP8(weightfmt.NamingModelOpt, safetensors.U8)
	big := func(b byte) bool { return b&0x78 >= 0x50 && b&0x7f != 0x7f } // |e4m3| >= 4, not NaN
	return []dstMutation{
		{"one flipped element in one expert", "modelopt-h96-i64", convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.Stacked, prefix, mo)
			rewriteTensor(t, dst, n.Weight(layout.ProjDown), func(raw []byte, shape []int64) {
				e := slice(raw, shape, 5)
				e[mxByte(t, e, 40, big)] ^= 0x80
			})
		}},
		{"a scale byte changed", "modelopt-h96-i64", convert.Options{Layout: layout.GateUp, TP: 2}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.GateUp, prefix, mo)
			rewriteTensor(t, dst, n.Get(layout.ProjGateUp, layout.RoleScale), func(raw []byte, shape []int64) {
				e := slice(raw, shape, 7)
				e[4] += 2 // four times the scale: one group of one row
			})
		}},
		{"a scale 32 times larger", "modelopt-h96-i64", convert.Options{Layout: layout.Stacked, TP: 2}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.Stacked, prefix, mo)
			rewriteTensor(t, dst, n.Get(layout.ProjDown, layout.RoleScale), func(raw []byte, shape []int64) {
				e := slice(raw, shape, 3)
				for i := range 6 { // the first three rows' groups: 2^5 each
					e[i] += 5
				}
			})
		}},
		{"two scale entries swapped", "modelopt-h96-i64", convert.Options{Layout: layout.UpGate}, func(t *testing.T, dst string) {
			n := layout.NamesFor(layout.UpGate, prefix, mo)
			rewriteTensor(t, dst, n.Get(layout.ProjGateUp, layout.RoleScale), func(raw []byte, shape []int64) {
				swapRowScales(slice(raw, shape, 2), int(shape[2]), 3)
			})
		}},
	}
}

// TestMXFP8Refusals: what moeprep cannot carry of MXFP8 is refused with one
// line naming the reason.
func TestMXFP8Refusals(t *testing.T) {
	qc := func(c map[string]any) map[string]any { return c["quantization_config"].(map[string]any) }
	refusalsHold(t, mxfp8Specs(), []refusal{
		{"mxfp8 in 32x32 blocks", "minimax-h32-i96", func(c map[string]any) { qc(c)["weight_block_size"] = []any{32, 32} }, nil, false,
			"weight_block_size: [32 32] is not supported with quant_method mxfp8"},
		{"static activations", "minimax-h32-i96", func(c map[string]any) { qc(c)["activation_scheme"] = "static" }, nil, false,
			`activation_scheme: "static" is not supported`},
		{"routed experts ignored", "minimax-h32-i96", func(c map[string]any) {
			qc(c)["ignored_layers"] = []any{"lm_head", "re:.*experts.*"}
		}, nil, false, "the routed experts are left unquantised by the ignore list"},
		{"ModelOpt group 16", "modelopt-h96-i64", func(c map[string]any) { qc(c)["group_size"] = 16 }, nil, false,
			"modelopt mxfp8 (group 16)"},
		{"MiniMax names under ModelOpt's description", "minimax-h32-i96", func(c map[string]any) {
			c["quantization_config"] = map[string]any{"quant_method": "modelopt", "quant_algo": "MXFP8"}
		}, nil, false, "weight_scale"},
	})
}

// TestMXFP8ElementDecodes: an element of DST decodes to its E4M3 value
// times 2^(e-127) of its group's scale byte, the group along the row.
func TestMXFP8ElementDecodes(t *testing.T) {
	src := synthFrom(t, mxfp8Specs(), "modelopt-h96-i64")
	dst := convertInto(t, src, convert.Options{Layout: layout.Stacked})
	mo := weightfmt.MXFP8(weightfmt.NamingModelOpt, safetensors.U8)
	n := layout.NamesFor(layout.Stacked, "model.layers.1.mlp", mo)
	w, s := readTensor(t, dst, n.Weight(layout.ProjGate)), readTensor(t, dst, n.Get(layout.ProjGate, layout.RoleScale))
	const h = 96
	got := make([]float32, h)
	if err := mo.Dequantise(w[:h], 1, h, s[:h/32], got); err != nil {
		t.Fatal(err)
	}
	for _, c := range []int{0, 31, 32, 95} {
		if want := numfmt.E4M3ToF32(w[c]) * numfmt.E8M0ToF32(s[c/32]); got[c] != want {
			t.Errorf("element %d = %v, want e4m3 * 2^(e-127) = %v", c, got[c], want)
		}
	}
}

// TestGPUMXFP8: on the GPU, which decodes MXFP8 to bf16 on the device
// (kernels.DequantMXFP8Rows), every out-in conversion passes validate
// --device cuda, and every mutation fails the whole run; the layer checks
// alone must catch three rows of one expert's down projection 32 times
// too large (one flipped element, one group's scale quadrupled or two
// swapped move these fixtures' output by 0.2x to 0.7x of gpu-bf16's 2e-2
// on the CPU's measure, and are logged).
func TestGPUMXFP8(t *testing.T) {
	gpuDecodedPass(t, map[string]fixtures.SynthSpec{"modelopt-h96-i64": mxfp8Specs()["modelopt-h96-i64"]}, layoutsOnly, mxfp8Mutations(), "a scale 32 times larger")
}

// TestNVFP4WithMXFP8DenseValidates: ModelOpt MIXED_PRECISION with NVFP4
// routed and shared experts beside MXFP8 attention and dense MLPs converts
// (the MXFP8 weights copied as they are) and, with --dtype, dequantises
// each weight by its own format, the contract naming both: every run
// passes validate on the CPU with the byte proof.
func TestNVFP4WithMXFP8DenseValidates(t *testing.T) {
	specs := map[string]fixtures.SynthSpec{"nvfp4-mxfp8": {Family: "deepseek_v3", Layers: 3, DenseLayers: 1, Hidden: 64, Intermediate: 32,
		Experts: 12, SharedExperts: 1, TopK: 3, NGroup: 2, TopKGroup: 1, RoutedScalingFactor: 2.5,
		DType: fixtures.DTypeNVFP4MXFP8, Vocab: 64, Seed: 5005, BiasLike: "deepseek"}}
	src := synthFrom(t, specs, "nvfp4-mxfp8")
	conversionsPass(t, src, DeviceCPU, []convert.Options{{Layout: layout.GateUp}, {Layout: layout.Stacked, TP: 2, FuseShared: true}},
		func(o convert.Options, c *layout.Contract) {
			quantContract{weightfmt.QuantNVFP4ModelOpt, "U8", "", []int64{1, 16}}.check(t, o, c)
		})
	conversionsPass(t, src, DeviceCPU, []convert.Options{{Layout: layout.UpGate, DType: safetensors.BF16}, {Layout: layout.Stacked, TP: 2, FuseShared: true, DType: safetensors.F32}},
		func(o convert.Options, c *layout.Contract) {
			if c.Dequantized == nil {
				t.Fatalf("%+v: no dequantized record", o)
			}
			var mx int
			for _, g := range c.Dequantized.Groups {
				if g.Group == "other" && g.Quantization == weightfmt.QuantMXFP8 {
					mx = g.Tensors
				}
			}
			if mx == 0 {
				t.Errorf("%+v: dequantized groups %+v name no MXFP8 weights", o, c.Dequantized.Groups)
			}
		})
}
