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
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/moelayer"
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
	mutationsFail(t, requantSpecs(), requantMutations(), DeviceCPU, []BytesMode{BytesOff, BytesAuto, BytesOnly})
}

// requantMutations are TestRequantSharedMutationsFail's.
func requantMutations() []dstMutation {
	const prefix = "model.layers.1.mlp"
	g32, g16 := weightfmt.Int4Pack(32, "BF16"), weightfmt.Int4Pack(16, "BF16")
	stacked := convert.Options{Layout: layout.Stacked, TP: 2, FuseShared: true, RequantizeShared: true}
	gateUp := convert.Options{Layout: layout.GateUp, TP: 1, FuseShared: true, RequantizeShared: true}
	cases := []dstMutation{
		{"a requantised shared scale changed", "kimi-g32", stacked, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.Stacked, prefix, g32).Get(layout.ProjDown, layout.RoleScale), func(raw []byte, shape []int64) {
				e := slice(raw, shape, 12) // the first shared slot: E = 12
				scaleBF16(e[6:8], 1.25)
			})
		}},
		{"one requantised shared code flipped", "kimi-g32", stacked, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.Stacked, prefix, g32).Weight(layout.ProjGate), func(raw []byte, shape []int64) {
				w := int4Word(raw, shape, 12, 5)
				binary.LittleEndian.PutUint32(w, binary.LittleEndian.Uint32(w)^(0x8<<20))
			})
		}},
		{"a code of the second replica flipped", "kimi-g32", stacked, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.Stacked, prefix, g32).Weight(layout.ProjDown), func(raw []byte, shape []int64) {
				w := int4Word(raw, shape, 13, 2)
				binary.LittleEndian.PutUint32(w, binary.LittleEndian.Uint32(w)^0x4)
			})
		}},
		{"the second shared slice's gate-up scale changed", "deepseek-v3-g16", gateUp, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.GateUp, prefix, g16).Get(layout.ProjGateUp, layout.RoleScale), func(raw []byte, shape []int64) {
				e := slice(raw, shape, 9) // E = 8: slice 1 of the shared expert
				scaleBF16(e[40:42], -1)
			})
		}},
		{"the contract's requantisation record removed", "kimi-g32", stacked, func(t *testing.T, dst string) {
			editContract(t, dst, func(c map[string]any) { delete(c, "shared_requantized") })
		}},
		{"an FP8 requantised shared code flipped", "deepseek-v3-channel", stacked, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.Stacked, prefix, weightfmt.FP8Channel("BF16")).Weight(layout.ProjUp), func(raw []byte, shape []int64) {
				slice(raw, shape, 11)[30] ^= 0x08 // E = 10: slice 1 of the first replica
			})
		}},
		{"an FP8 per-tensor requantised scale changed", "kimi-tensor", gateUp, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.NamesFor(layout.GateUp, prefix, weightfmt.FP8Tensor("F32")).Get(layout.ProjDown, layout.RoleScale), func(raw []byte, shape []int64) {
				scaleF32(slice(raw, shape, 9), 1.01) // E = 9
			})
		}},
	}
	return cases
}

// TestRequantSharedByteProof: the byte proof names the requantised tensor,
// the bank expert and the byte where DST differs from SRC's shared expert
// quantised again.
func TestRequantSharedByteProof(t *testing.T) {
	src := synthFrom(t, int4Specs(), "kimi-g32")
	dst := convertInto(t, src, convert.Options{Layout: layout.Stacked, TP: 2, FuseShared: true, RequantizeShared: true})
	name := layout.NamesFor(layout.Stacked, "model.layers.1.mlp", weightfmt.Int4Pack(32, "BF16")).Weight(layout.ProjUp)
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

// TestRequantSharedGPUPrecisionRefused: a requantised shared expert is in
// the routed experts' format, and every format fuse-shared requantises
// into is decoded to bf16 on the GPU, so --device cuda with --precision
// f32 or fp8 refuses it, naming why, before any layer runs, and --device
// auto then runs on the CPU with a note; --precision bf16 is not refused
// (TestGPURequantShared runs it).
func TestRequantSharedGPUPrecisionRefused(t *testing.T) {
	for _, c := range []struct{ fixture, what string }{
		{"deepseek-v3-channel", "FP8 per-channel expert weights (quantization fp8_channel, BF16 scales)"},
		{"kimi-g32", "INT4 expert weights (quantization int4_pack, BF16 scales)"},
	} {
		t.Run(c.fixture, func(t *testing.T) {
			src := synthFrom(t, requantSpecs(), c.fixture)
			dst := convertInto(t, src, convert.Options{Layout: layout.GateUp, FuseShared: true, RequantizeShared: true})
			bf16OnlyOnGPU(t, src, dst, c.what)
		})
	}
}

// TestGPUPlainSharedBesideQuantised: a BF16 shared expert beside FP8
// per-channel routed experts (convert keeps it as it is) runs on the GPU as
// the plain MLP it is, as Kimi's beside INT4 does (TestGPUInt4).
func TestGPUPlainSharedBesideQuantised(t *testing.T) {
	needGPU(t)
	src := synthFrom(t, requantSpecs(), "deepseek-v3-channel")
	for _, l := range []layout.Layout{layout.Stacked, layout.GateUp} {
		dst := convertInto(t, src, convert.Options{Layout: l})
		rep := runPass(t, Options{Src: src, Dst: dst, Device: DeviceCUDA, Seed: 2}, "plain shared expert beside FP8 channel on the GPU")
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

// gpuRequantRuns are requantRuns plus a gate-up DST prepared for --tp 8
// (eight replicas of each shared slice).
func gpuRequantRuns() []convert.Options {
	return append(requantRuns(), convert.Options{Layout: layout.GateUp, TP: 8, FuseShared: true, RequantizeShared: true})
}

// TestGPURequantShared (GPU): validate --device cuda on every requantised
// conversion (Kimi-style INT4 groups of 32, INT4 groups of 16 with two
// shared experts, FP8 per channel and per tensor; stacked, gate-up and
// up-gate, tp 1, 2, 4 and 8, rsf folded and not) passes with the rows of
// a CPU run: on every layer gpu-fused-vs-gpu-unfused and gpu-coverage (the
// unfused path runs SRC's shared expert requantised as DST holds it), and,
// the CPU reference running on every layer, gpu-fused-vs-reference and
// gpu-coverage-vs-reference against the reference with the same
// requantisation, and requantized-vs-reference, the error requantising
// adds, as the reference measured it: the CPU run's, at the CPU run's
// tolerance, with the same note. The GPU paths are judged at gpu-bf16;
// they must be within half the requantisation error of each other, and
// the fused path within 0.8 of it from the requantised reference: a path
// that ran SRC's BF16 shared expert instead, or a reference without the
// requantisation, would differ by at least the requantisation error
// (0.01..0.06 here). --cpu-check none runs the GPU paths alone and says that no layer
// measured the error.
func TestGPURequantShared(t *testing.T) {
	needGPU(t)
	for _, rc := range requantCases() {
		t.Run(rc.fixture, func(t *testing.T) {
			src := synthFrom(t, requantSpecs(), rc.fixture)
			for _, o := range gpuRequantRuns() {
				dst := convertInto(t, src, o)
				cpu, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 7, Device: DeviceCPU})
				if err != nil {
					t.Fatal(err)
				}
				mustPass(t, cpu, "the CPU run")
				gpu, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 7, Device: DeviceCUDA, CPUCheck: CPUCheckAll})
				if err != nil {
					t.Fatalf("%+v: %v", o, err)
				}
				mustPass(t, gpu, "validate --device cuda on a requantised shared expert")
				if gpu.Device != DeviceCUDA {
					t.Fatalf("%+v: ran on %s", o, gpu.Device)
				}
				checkGPURequantRows(t, o, rc.record.Quantization, cpu, gpu)
			}
			dst := convertInto(t, src, requantRuns()[0])
			rep := runPass(t, Options{Src: src, Dst: dst, Seed: 7, Device: DeviceCUDA, CPUCheck: CPUCheckNone}, "--cpu-check none")
			for _, r := range rep.Rows {
				if r.Check != judge.GPUFusedVsGPUUnfused && r.Check != judge.GPUCoverage {
					t.Errorf("--cpu-check none: layer %d row %s", r.Layer, r.Check)
				}
			}
			if notes := strings.Join(rep.Notes, "\n"); !strings.Contains(notes, "requantised to "+rc.record.Quantization) || !strings.Contains(notes, "no layer measured the error it adds") {
				t.Errorf("--cpu-check none: notes %q", rep.Notes)
			}
		})
	}
}

// checkGPURequantRows holds a GPU run's rows (gpu) of a requantised DST to
// the CPU run's (cpu) on the same tokens, as TestGPURequantShared says.
func checkGPURequantRows(t *testing.T, o convert.Options, quant string, cpu, gpu *Report) {
	t.Helper()
	type key struct {
		layer int
		check string
	}
	rows := map[key]LayerResult{}
	for _, r := range gpu.Rows {
		rows[key{r.Layer, r.Check}] = r
		t.Logf("%+v: layer %d %-26s rel_l2 %.3g (%s %.3g)", o, r.Layer, r.Check, r.RelL2, r.Tolerance.Name, r.Tolerance.MaxRelL2)
	}
	cpuRequant, cpuExact := map[int]LayerResult{}, map[int]float64{}
	for _, r := range cpu.Rows {
		switch r.Check {
		case judge.RequantVsReference:
			cpuRequant[r.Layer] = r
		case judge.FusedVsReference:
			cpuExact[r.Layer] = r.RelL2
		}
	}
	if len(gpu.LayersChecked) == 0 || len(cpuRequant) != len(gpu.LayersChecked) {
		t.Fatalf("%+v: GPU checked layers %v, CPU requantized-vs-reference rows %d", o, gpu.LayersChecked, len(cpuRequant))
	}
	for _, l := range gpu.LayersChecked {
		want := cpuRequant[l]
		rq, ok := rows[key{l, judge.RequantVsReference}]
		switch {
		case !ok:
			t.Errorf("%+v: layer %d has no %s row", o, l, judge.RequantVsReference)
			continue
		case rq.Tolerance != want.Tolerance:
			t.Errorf("%+v: layer %d %s tolerance %+v, the CPU run's %+v", o, l, rq.Check, rq.Tolerance, want.Tolerance)
		case !(rq.RelL2 > 1e-3) || math.Abs(rq.RelL2-want.RelL2) > 1.1*cpuExact[l]+1e-6 || math.Abs(rq.Cosine-want.Cosine) > cpuExact[l]+1e-6:
			// The CPU row is DST's fused path against the reference; the
			// GPU run's is the requantised reference itself, from which
			// the CPU's fused path is fused-vs-reference away (1e-5, or
			// a rounded rsf fold's 1e-3).
			t.Errorf("%+v: layer %d %s rel_l2 %g cos %g, the CPU run's %g %g", o, l, rq.Check, rq.RelL2, rq.Cosine, want.RelL2, want.Cosine)
		}
		for _, c := range []string{judge.GPUFusedVsGPUUnfused, judge.GPUCoverage, judge.GPUFusedVsReference, judge.GPUCoverageVsReference} {
			r, ok := rows[key{l, c}]
			switch {
			case !ok:
				t.Errorf("%+v: layer %d has no %s row", o, l, c)
			case r.Tolerance != judge.TolGPUBF16:
				t.Errorf("%+v: layer %d %s judged at %s, want %s", o, l, c, r.Tolerance.Name, judge.TolGPUBF16.Name)
			case c == judge.GPUFusedVsGPUUnfused && !(r.RelL2 <= rq.RelL2/2):
				// Both paths run the same bf16 weights: activations'
				// rounding alone (and a rounded rsf fold).
				t.Errorf("%+v: layer %d %s rel_l2 %g, not within half the requantisation error %g: the paths ran different shared experts", o, l, c, r.RelL2, rq.RelL2)
			case c == judge.GPUFusedVsReference && !(r.RelL2 <= 0.8*rq.RelL2):
				// bf16 weights against the reference's exact ones too;
				// against the unrequantised reference it would be at
				// least the requantisation error.
				t.Errorf("%+v: layer %d %s rel_l2 %g, not below the requantisation error %g: judged against another shared expert", o, l, c, r.RelL2, rq.RelL2)
			}
		}
	}
	notes := strings.Join(gpu.Notes, "\n")
	if !strings.Contains(notes, "requantised to "+quant) || !strings.Contains(notes, "moves the layer output by rel_l2") ||
		!strings.Contains(notes, judge.GPUFusedVsGPUUnfused+" and "+judge.GPUFusedVsReference+" compare against the same requantisation") {
		t.Errorf("%+v: no note on the requantisation: %q", o, gpu.Notes)
	}
}

// gpuRequantMutations each change one byte of a requantised shared scale
// in DST, by enough to move a layer's output far beyond gpu-bf16's 2e-2
// (TestRequantSharedGPUMutationMargin measures it on the CPU): the GPU's
// layer checks alone must fail them. One requantised code or a sign of
// one scale group moves it by less (0.002..0.05 on the CPU), which only
// the CPU's exact checks and the byte proof are sure to see
// (requantMutations).
func gpuRequantMutations() []dstMutation {
	const prefix = "model.layers.1.mlp"
	stacked := convert.Options{Layout: layout.Stacked, TP: 2, FuseShared: true, RequantizeShared: true}
	gateUp := convert.Options{Layout: layout.GateUp, TP: 1, FuseShared: true, RequantizeShared: true}
	// hiByte flips bits of the high byte of the first BF16 scale of
	// bank expert e's slice of stack name of layout l.
	hiByte := func(l layout.Layout, name func(layout.ExpertTensors) string, f weightfmt.Format, e, at int, bits byte) func(t *testing.T, dst string) {
		return func(t *testing.T, dst string) {
			rewriteTensor(t, dst, name(layout.NamesFor(l, prefix, f)), func(raw []byte, shape []int64) {
				slice(raw, shape, e)[at] ^= bits
			})
		}
	}
	down := func(n layout.ExpertTensors) string { return n.Get(layout.ProjDown, layout.RoleScale) }
	return []dstMutation{
		{"INT4 g32: a shared down scale's exponent bit flipped", "kimi-g32", stacked,
			hiByte(layout.Stacked, down, weightfmt.Int4Pack(32, "BF16"), 12, 1, 0x02)},
		{"INT4 g16: a shared slice's down scale's exponent bit flipped", "deepseek-v3-g16", gateUp,
			hiByte(layout.GateUp, down, weightfmt.Int4Pack(16, "BF16"), 9, 1, 0x02)},
		{"FP8 channel: a shared slice's down row scale's exponent bit flipped", "deepseek-v3-channel", stacked,
			hiByte(layout.Stacked, down, weightfmt.FP8Channel("BF16"), 11, 1, 0x04)},
		{"FP8 tensor: the shared down scale's sign bit flipped", "kimi-tensor", gateUp,
			hiByte(layout.GateUp, down, weightfmt.FP8Tensor("F32"), 9, 3, 0x80)},
	}
}

// TestRequantSharedGPUMutationMargin (CPU): each of gpuRequantMutations
// moves its layer's output (fused-vs-reference and the coverage tokens')
// by at least 5 x gpu-bf16's threshold on the CPU, so that the GPU's layer
// checks failing them is no accident of the bf16 rounding.
func TestRequantSharedGPUMutationMargin(t *testing.T) {
	for _, tc := range gpuRequantMutations() {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := tc.apply(t, requantSpecs())
			rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 3, Device: DeviceCPU, Bytes: BytesOff})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, r := range rep.Rows {
				if r.Layer != 1 || (r.Check != judge.FusedVsReference && r.Check != judge.Coverage) {
					continue
				}
				n++
				if !(r.RelL2 >= 5*judge.TolGPUBF16.MaxRelL2) || r.Pass {
					t.Errorf("layer 1 %s rel_l2 %g, want >= %g", r.Check, r.RelL2, 5*judge.TolGPUBF16.MaxRelL2)
				}
			}
			if n != 2 {
				t.Fatalf("rows %+v", rep.Rows)
			}
		})
	}
}

// TestGPURequantSharedMutationsFail (GPU): each one-byte change of a
// requantised shared scale in gpuRequantMutations fails validate --device
// cuda on its layer checks alone (--skip-bytes: the GPU paths and the
// requantised reference disagree with DST) and with the byte proof; the
// CPU suite's mutations (one requantised code flipped, a replica's code,
// a scale group's sign, the contract's record removed) fail the GPU run
// with the byte proof, and its layer checks alone are logged.
func TestGPURequantSharedMutationsFail(t *testing.T) {
	needGPU(t)
	mutationsFail(t, requantSpecs(), gpuRequantMutations(), DeviceCUDA, []BytesMode{BytesOff, BytesAuto})
	t.Run("cpu suite", func(t *testing.T) {
		mutationsFail(t, requantSpecs(), requantMutations(), DeviceCUDA, []BytesMode{BytesAuto})
		mutationsRun(t, requantSpecs(), requantMutations(), DeviceCUDA, []BytesMode{BytesOff}, func(string) (bool, bool) { return true, false })
	})
}

// TestRequantGPURowsOnCPUTwins (CPU): the rows a GPU layer of a
// requantised DST makes (gpuRows, as checkLayerGPU calls it), fed the CPU
// twins of its paths: the fused path (cpuref.FusedLayerRun) for the GPU's
// fused one, the reference run with RequantShared as checkLayerGPU runs it,
// and its requantised output for the GPU's unfused path (which runs the
// same requantised shared expert). They pass checkGPURequantRows against
// the CPU run of the same tokens, as TestGPURequantShared's GPU runs must:
// the requantized-vs-reference row and its bound are the CPU run's, the
// paths are judged against the requantised reference, and the note sums
// the rows up as a CPU run's does.
func TestRequantGPURowsOnCPUTwins(t *testing.T) {
	ctx := context.Background()
	for _, rc := range requantCases() {
		t.Run(rc.fixture, func(t *testing.T) {
			src := synthFrom(t, requantSpecs(), rc.fixture)
			for _, o := range gpuRequantRuns() {
				dst := convertInto(t, src, o)
				cpu, err := Run(ctx, Options{Src: src, Dst: dst, Seed: 7, Device: DeviceCPU})
				if err != nil {
					t.Fatal(err)
				}
				withCUDA(t, nil)
				s := &session{o: Options{Src: src, Dst: dst, Seed: 7, Device: DeviceCUDA, GPUPrecision: PrecisionBF16, CPUCheck: CPUCheckAll}}
				targets := openSession(t, s)
				requant, err := s.requantFormat()
				if err != nil || requant == nil {
					t.Fatalf("requantised format %v, %v", requant, err)
				}
				rep := &Report{}
				for _, tg := range targets {
					x, tn, h, g, tokens, cov, err := s.layerStart(tg)
					if err != nil {
						t.Fatal(err)
					}
					ref, err := cpuref.ReferenceLayer(ctx, s.src, s.srcPlan, tg.src, x, tn, cpuref.RefOptions{Tokens: tokens, Coverage: cov, RequantShared: requant})
					if err != nil {
						t.Fatal(err)
					}
					fused, err := cpuref.FusedLayerRun(ctx, s.dst, tg.fused, x, tn, cpuref.FusedOptions{Tokens: tokens, Coverage: cov, BlockSize: s.o.BlockSize})
					if err != nil {
						t.Fatal(err)
					}
					unf := &moelayer.RefResult{Y: ref.YRequant, Routing: ref.Routing}
					rj := rowJudge{s: s, base: LayerResult{Layer: tg.index, MTP: tg.mtp, Tokens: tn}, numerics: s.gpuNumerics(), t: tn, h: h, cov: cov, g: g}
					rep.Rows = append(rep.Rows, rj.gpuRows(gpuPaths{fused: fused, unf: unf, ref: ref})...)
					rep.LayersChecked = append(rep.LayersChecked, tg.index)
				}
				rep.Notes = append(rep.Notes, s.requantNote(rep.Rows))
				checkGPURequantRows(t, o, rc.record.Quantization, cpu, rep)
			}
		})
	}
}

// TestGPURequantSharedNonFiniteSource (GPU): an Inf put into SRC's shared
// expert after fusing fails its layer on the GPU with a non-finite row
// naming the tensor (exit 1), as on the CPU (TestRequantSharedNonFiniteSource):
// the GPU's unfused path scans SRC's shared weights as it requantises them.
func TestGPURequantSharedNonFiniteSource(t *testing.T) {
	needGPU(t)
	src := synthFrom(t, requantSpecs(), "kimi-g32")
	dst := convertInto(t, src, convert.Options{Layout: layout.Stacked, FuseShared: true, RequantizeShared: true})
	rewriteTensor(t, src, "model.layers.1.mlp.shared_experts.up_proj.weight", func(raw []byte, _ []int64) {
		binary.LittleEndian.PutUint16(raw[2*5:], numfmt.F32ToBF16(float32(math.Inf(1))))
	})
	for _, check := range []CPUCheckMode{CPUCheckAll, CPUCheckNone} {
		rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Device: DeviceCUDA, CPUCheck: check, Bytes: BytesOff})
		if err != nil {
			t.Fatalf("--cpu-check %s: %v", check, err)
		}
		if !rep.Failed() || len(rep.Rows) == 0 || rep.Rows[0].Check != judge.NonFinite || !strings.Contains(rep.Rows[0].Reason, "shared_experts.up_proj.weight") {
			t.Fatalf("--cpu-check %s: rows %+v", check, rep.Rows)
		}
	}
}
