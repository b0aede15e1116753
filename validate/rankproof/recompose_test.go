package rankproof

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
)

// The routed experts of every MoE layer, served slot by slot from the
// ranks (each logical expert through its first, then its last replica,
// the MoE-TP parts summed), compute what SRC's experts compute.
func TestRecomposedRanksEqualSource(t *testing.T) {
	fp8 := fp8I256(t)
	for _, tc := range []struct {
		name string
		o    convert.Options
		tol  float64 // relative L2; 0: bit for bit
	}{
		{"deepseek-v3-bf16 ep4 slots20", convert.Options{Src: filepath.Join(hfDir, "deepseek-v3-bf16"), EP: 4, Slots: 20}, 0},
		{"deepseek-v3-bf16 ep2 moe-tp2 gate-up", convert.Options{Src: filepath.Join(hfDir, "deepseek-v3-bf16"), EP: 2, MoETP: 2, Layout: layout.GateUp}, 1e-6},
		{"deepseek-v3-fp8 fuse folded ep4 slots20", convert.Options{Src: filepath.Join(hfDir, "deepseek-v3-fp8"), EP: 4, Slots: 20, FuseShared: true}, 1e-6},
		{"fp8 I256 ep2 moe-tp2 up-gate", convert.Options{Src: fp8, EP: 2, MoETP: 2, Layout: layout.UpGate}, 1e-6},
		{"qwen3-moe ep2 moe-tp2 slots10", convert.Options{Src: filepath.Join(hfDir, "qwen3-moe"), EP: 2, MoETP: 2, Slots: 10}, 1e-6},
		{"mixtral ep2 moe-tp4", convert.Options{Src: filepath.Join(hfDir, "mixtral"), EP: 2, MoETP: 4}, 1e-6},
		{"deepseek-v3-int4 ep4", convert.Options{Src: filepath.Join(hfDir, "deepseek-v3-int4"), EP: 4}, 0},
		{"deepseek-v3-nvfp4 ep2 moe-tp2", convert.Options{Src: filepath.Join(hfDir, "deepseek-v3-nvfp4"), EP: 2, MoETP: 2}, 1e-6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := convertTo(t, tc.o)
			fp := cktest.Plan(t, tc.o.Src)
			const T = 32
			rng := rand.New(rand.NewPCG(1, 2))
			x := make([]float32, T*fp.HiddenSize)
			for k := range x {
				x[k] = float32(rng.NormFloat64())
			}
			for i := range fp.Layers {
				for _, last := range []bool{false, true} {
					rep := 0
					if last {
						rep = 1 << 20 // every expert's last replica
					}
					res, err := RecomposeRouted(context.Background(), tc.o.Src, dst, i, x, T, rep, 5)
					if err != nil {
						t.Fatal(err)
					}
					var d, n float64
					for k := range res.Want {
						d += math.Pow(float64(res.Got[k]-res.Want[k]), 2)
						n += math.Pow(float64(res.Want[k]), 2)
					}
					if n == 0 {
						t.Fatalf("layer %d: SRC's routed output is zero", i)
					}
					if rel := math.Sqrt(d / n); rel > tc.tol {
						t.Errorf("layer %d (last replica %v): relative L2 %.3g, want <= %g", i, last, rel, tc.tol)
					}
				}
			}
		})
	}
}

// CheckRecomposed judges every layer through both replicas, a folded
// bf16 rsf within its own tolerance.
func TestCheckRecomposed(t *testing.T) {
	src := filepath.Join(hfDir, "deepseek-v3-bf16")
	for _, tc := range []struct {
		name string
		o    convert.Options
		tol  float64
		runs int
	}{
		{"ep4 slots20", convert.Options{Src: src, EP: 4, Slots: 20}, tolSum, 4},                                                        // 2 replicas of 4 experts
		{"ep4 slots36", convert.Options{Src: src, EP: 4, Slots: 36}, tolSum, 6},                                                        // 3 replicas of 4
		{"fold down ep2 moe-tp2", convert.Options{Src: src, EP: 2, MoETP: 2, FuseShared: true, FoldScaling: "down"}, tolFoldedBF16, 2}, // no replicas
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := convertTo(t, tc.o)
			got, err := CheckRecomposed(context.Background(), src, dst, Options{Tokens: 16, Seed: 7})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tc.runs {
				t.Fatalf("%d checks, want %d (layers x replica choices)", len(got), tc.runs)
			}
			for _, lc := range got {
				t.Logf("%+v", lc)
				if !lc.Pass || lc.Tolerance != tc.tol {
					t.Errorf("%+v", lc)
				}
			}
		})
	}
}

// Options.Layers picks the layers recomposed, by the contract's index;
// an empty list recomposes none, nil every one.
func TestCheckRecomposedLayers(t *testing.T) {
	src := filepath.Join(hfDir, "qwen3-moe") // MoE layers 1 and 2
	dst := convertTo(t, convert.Options{Src: src, EP: 2, MoETP: 2})
	for _, tc := range []struct {
		layers []int
		want   []int
	}{
		{nil, []int{1, 2}},
		{[]int{2}, []int{2}},
		{[]int{1}, []int{1}},
		{[]int{}, nil},
	} {
		got, err := CheckRecomposed(context.Background(), src, dst, Options{Tokens: 8, Seed: 3, Layers: tc.layers})
		if err != nil {
			t.Fatal(err)
		}
		var layers []int
		for _, lc := range got {
			if !lc.Pass || lc.Device != "cpu" || lc.RelL2 > tolSum {
				t.Errorf("%v: %+v", tc.layers, lc)
			}
			layers = append(layers, lc.Layer)
		}
		if !slices.Equal(layers, tc.want) {
			t.Errorf("Layers %v: recomposed %v, want %v", tc.layers, layers, tc.want)
		}
	}
	all, rec, err := Layers(src, dst)
	if err != nil || !slices.Equal(all, []int{1, 2}) || !slices.Equal(rec, all) {
		t.Errorf("Layers: %v %v %v", all, rec, err)
	}
}
