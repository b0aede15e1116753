package rankproof

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures/hf"
	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/testkit/gputest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/gpurun"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/weightfmt"
)

// gpuCases are per-rank outputs of every storage the GPU takes: EP alone,
// EP x MoE-TP, redundant slots, fuse-shared with a replica per rank, a
// folded rsf, FP8 blocks (whole and cut on a block), the device-decoded
// INT4, NVFP4 and MXFP4, and gpt-oss's expert biases.
func gpuCases(t *testing.T) []struct {
	name string
	o    convert.Options
} {
	fp8 := fp8I256(t)
	hf := func(d string) string { return filepath.Join(hfDir, d) }
	return []struct {
		name string
		o    convert.Options
	}{
		{"deepseek-v3-bf16 ep4 slots20", convert.Options{Src: hf("deepseek-v3-bf16"), EP: 4, Slots: 20}},
		{"deepseek-v3-bf16 fuse fold down gate-up ep2 moe-tp2 slots18", convert.Options{Src: hf("deepseek-v3-bf16"), EP: 2, MoETP: 2, Slots: 18, FuseShared: true, FoldScaling: "down", Layout: layout.GateUp}},
		{"deepseek-v3-fp8 ep4", convert.Options{Src: hf("deepseek-v3-fp8"), EP: 4}},
		{"deepseek-v3-fp8 fuse ep4 slots20", convert.Options{Src: hf("deepseek-v3-fp8"), EP: 4, Slots: 20, FuseShared: true}},
		{"fp8 I256 fuse ep2 moe-tp2 up-gate", convert.Options{Src: fp8, EP: 2, MoETP: 2, FuseShared: true, Layout: layout.UpGate}},
		{"qwen3-moe ep2 moe-tp2 slots10", convert.Options{Src: hf("qwen3-moe"), EP: 2, MoETP: 2, Slots: 10}},
		{"qwen3-moe ep4", convert.Options{Src: hf("qwen3-moe"), EP: 4}},
		{"mixtral ep2 moe-tp4", convert.Options{Src: hf("mixtral"), EP: 2, MoETP: 4}},
		{"mixtral ep4 slots12", convert.Options{Src: hf("mixtral"), EP: 4, Slots: 12}},
		{"deepseek-v3-int4 ep8", convert.Options{Src: hf("deepseek-v3-int4"), EP: 8}},
		{"deepseek-v3-nvfp4 ep2 moe-tp2", convert.Options{Src: hf("deepseek-v3-nvfp4"), EP: 2, MoETP: 2}},
		{"gpt-oss ep4 slots12", convert.Options{Src: hf("gpt-oss"), EP: 4, Slots: 12}},
		{"gpt-oss-mxfp4 ep2", convert.Options{Src: hf("gpt-oss-mxfp4"), EP: 2}},
	}
}

// On the GPU, every MoE layer recomposed from the ranks (each expert
// through each of its replicas, the MoE-TP parts summed) computes what
// SRC's layer computes on the GPU, and the CPU recomposition, its twin,
// agrees on every layer. In f32 the two GPU sides differ by summation
// order alone (held to gpu-f32's 1e-5, or bf16-folded-rsf's 5e-3 where a
// folded rsf rounded the weights); the device-decoded formats run in bf16
// only, which the refusal says.
func TestGPURecomposedEqualsSource(t *testing.T) {
	gputest.Need(t)
	ctx := context.Background()
	for _, tc := range gpuCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			dst := convertTo(t, tc.o)
			all, _, err := Layers(tc.o.Src, dst)
			if err != nil {
				t.Fatal(err)
			}
			c, err := readContract(dst)
			if err != nil {
				t.Fatal(err)
			}
			f, err := c.Format()
			if err != nil {
				t.Fatal(err)
			}
			// rsf folded into weights (not F32 scales) rounded them
			roundedFold := c.RoutedScalingFactorFolded && f.Fold().Into != weightfmt.FoldScales
			twin := map[int]bool{}
			for _, l := range all {
				twin[l] = true
			}
			for _, prec := range []string{gpurun.PrecisionBF16, gpurun.PrecisionF32} {
				why, err := GPURefusal(tc.o.Src, dst, prec)
				if err != nil {
					t.Fatal(err)
				}
				if why != "" {
					if prec == gpurun.PrecisionBF16 || !strings.Contains(why, "with --precision bf16 only") {
						t.Errorf("%s: refused: %s", prec, why)
					}
					continue
				}
				lcs, err := CheckRecomposed(ctx, tc.o.Src, dst, Options{Tokens: 16, Seed: 7, GPU: true, Precision: prec, CPUTwin: twin})
				if err != nil {
					t.Fatalf("%s: %v", prec, err)
				}
				runs := map[string]map[int]int{"cuda": {}, "cpu": {}}
				for _, lc := range lcs {
					t.Logf("%s: %+v", prec, lc)
					if !lc.Pass {
						t.Errorf("%s: %+v", prec, lc)
					}
					runs[lc.Device][lc.Layer]++
				}
				if len(runs["cuda"]) != len(all) {
					t.Errorf("%s: GPU checks of layers %v, the output's MoE layers are %v", prec, runs["cuda"], all)
				}
				for l, n := range runs["cuda"] {
					if runs["cpu"][l] != n || (tc.o.Slots > 0) != (n > 1) {
						t.Errorf("%s: layer %d: %d GPU and %d CPU replica choices with --slots %d", prec, l, n, runs["cpu"][l], tc.o.Slots)
					}
				}
				want := judge.TolGPUBF16.MaxRelL2
				if prec == gpurun.PrecisionF32 {
					want = judge.TolGPUF32.MaxRelL2
					if roundedFold {
						want = judge.TolBF16Fold.MaxRelL2
					}
				}
				for _, lc := range lcs {
					if lc.Device == "cuda" && lc.Tolerance != want {
						t.Errorf("%s: layer %d tolerance %g, want %g", prec, lc.Layer, lc.Tolerance, want)
					}
				}
			}
		})
	}
}

// A slot holding the wrong expert: rank 3 holds physical slots 15..19,
// experts 15, 0, 1, 2, 3 (the replicas of 0..3 last); its slots 2 and 4
// (the last replicas of experts 1 and 3) swapped in every stack of layer
// 2, past the manifest. Layer 2 through each expert's last replica fails,
// on the GPU and on the CPU twin alike (measured 0.39 relative L2 on the
// CPU); through the first replicas, and layer 1 throughout, it passes.
func TestGPURecomposedWrongSlot(t *testing.T) {
	gputest.Need(t)
	ctx := context.Background()
	src := filepath.Join(hfDir, "deepseek-v3-bf16")
	dst := convertTo(t, convert.Options{Src: src, EP: 4, Slots: 20})
	c, err := readContract(dst)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ExpertParallel.PhysicalToLogical[1][15:]; !slices.Equal(got, []int{15, 0, 1, 2, 3}) {
		t.Fatalf("rank 3 of layer 2 holds experts %v", got)
	}
	shard := layout.RankDir(3, 4) + "/model-00001-of-00001.safetensors"
	for _, p := range []string{"gate", "up", "down"} {
		swapSlots(t, filepath.Join(dst, shard), "model.layers.2.mlp.experts.all_"+p+".weight", 2, 4)
	}
	rehash(t, dst, shard)
	lcs, err := CheckRecomposed(ctx, src, dst, Options{Tokens: 16, Seed: 7, GPU: true, Precision: gpurun.PrecisionBF16, CPUTwin: map[int]bool{1: true, 2: true}})
	if err != nil {
		t.Fatal(err)
	}
	var failed, ran []string
	for _, lc := range lcs {
		t.Logf("%+v", lc)
		run := fmt.Sprintf("%s layer %d replica %d", lc.Device, lc.Layer, lc.Replica)
		ran = append(ran, run)
		if !lc.Pass {
			failed = append(failed, run)
			if lc.RelL2 < 0.1 {
				t.Errorf("%s: relative L2 %.3g: two experts swapped should move it by more", run, lc.RelL2)
			}
		}
	}
	if want := []string{"cuda layer 2 replica 1", "cpu layer 2 replica 1"}; !slices.Equal(failed, want) || len(ran) != 8 {
		t.Errorf("failed %v of %v, want %v of 8 runs", failed, ran, want)
	}
}

// Without a GPU, a GPU recomposition is the error --device cuda reports
// (gpurun.ErrDeviceUnavailable), before anything runs.
func TestGPURecomposedWithoutGPU(t *testing.T) {
	if cuda.Available() == nil {
		t.Skip("a GPU is present")
	}
	src := filepath.Join(hfDir, "qwen3-moe")
	dst := convertTo(t, convert.Options{Src: src, EP: 2})
	_, err := CheckRecomposed(context.Background(), src, dst, Options{Tokens: 4, GPU: true, Precision: gpurun.PrecisionBF16})
	if !errors.Is(err, gpurun.ErrDeviceUnavailable) {
		t.Fatalf("got %v, want ErrDeviceUnavailable", err)
	}
}

// Every combination TestRankProofEveryFixture proves on the CPU is
// recomposed on the GPU too (bf16, every layer, each replica choice, no
// CPU twin: that test runs it), or the GPU's refusal policy
// (GPURefusal, what --device auto falls back on) names why not. A
// refusal counts by its text; the test logs the counts.
func TestGPURecomposedEveryFixture(t *testing.T) {
	gputest.Need(t)
	var mu sync.Mutex
	pass, refused := map[string]int{}, map[string]int{}
	t.Run("fixtures", func(t *testing.T) {
		eachCombo(t, func(t *testing.T, f hf.Fixture, name string, o convert.Options, _ refusal, skip bool) {
			if skip {
				return // refused by convert: TestRankProofEveryFixture holds it
			}
			ctx := context.Background()
			if _, err := convert.Convert(ctx, o); err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			why, err := GPURefusal(o.Src, o.Dst, gpurun.PrecisionBF16)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			mu.Lock()
			defer mu.Unlock() // one GPU: one recomposition at a time
			if why != "" {
				t.Logf("%s %s: GPU refuses: %s", f.Dir, name, why)
				refused[why]++
				return
			}
			lcs, err := CheckRecomposed(ctx, o.Src, o.Dst, Options{Tokens: 16, Seed: 7, GPU: true, Precision: gpurun.PrecisionBF16})
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			worst, onCPU := 0.0, 0
			for _, lc := range lcs {
				if !lc.Pass || (lc.Device != "cuda" && lc.Note == "") {
					t.Errorf("%s: %+v", name, lc)
				}
				if lc.Device != "cuda" {
					onCPU++
				}
				worst = max(worst, lc.RelL2)
			}
			if len(lcs) == 0 {
				t.Errorf("%s: nothing recomposed", name)
			}
			t.Logf("%s %s: %d checks (%d on the CPU), worst rel L2 %.3g", f.Dir, name, len(lcs), onCPU, worst)
			pass[name]++
		})
	})
	t.Logf("GPU pass by combination: %v; refused: %v", pass, refused)
}
