package validate

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/judge"
)

// What the tests of each quantised expert format share: a synth
// checkpoint from the format's spec table, every conversion of it passing
// validate with the format in its contract (on the CPU, and on the GPU
// where it decodes the format), every mutation of DST failing validate,
// what cannot be carried refused in one line, and the GPU refusing the
// precisions its decode to bf16 cannot compare.

// synthFrom writes specs[name] into a temporary directory.
func synthFrom(t *testing.T, specs map[string]fixtures.SynthSpec, name string) string {
	t.Helper()
	spec, ok := specs[name]
	if !ok {
		t.Fatalf("no synth spec %q", name)
	}
	return cktest.WriteSpec(t, filepath.Join(t.TempDir(), name), spec)
}

// conversionsPass converts src with each of runs, validates each output on
// device and hands its contract to check (nil: none).
func conversionsPass(t *testing.T, src string, device Device, runs []convert.Options, check func(o convert.Options, c *layout.Contract)) []*Report {
	t.Helper()
	var reps []*Report
	for _, o := range runs {
		dst := convertInto(t, src, o)
		rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 7, Device: device})
		if err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		mustPass(t, rep, "validate --device "+string(device)+" failed on a correct conversion")
		if rep.Device != device {
			t.Fatalf("%+v: ran on %s, want %s", o, rep.Device, device)
		}
		if check != nil {
			check(o, readContract(t, dst))
		}
		reps = append(reps, rep)
	}
	return reps
}

// threeLayouts are the conversions every quantised format's tests pass:
// each layout once, one of them prepared for --tp 2.
var threeLayouts = []convert.Options{{Layout: layout.Stacked}, {Layout: layout.GateUp}, {Layout: layout.UpGate, TP: 2}}

// layoutsOnly is threeLayouts for any spec (gpuDecodedPass's runs): every
// layout, and no fuse-shared.
func layoutsOnly(fixtures.SynthSpec) []convert.Options { return threeLayouts }

// specsPass runs conversionsPass on the CPU over every spec of specs, one
// subtest each, with runs and, where the spec has shared experts, the
// fuse-shared runs of fused; each contract must say q, then passes check
// (nil: nothing more).
func specsPass(t *testing.T, specs map[string]fixtures.SynthSpec, runs, fused []convert.Options, q quantContract, check func(o convert.Options, c *layout.Contract)) {
	for name, spec := range specs {
		t.Run(name, func(t *testing.T) {
			src := synthFrom(t, specs, name)
			all := runs
			if spec.SharedExperts > 0 {
				all = append(slices.Clone(runs), fused...)
			}
			conversionsPass(t, src, DeviceCPU, all, func(o convert.Options, c *layout.Contract) {
				q.check(t, o, c)
				if check != nil {
					check(o, c)
				}
			})
		})
	}
}

// readConfig is dir's config.json, decoded.
func readConfig(t *testing.T, dir string) map[string]any {
	t.Helper()
	return testkit.ReadJSON(t, filepath.Join(dir, "config.json"))
}

// readContract is the moeprep contract in dir's config.json.
func readContract(t *testing.T, dir string) *layout.Contract {
	t.Helper()
	c, ok, err := layout.ReadContract(readConfig(t, dir))
	if err != nil || !ok {
		t.Fatalf("%s: contract: %v", dir, err)
	}
	return c
}

// quantContract is what the contract of a conversion says of the routed
// experts' format.
type quantContract struct {
	quantization, weightDType, scaleDType string
	block                                 []int64 // weight_block_size; nil: none
}

// check reports where c, the contract of conversion o, says other than q.
func (q quantContract) check(t *testing.T, o convert.Options, c *layout.Contract) {
	t.Helper()
	if c.Quantization != q.quantization || c.WeightDType != q.weightDType || c.ScaleDType != q.scaleDType || !slices.Equal(c.WeightBlockSize, q.block) {
		t.Errorf("%+v: contract quantization %q weight_dtype %q scale_dtype %q weight_block_size %v, want %q %q %q %v",
			o, c.Quantization, c.WeightDType, c.ScaleDType, c.WeightBlockSize, q.quantization, q.weightDType, q.scaleDType, q.block)
	}
}

// dstMutation is one corruption of a converted checkpoint: fixture names
// the synth spec, o the conversion, mutate edits DST.
type dstMutation struct {
	name, fixture string
	o             convert.Options
	mutate        func(t *testing.T, dst string)
}

// apply writes the mutation's fixture from specs, converts it and corrupts
// the copy: SRC and the corrupted DST.
func (m dstMutation) apply(t *testing.T, specs map[string]fixtures.SynthSpec) (src, dst string) {
	t.Helper()
	src = synthFrom(t, specs, m.fixture)
	dst = convertInto(t, src, m.o)
	m.mutate(t, dst)
	return src, dst
}

// mutationsFail runs validate on device with each byte mode on every
// mutation (or on those named only): each must fail the run, not make the
// input unusable.
func mutationsFail(t *testing.T, specs map[string]fixtures.SynthSpec, cases []dstMutation, device Device, byteModes []BytesMode, only ...string) {
	mutationsRun(t, specs, cases, device, byteModes, func(name string) (run, must bool) {
		return len(only) == 0 || slices.Contains(only, name), true
	})
}

// mutationsRun runs validate on device with each byte mode on each
// mutation pick runs: none may make the input unusable, and one that must
// be caught fails t when the run passes; the others' outcomes are logged,
// with the worst row's rel L2 as a multiple of its threshold.
func mutationsRun(t *testing.T, specs map[string]fixtures.SynthSpec, cases []dstMutation, device Device, byteModes []BytesMode, pick func(name string) (run, must bool)) {
	for _, tc := range cases {
		run, must := pick(tc.name)
		if !run {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			src, dst := tc.apply(t, specs)
			for _, bytes := range byteModes {
				rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 3, Device: device, Bytes: bytes})
				if err != nil {
					t.Fatalf("bytes %s: the mutation made the input unusable instead of failing the check: %v", bytes, err)
				}
				if bytes != BytesOnly && rep.Device != device { // the byte proof alone runs on no device
					t.Fatalf("bytes %s: ran on %s, want %s", bytes, rep.Device, device)
				}
				worst := 0.0
				for _, r := range rep.Rows {
					if r.Tolerance.MaxRelL2 > 0 && !math.IsNaN(r.RelL2) {
						worst = max(worst, r.RelL2/r.Tolerance.MaxRelL2)
					}
				}
				switch {
				case rep.Failed():
					t.Logf("bytes %s: caught: %s (worst row %.0fx its threshold)", bytes, strings.SplitN(rep.Err().Error(), ";", 2)[0], worst)
				case must:
					t.Fatalf("bytes %s: mutation not caught (worst row %.2gx its threshold)", bytes, worst)
				default:
					t.Logf("bytes %s: not caught, as allowed (worst row %.2gx its threshold)", bytes, worst)
				}
			}
		})
	}
}

// gpuDecodedPass checks a format the GPU decodes to bf16 on the GPU (bf16
// precision, judged at gpu-bf16): every conversion runs(spec) of every
// spec passes validate --device cuda; every mutation fails the whole run
// (the byte proof sees each); the layer checks alone (--skip-bytes) must
// catch those named in layerCaught, and run and log the others (a changed
// nibble or group scale can move a layer's output by less than gpu-bf16's
// 2e-2, which the decode's bf16 rounding needs).
func gpuDecodedPass(t *testing.T, specs map[string]fixtures.SynthSpec, runs func(fixtures.SynthSpec) []convert.Options, muts []dstMutation, layerCaught ...string) {
	needGPU(t)
	for name, spec := range specs {
		t.Run(name, func(t *testing.T) {
			src := synthFrom(t, specs, name)
			rs := runs(spec)
			for i, rep := range conversionsPass(t, src, DeviceCUDA, rs, nil) {
				worst := 0.0
				for _, r := range rep.Rows {
					if r.Tolerance == judge.TolGPUBF16 {
						worst = max(worst, r.RelL2)
					}
				}
				t.Logf("%+v: passes on the GPU, worst gpu-bf16 rel L2 %.2e", rs[i], worst)
			}
		})
	}
	t.Run("mutations", func(t *testing.T) { mutationsFail(t, specs, muts, DeviceCUDA, []BytesMode{BytesAuto}) })
	t.Run("layer checks", func(t *testing.T) {
		mutationsRun(t, specs, muts, DeviceCUDA, []BytesMode{BytesOff}, func(name string) (bool, bool) { return true, slices.Contains(layerCaught, name) })
	})
}

// decodedOnGPU are the quantised formats the GPU decodes to bf16, each
// with a spec table, a fixture and how validate names its weights.
func decodedOnGPU() []struct {
	specs         map[string]fixtures.SynthSpec
	fixture, what string
} {
	return []struct {
		specs         map[string]fixtures.SynthSpec
		fixture, what string
	}{
		{fp8ScaledSpecs(), "qwen3-channel", "FP8 per-channel expert weights (quantization fp8_channel, BF16 scales)"},
		{fp8SquareSpecs(), "b32-h80-i64", "FP8 expert weights (quantization fp8_block_128x128, F32 scales)"},
		{int4Specs(), "kimi-g32", "INT4 expert weights (quantization int4_pack, BF16 scales)"},
		{mxfp4Specs(), "h96-i64", "MXFP4 expert weights (quantization mxfp4, U8 scales)"},
		{nvfp4Specs(), "qwen3-nv", "NVFP4 expert weights (quantization nvfp4_modelopt, F8_E4M3 scales)"},
	}
}

// TestDecodedOnGPURefusal: the GPU decodes these formats to bf16, so its
// bf16 precision (the default) takes them and only that: --device cuda
// with --precision f32 or fp8 refuses, naming the format and why, before
// any layer runs; --device auto then runs on the CPU with a note, with or
// without a GPU.
// bf16OnlyOnGPU: the GPU takes src/dst, whose expert weights (what) it
// decodes to bf16, in the bf16 precision and refuses f32 and fp8 in one
// line (--device auto runs those on the CPU, saying why).
func bf16OnlyOnGPU(t *testing.T, src, dst, what string) {
	t.Helper()
	s := &session{o: Options{Src: src, Dst: dst, GPUPrecision: PrecisionBF16}}
	defer s.close()
	if err := s.open(); err != nil {
		t.Fatal(err)
	}
	if why := s.gpuRefusal(); why != "" {
		t.Fatalf("--precision bf16 refused: %s", why)
	}
	for _, prec := range []Precision{PrecisionF32, PrecisionFP8} {
		cudaRefused(t, src, dst, prec, what+" are decoded to bf16 on the GPU, which runs them with --precision bf16 only (not "+string(prec)+")",
			"decoded to bf16 on the GPU")
	}
}

func TestDecodedOnGPURefusal(t *testing.T) {
	for _, c := range decodedOnGPU() {
		t.Run(c.fixture, func(t *testing.T) {
			src := synthFrom(t, c.specs, c.fixture)
			dst := convertInto(t, src, convert.Options{Layout: layout.GateUp})
			bf16OnlyOnGPU(t, src, dst, c.what)
		})
	}
}

// refusal is one checkpoint moeprep must refuse: fixture names the synth
// spec, edit changes its config.json and src its files (either may be
// nil), fuse asks fuse-shared; the refusal is one line containing want.
type refusal struct {
	name, fixture string
	edit          func(c map[string]any)
	src           func(t *testing.T, src string)
	fuse          bool
	want          string
}

// ctGroup0 is config group group_0 of a compressed-tensors config.json's
// quantization_config, as the synth writes it.
func ctGroup0(c map[string]any) map[string]any {
	return c["quantization_config"].(map[string]any)["config_groups"].(map[string]any)["group_0"].(map[string]any)
}

// refusalsHold converts each case's checkpoint and requires its refusal.
func refusalsHold(t *testing.T, specs map[string]fixtures.SynthSpec, cases []refusal) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := synthFrom(t, specs, tc.fixture)
			if tc.edit != nil {
				testkit.EditJSON(t, filepath.Join(src, "config.json"), tc.edit)
			}
			if tc.src != nil {
				tc.src(t, src)
			}
			t.Logf("refused: %v", convertRefused(t, src, convert.Options{Layout: layout.Stacked, FuseShared: tc.fuse}, tc.want))
		})
	}
}

// convertRefused converts src with o into a fresh DST and fails t unless
// convert refuses it with one line containing want; it returns the refusal.
func convertRefused(t *testing.T, src string, o convert.Options, want string) error {
	t.Helper()
	o.Src, o.Dst = src, filepath.Join(t.TempDir(), "dst")
	_, err := convert.Convert(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("got %v, want one line containing %q", err, want)
	}
	return err
}

// cudaRefused: as on a machine with a GPU, validate --device cuda at
// precision prec ("": the default) refuses src and dst with an error
// containing want, before any layer runs, and --device auto then passes
// on the CPU with a note containing note.
func cudaRefused(t *testing.T, src, dst string, prec Precision, want, note string) {
	t.Helper()
	withCUDA(t, nil)
	asked := "--device cuda"
	if prec != "" {
		asked += " --precision " + string(prec)
	}
	_, err := Run(context.Background(), Options{Src: src, Dst: dst, Device: DeviceCUDA, GPUPrecision: prec})
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("%s: %v", asked, err)
	}
	rep := runPass(t, Options{Src: src, Dst: dst, Device: "auto", GPUPrecision: prec}, "--device auto")
	if rep.Device != DeviceCPU || !strings.Contains(strings.Join(rep.Notes, "\n"), note) {
		t.Fatalf("--device auto ran on %s, notes %q", rep.Device, rep.Notes)
	}
}
