package family

import (
	"fmt"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// stack turns a synthetic checkpoint into what convert writes: per-expert
// tensors replaced by stacked banks, optionally the shared expert fused away.
func stack(t *testing.T, g gen, f *MemTensors, dropShared bool) {
	for _, name := range append([]string(nil), f.Names()...) {
		if strings.Contains(name, ".experts.") || (dropShared && strings.Contains(name, ".shared_experts.")) {
			del(t, f, name)
		}
	}
	for _, l := range g.moe {
		f.Add(fmt.Sprintf("model.layers.%d.mlp.experts.all_gate.weight", l), safetensors.F8E4M3, int64(g.e), g.i, g.h)
	}
}

func TestPlanConverted(t *testing.T) {
	for _, dropShared := range []bool{false, true} {
		t.Run(fmt.Sprint("fused shared ", dropShared), func(t *testing.T) {
			g := deepseekV3FP8Gen().with(map[string]any{
				"moeprep":          map[string]any{"version": "0.1", "num_experts": 4, "num_fused_shared_experts": 1},
				"n_routed_experts": 5, // a serving engine's count after fusion; the moeprep section wins
			})
			cfg, tensors := g.build(t)
			stack(t, g, tensors, dropShared)
			if _, err := Detect(cfg, tensors); err == nil || !strings.HasPrefix(err.Error(), "already converted by moeprep") {
				t.Fatalf("Detect error = %v", err)
			}
			p, err := PlanConverted(cfg, tensors)
			if err != nil {
				t.Fatal(err)
			}
			if p.NumExperts != 4 || p.Quantization != QuantFP8Block || p.ScaleFmt != "ue8m0" || len(p.Layers) != 2 {
				t.Fatalf("plan %+v", p)
			}
			want := g.wantLayers()
			for i, l := range p.Layers {
				if l.Experts != nil {
					t.Errorf("layer %d: Experts = %d entries, want nil", l.Index, len(l.Experts))
				}
				if l.Router != want[i].Router || l.RouterBias != want[i].RouterBias || l.MTP != want[i].MTP || l.Prefix != want[i].Prefix {
					t.Errorf("layer %d: got %+v", l.Index, l)
				}
				if dropShared != (l.Shared == nil) {
					t.Errorf("layer %d: Shared = %v with shared dropped %v", l.Index, l.Shared, dropShared)
				}
				if !dropShared && *l.Shared != *want[i].Shared {
					t.Errorf("layer %d: Shared = %+v, want %+v", l.Index, *l.Shared, *want[i].Shared)
				}
			}
			wantDType := safetensors.F8E4M3
			if dropShared {
				wantDType = ""
			}
			if p.WeightDType != wantDType {
				t.Errorf("WeightDType = %q, want %q", p.WeightDType, wantDType)
			}
		})
	}
}

// PlanConverted still checks what it plans.
func TestPlanConvertedChecksRouters(t *testing.T) {
	g := deepseekV3Gen().with(map[string]any{"moeprep": map[string]any{"num_experts": 8}})
	cfg, tensors := g.build(t)
	del(t, tensors, "model.layers.3.mlp.gate.e_score_correction_bias")
	_, err := PlanConverted(cfg, tensors)
	if err == nil || !strings.HasPrefix(err.Error(), "layer 3: router bias: missing tensor model.layers.3.mlp.gate.e_score_correction_bias") {
		t.Errorf("err = %v", err)
	}
}
