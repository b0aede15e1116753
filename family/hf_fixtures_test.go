package family

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/safetensors"
)

// readHeaders builds a Tensors from the safetensors headers in dir, read
// by testkit so this package's tests do not depend on the safetensors
// package's reader.
func readHeaders(t *testing.T, dir string) *fakeTensors {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if len(files) == 0 {
		t.Fatalf("%s: no safetensors files", dir)
	}
	out := &fakeTensors{meta: map[string]TensorMeta{}}
	for _, path := range files {
		h, err := testkit.ReadSTHeader(path)
		if err != nil {
			t.Fatal(err)
		}
		for name, info := range h.Tensors {
			out.add(name, safetensors.DType(info.DType), info.Shape...)
		}
	}
	return out
}

// The checkpoints fixtures/hf/export.py wrote with transformers 5 itself.
func TestPlanHFFixtures(t *testing.T) {
	cases := []struct {
		dir      string
		family   string
		experts  int
		shared   int
		layers   []int
		dtype    safetensors.DType
		quant    Quantization
		scoring  moe.Scoring
		method   moe.TopKMethod
		ngroup   int
		sharedGt bool
	}{
		{"deepseek-v2-lite", "deepseek", 8, 2, []int{1, 2}, safetensors.BF16, QuantNone, moe.Softmax, moe.TopKGreedy, 1, false},
		{"deepseek-v3-bf16", "deepseek", 16, 1, []int{1, 2}, safetensors.BF16, QuantNone, moe.Sigmoid, moe.TopKNoAuxTC, 4, false},
		{"deepseek-v3-fp8", "deepseek", 16, 1, []int{1, 2}, safetensors.F8E4M3, QuantFP8Block, moe.Sigmoid, moe.TopKNoAuxTC, 4, false},
		{"mixtral", "mixtral", 8, 0, []int{0, 1}, safetensors.BF16, QuantNone, moe.Softmax, moe.TopKGreedy, 1, false},
		{"qwen2-moe", "qwen2_moe", 8, 1, []int{0, 1}, safetensors.BF16, QuantNone, moe.Softmax, moe.TopKGreedy, 1, true},
		{"qwen3-moe", "qwen3_moe", 8, 0, []int{1, 2}, safetensors.BF16, QuantNone, moe.Softmax, moe.TopKGreedy, 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.dir, func(t *testing.T) {
			dir := filepath.Join("..", "fixtures", "hf", tc.dir)
			cfg := filepath.Join(dir, "config.json")
			if _, err := os.Stat(cfg); os.IsNotExist(err) {
				t.Skipf("%s not present", dir)
			}
			p, err := Detect(testkit.ReadJSON(t, cfg), readHeaders(t, dir))
			if err != nil {
				t.Fatalf("Detect: %v", err)
			}
			var idx []int
			for _, l := range p.Layers {
				idx = append(idx, l.Index)
				if len(l.Experts) != tc.experts || (l.Shared != nil) != (tc.shared > 0) {
					t.Errorf("layer %d: %d experts, shared %v", l.Index, len(l.Experts), l.Shared)
				}
			}
			got := []any{p.Family, p.NumExperts, p.NumSharedExperts, idx, p.WeightDType, p.Quantization, p.Scoring, p.TopKMethod, p.NGroup, p.SharedGated}
			want := []any{tc.family, tc.experts, tc.shared, tc.layers, tc.dtype, tc.quant, tc.scoring, tc.method, tc.ngroup, tc.sharedGt}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %v\nwant %v", got, want)
			}
		})
	}
}
