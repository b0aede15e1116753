package family

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/safetensors"
)

// readHeaders builds a Tensors from the safetensors headers in dir. It is a
// minimal reader of its own so this package's tests do not depend on the
// safetensors package's reader.
func readHeaders(t *testing.T, dir string) *fakeTensors {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if len(files) == 0 {
		t.Fatalf("%s: no safetensors files", dir)
	}
	out := &fakeTensors{meta: map[string]TensorMeta{}}
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		if err := binary.Read(f, binary.LittleEndian, &n); err != nil || n > 1<<24 {
			t.Fatalf("%s: header length %d: %v", path, n, err)
		}
		raw := make([]byte, n)
		if _, err := io.ReadFull(f, raw); err != nil {
			t.Fatal(err)
		}
		f.Close()
		var header map[string]json.RawMessage
		if err := json.Unmarshal(raw, &header); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for name, v := range header {
			if name == "__metadata__" {
				continue
			}
			var info struct {
				DType string  `json:"dtype"`
				Shape []int64 `json:"shape"`
			}
			if err := json.Unmarshal(v, &info); err != nil {
				t.Fatalf("%s: %s: %v", path, name, err)
			}
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
			raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
			if os.IsNotExist(err) {
				t.Skipf("%s not present", dir)
			}
			if err != nil {
				t.Fatal(err)
			}
			var cfg map[string]any
			if err := json.Unmarshal(raw, &cfg); err != nil {
				t.Fatal(err)
			}
			p, err := Detect(cfg, readHeaders(t, dir))
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
