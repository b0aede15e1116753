package validate

import (
	"context"
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/byteproof"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/weightfmt"
)

// fuse-shared --requantize-shared (issue 29): a BF16 shared expert beside
// INT4 routed experts is quantised into INT4 by compressed-tensors' rule,
// beside FP8 per-channel or per-tensor ones into E4M3 (amax/448). Every
// conversion passes validate on the CPU: the fused path exact against
// a reference whose shared expert is requantised the same way, the error
// requantisation adds reported against the BF16 shared expert within its
// derived bound, the requantised bytes proven equal to a recomputation from
// SRC; each mutation of a requantised scale or code fails it.

// requantCase is a requantSpecs checkpoint and what its fused contract
// must say: the routed format and the requantisation record.
type requantCase struct {
	fixture string
	format  quantContract
	record  layout.Requantization
}

func requantCases() []requantCase {
	int4 := layout.Requantization{SourceDType: "BF16", Quantization: weightfmt.QuantInt4Pack, Rule: "absmax-int4",
		ScaleDivisor: 7.5, MinScale: 0x1p-23, CodeRange: [2]float64{-8, 7}, Rounding: "nearest-even"}
	e4m3 := func(q string) layout.Requantization {
		return layout.Requantization{SourceDType: "BF16", Quantization: q, Rule: "absmax-e4m3",
			ScaleDivisor: 448, MinScale: 0x1p-23, CodeRange: [2]float64{-448, 448}, Rounding: "nearest-even"}
	}
	return []requantCase{
		{"kimi-g32", quantContract{weightfmt.QuantInt4Pack, "I32", "BF16", []int64{1, 32}}, int4},
		{"deepseek-v3-g16", quantContract{weightfmt.QuantInt4Pack, "I32", "BF16", []int64{1, 16}}, int4},
		{"deepseek-v3-channel", quantContract{weightfmt.QuantFP8Channel, "F8_E4M3", "BF16", nil}, e4m3(weightfmt.QuantFP8Channel)},
		{"kimi-tensor", quantContract{weightfmt.QuantFP8Tensor, "F8_E4M3", "F32", nil}, e4m3(weightfmt.QuantFP8Tensor)},
	}
}

func requantRuns() []convert.Options {
	fuse := func(o convert.Options) convert.Options {
		o.FuseShared, o.RequantizeShared = true, true
		return o
	}
	return []convert.Options{
		fuse(convert.Options{Layout: layout.Stacked, TP: 2}),
		fuse(convert.Options{Layout: layout.GateUp, FoldScaling: layout.FoldDown}),
		fuse(convert.Options{Layout: layout.UpGate, TP: 4, Replicas: 1, FoldScaling: layout.FoldNone}),
	}
}

func TestRequantSharedValidates(t *testing.T) {
	for _, rc := range requantCases() {
		t.Run(rc.fixture, func(t *testing.T) {
			spec := requantSpecs()[rc.fixture]
			src := synthFrom(t, requantSpecs(), rc.fixture)
			reps := conversionsPass(t, src, DeviceCPU, requantRuns(), func(o convert.Options, c *layout.Contract) {
				rc.format.check(t, o, c)
				if c.SharedRequantized == nil || *c.SharedRequantized != rc.record {
					t.Errorf("%+v: shared_requantized %+v, want %+v", o, c.SharedRequantized, rc.record)
				}
				if c.SharedQuantization != "" || c.SharedWeightDType != "" {
					t.Errorf("%+v: fused shared slots recorded as stored apart (%q %q)", o, c.SharedQuantization, c.SharedWeightDType)
				}
				folds := o.FoldScaling == layout.FoldDown || o.FoldScaling == "" && rc.format.scaleDType == "F32"
				if c.RoutedScalingFactorFolded != folds {
					t.Errorf("%+v: routed_scaling_factor_folded %v, want %v", o, c.RoutedScalingFactorFolded, folds)
				}
				if c.NumFusedSharedExperts != c.SharedReplicas*spec.SharedExperts {
					t.Errorf("%+v: %d fused shared experts", o, c.NumFusedSharedExperts)
				}
			})
			for i, rep := range reps {
				checkRequantRows(t, requantRuns()[i], rc.record.Quantization, rep)
			}
			// convert leaves the shared expert as it is, and says so.
			conversionsPass(t, src, DeviceCPU, []convert.Options{{Layout: layout.GateUp}}, func(o convert.Options, c *layout.Contract) {
				if c.SharedQuantization != "none" || c.SharedWeightDType != "BF16" || c.SharedRequantized != nil {
					t.Errorf("convert: shared_quantization %q shared_weight_dtype %q shared_requantized %+v", c.SharedQuantization, c.SharedWeightDType, c.SharedRequantized)
				}
			})
		})
	}
}

// checkRequantRows: every layer has a requantized-vs-reference row that
// reports a real error (INT4 moves the output by percents) within its
// derived bound, the exact rows stay at the fp32 tolerance, and a note
// sums it up.
func checkRequantRows(t *testing.T, o convert.Options, quant string, rep *Report) {
	t.Helper()
	layers := map[int]bool{}
	for _, r := range rep.Rows {
		switch r.Check {
		case judge.RequantVsReference:
			layers[r.Layer] = true
			if !(r.RelL2 > 1e-3) || !(r.RelL2 <= r.Tolerance.MaxRelL2) || r.Tolerance.MaxRelL2 > 0.5 || !strings.Contains(r.Tolerance.Reason, "relative error") {
				t.Errorf("%+v: layer %d %s rel_l2 %g, tolerance %+v", o, r.Layer, r.Check, r.RelL2, r.Tolerance)
			}
		case judge.FusedVsReference, judge.Coverage:
			if r.Tolerance != judge.TolFP32 && r.Tolerance != judge.TolBF16Fold {
				t.Errorf("%+v: layer %d %s judged at %s, want the exact tolerance", o, r.Layer, r.Check, r.Tolerance.Name)
			}
		}
	}
	if len(layers) != len(rep.LayersChecked) || len(layers) == 0 {
		t.Errorf("%+v: requantized-vs-reference rows for layers %v, checked %v", o, layers, rep.LayersChecked)
	}
	if notes := strings.Join(rep.Notes, "\n"); !strings.Contains(notes, "requantised to "+quant) || !strings.Contains(notes, "moves the layer output by rel_l2") {
		t.Errorf("%+v: no note on the requantisation: %q", o, rep.Notes)
	}
}

// TestRequantSharedMutationsFail: a requantised shared scale changed, one
// requantised code flipped, a replica's code flipped, and the contract's
// record removed each fail validate: the layer checks alone (the exact
// check against the same requantisation), the whole run, and the byte
// proof alone.
func TestRequantSharedMutationsFail(t *testing.T) {
	const prefix = "model.layers.1.mlp"
	g32, g16 := weightfmt.Int4Pack(32, "BF16"), weightfmt.Int4Pack(16, "BF16")
	stacked := convert.Options{Layout: layout.Stacked, TP: 2, FuseShared: true, RequantizeShared: true}
	gateUp := convert.Options{Layout: layout.GateUp, TP: 1, FuseShared: true, RequantizeShared: true}
	cases := []dstMutation{
		{"a requantised shared scale changed", "kimi-g32", stacked, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.Stacked, prefix, g32).DownScale, func(raw []byte, shape []int64) {
				e := slice(raw, shape, 12) // the first shared slot: E = 12
				v := numfmt.BF16ToF32(binary.LittleEndian.Uint16(e[6:]))
				binary.LittleEndian.PutUint16(e[6:], numfmt.F32ToBF16(v*1.25))
			})
		}},
		{"one requantised shared code flipped", "kimi-g32", stacked, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.Stacked, prefix, g32).Gate, func(raw []byte, shape []int64) {
				w := int4Word(raw, shape, 12, 5)
				binary.LittleEndian.PutUint32(w, binary.LittleEndian.Uint32(w)^(0x8<<20))
			})
		}},
		{"a code of the second replica flipped", "kimi-g32", stacked, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.Stacked, prefix, g32).Down, func(raw []byte, shape []int64) {
				w := int4Word(raw, shape, 13, 2)
				binary.LittleEndian.PutUint32(w, binary.LittleEndian.Uint32(w)^0x4)
			})
		}},
		{"the second shared slice's gate-up scale changed", "deepseek-v3-g16", gateUp, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.GateUp, prefix, g16).GateUpScale, func(raw []byte, shape []int64) {
				e := slice(raw, shape, 9) // E = 8: slice 1 of the shared expert
				v := numfmt.BF16ToF32(binary.LittleEndian.Uint16(e[40:]))
				binary.LittleEndian.PutUint16(e[40:], numfmt.F32ToBF16(-v))
			})
		}},
		{"the contract's requantisation record removed", "kimi-g32", stacked, func(t *testing.T, dst string) {
			editContract(t, dst, func(c map[string]any) { delete(c, "shared_requantized") })
		}},
		{"an FP8 requantised shared code flipped", "deepseek-v3-channel", stacked, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.Stacked, prefix, weightfmt.FP8Channel("BF16")).Up, func(raw []byte, shape []int64) {
				slice(raw, shape, 11)[30] ^= 0x08 // E = 10: slice 1 of the first replica
			})
		}},
		{"an FP8 per-tensor requantised scale changed", "kimi-tensor", gateUp, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.GateUp, prefix, weightfmt.FP8Tensor("F32")).DownScale, func(raw []byte, shape []int64) {
				scaleF32(slice(raw, shape, 9), 1.01) // E = 9
			})
		}},
	}
	mutationsFail(t, requantSpecs(), cases, DeviceCPU, []string{BytesOff, BytesAuto, BytesOnly})
}

// TestRequantSharedByteProof: the byte proof names the requantised tensor,
// the bank expert and the byte where DST differs from SRC's shared expert
// quantised again.
func TestRequantSharedByteProof(t *testing.T) {
	src := synthFrom(t, int4Specs(), "kimi-g32")
	dst := convertInto(t, src, convert.Options{Layout: layout.Stacked, TP: 2, FuseShared: true, RequantizeShared: true})
	name := layout.NamesFor(layout.Stacked, "model.layers.1.mlp", weightfmt.Int4Pack(32, "BF16")).Up
	rewriteTensor(t, dst, name, func(raw []byte, shape []int64) {
		slice(raw, shape, 13)[17] ^= 0x10
	})
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Bytes: BytesOnly})
	if err != nil {
		t.Fatal(err)
	}
	m := rep.Bytes.Mismatch
	if m == nil || m.Kind != byteproof.MismatchBytes || m.Tensor != name || m.Layer != 1 || m.Expert != 13 ||
		!strings.Contains(m.Detail, "requantised model.layers.1.mlp.shared_experts.up_proj.weight_packed") {
		t.Fatalf("mismatch %+v", m)
	}
}

// TestRequantSharedRefusals: what fuse-shared will not requantise, each
// refused in one line with the reason.
func TestRequantSharedRefusals(t *testing.T) {
	cases := []struct {
		name, fixture string
		specs         string
		o             convert.Options
		src           func(t *testing.T, src string)
		want          string
	}{
		{"a BF16 shared expert without the flag", "kimi-g32", "int4", convert.Options{FuseShared: true},
			nil, "fusing would requantise the shared expert; pass --requantize-shared"},
		{"the flag where the shared expert is stored like the routed ones", "deepseek-v2-channel", "fp8",
			convert.Options{FuseShared: true, RequantizeShared: true}, nil, "nothing to requantise; leave the flag out"},
		{"the flag on convert", "kimi-g32", "int4", convert.Options{RequantizeShared: true}, nil,
			"--requantize-shared applies to fuse-shared only"},
		{"a NaN in the BF16 shared expert", "kimi-g32", "int4", convert.Options{FuseShared: true, RequantizeShared: true},
			func(t *testing.T, src string) {
				rewriteTensor(t, src, "model.layers.1.mlp.shared_experts.down_proj.weight", func(raw []byte, _ []int64) {
					binary.LittleEndian.PutUint16(raw[2*77:], numfmt.F32ToBF16(float32(math.NaN())))
				})
			}, "element 77 is NaN: a non-finite weight cannot be requantised"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			specs := int4Specs()
			if tc.specs == "fp8" {
				specs = fp8ScaledSpecs()
			}
			src := synthFrom(t, specs, tc.fixture)
			if tc.src != nil {
				tc.src(t, src)
			}
			o := tc.o
			o.Layout = layout.Stacked
			convertRefused(t, src, o, tc.want)
		})
	}
}

// TestRequantSharedGPURefusal: the GPU does not judge a requantised shared
// expert: --device cuda refuses it, auto runs on the CPU with a note.
func TestRequantSharedGPURefusal(t *testing.T) {
	src := synthFrom(t, requantSpecs(), "deepseek-v3-channel")
	dst := convertInto(t, src, convert.Options{Layout: layout.GateUp, FuseShared: true, RequantizeShared: true})
	cudaRefused(t, src, dst, "", "requantised from BF16 to fp8_channel", "requantised from BF16 to fp8_channel")
}

// TestGPUPlainSharedBesideQuantised: a BF16 shared expert beside FP8
// per-channel routed experts (convert keeps it as it is) runs on the GPU as
// the plain MLP it is, as Kimi's beside INT4 does (TestGPUInt4).
func TestGPUPlainSharedBesideQuantised(t *testing.T) {
	needGPU(t)
	src := synthFrom(t, requantSpecs(), "deepseek-v3-channel")
	for _, l := range []layout.Layout{layout.Stacked, layout.GateUp} {
		dst := convertInto(t, src, convert.Options{Layout: l})
		rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Device: DeviceCUDA, Seed: 2})
		if err != nil {
			t.Fatal(err)
		}
		mustPass(t, rep, "plain shared expert beside FP8 channel on the GPU")
		if rep.Device != DeviceCUDA {
			t.Fatalf("ran on %s", rep.Device)
		}
	}
}

// TestRequantSharedNonFiniteSource: a NaN put into SRC's shared expert
// after fusing fails its layer with a non-finite row naming the tensor (exit
// 1), as for any other weight, not an unusable input.
func TestRequantSharedNonFiniteSource(t *testing.T) {
	src := synthFrom(t, requantSpecs(), "kimi-g32")
	dst := convertInto(t, src, convert.Options{Layout: layout.Stacked, FuseShared: true, RequantizeShared: true})
	rewriteTensor(t, src, "model.layers.1.mlp.shared_experts.up_proj.weight", func(raw []byte, _ []int64) {
		binary.LittleEndian.PutUint16(raw[2*5:], numfmt.F32ToBF16(float32(math.Inf(1))))
	})
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Device: DeviceCPU, Bytes: BytesOff})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Failed() || len(rep.Rows) == 0 || rep.Rows[0].Check != judge.NonFinite || !strings.Contains(rep.Rows[0].Reason, "shared_experts.up_proj.weight") {
		t.Fatalf("rows %+v", rep.Rows)
	}
}
