package family

import (
	"testing"
)

// BenchmarkDetectDeepSeekV3 plans a full-size DeepSeek-V3 FP8 tensor table
// (61 layers + MTP, 256 experts, ~90k tensors).
func BenchmarkDetectDeepSeekV3(b *testing.B) {
	g := deepseekV3FP8Gen().with(map[string]any{"hidden_size": 7168, "moe_intermediate_size": 2048,
		"n_routed_experts": 256, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
		"first_k_dense_replace": 3, "num_hidden_layers": 61})
	g.h, g.i, g.e, g.sharedI, g.layers, g.mtp = 7168, 2048, 256, 2048, 61, []int{61}
	g.moe = nil
	for l := 3; l <= 61; l++ {
		g.moe = append(g.moe, l)
	}
	cfg, tensors := g.build(b)
	b.ReportMetric(float64(len(tensors.Names())), "tensors")
	for b.Loop() {
		p, err := Detect(cfg, tensors)
		if err != nil || len(p.Layers) != 59 {
			b.Fatal(err)
		}
	}
}
