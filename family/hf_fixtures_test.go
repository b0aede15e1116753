package family

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/moeprep/moeprep/fixtures/hf"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/safetensors"
)

// readHeaders builds a Tensors from the safetensors headers in dir, read
// by testkit so this package's tests do not depend on the safetensors
// package's reader.
func readHeaders(t *testing.T, dir string) *MemTensors {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if len(files) == 0 {
		t.Fatalf("%s: no safetensors files", dir)
	}
	out := &MemTensors{}
	for _, path := range files {
		h, err := testkit.ReadSTHeader(path)
		if err != nil {
			t.Fatal(err)
		}
		for name, info := range h.Tensors {
			out.Add(name, safetensors.DType(info.DType), info.Shape...)
		}
	}
	return out
}

// The safetensors checkpoints fixtures/hf/export.py wrote with transformers
// 5 itself plan as their index rows say (family, routed and shared experts,
// MoE layers, scoring, groups, quantisation), with the weight dtype, top-k
// method and shared gate exportPyPlans gives. (The other fixtures' stacked
// and packed experts need the checkpoint reader's views, which readHeaders
// does not give: cmd/moeprep's TestInspectJSONOnHFFixtures holds every row.)
func TestPlanHFFixtures(t *testing.T) {
	for _, f := range hf.Pick(t, exportPyPlans) {
		d := exportPyPlans[f.Dir]
		t.Run(f.Dir, func(t *testing.T) {
			dir := filepath.Join("..", "fixtures", "hf", f.Dir)
			p, err := Detect(testkit.ReadJSON(t, filepath.Join(dir, "config.json")), readHeaders(t, dir))
			if err != nil {
				t.Fatalf("Detect: %v", err)
			}
			var idx []int
			for _, l := range p.Layers {
				idx = append(idx, l.Index)
				if len(l.Experts) != f.Experts || (l.Shared != nil) != (f.Shared > 0) {
					t.Errorf("layer %d: %d experts, shared %v", l.Index, len(l.Experts), l.Shared)
				}
			}
			got := []any{p.Family, p.NumExperts, p.NumSharedExperts, idx, string(p.Quantization), string(p.Scoring), p.NGroup}
			want := []any{f.Family, f.Experts, f.Shared, f.MoELayers, string(f.Format), f.Scoring, f.NGroup}
			got = append(got, p.WeightDType, p.TopKMethod, p.SharedGated)
			want = append(want, d.dtype, d.method, d.sharedGated)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %v\nwant %v", got, want)
			}
		})
	}
}

// exportPyPlans is what the index does not say of the plans of export.py's
// safetensors checkpoints.
var exportPyPlans = map[string]struct {
	dtype       safetensors.DType
	method      moe.TopKMethod
	sharedGated bool
}{
	"deepseek-v2-lite": {safetensors.BF16, moe.TopKGreedy, false},
	"deepseek-v3-bf16": {safetensors.BF16, moe.TopKNoAuxTC, false},
	"deepseek-v3-fp8":  {safetensors.F8E4M3, moe.TopKNoAuxTC, false},
	"mixtral":          {safetensors.BF16, moe.TopKGreedy, false},
	"qwen2-moe":        {safetensors.BF16, moe.TopKGreedy, true},
	"qwen3-moe":        {safetensors.BF16, moe.TopKGreedy, false},
}
