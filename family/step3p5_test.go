package family_test

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/layout"
)

// TestStepHubConfig: Step-3.5's hub keys plan as transformers reads them
// (moe_top_k, moe_layers_enum with the MTP layer's index past the model,
// per-layer lists padded with num_nextn_predict_layers entries), each
// layer's limits become that layer's activations, and malformed lists are
// refused naming the key.
func TestStepHubConfig(t *testing.T) {
	capped := func(l float64) layout.Activation { return layout.Activation{Limit: l, ClampAfter: true} }
	hub := func(c map[string]any) {
		delete(c, "mlp_layer_types")
		delete(c, "num_experts_per_tok")
		c["moe_top_k"] = 3.0
		c["moe_layers_enum"] = "1,2,3,4" // 4 is the MTP layer (num_hidden_layers 4)
		c["num_nextn_predict_layers"] = 1.0
		c["swiglu_limits"] = []any{0.0, 0.0, nil, 7.0, 7.0}
		c["swiglu_limits_shared"] = []any{0.0, 0.0, 16.0, 16.0, 16.0}
	}
	p, err := synthPlan(t, "small-step3p5", hub)
	if err != nil {
		t.Fatal(err)
	}
	var layers []int
	for _, l := range p.Layers {
		layers = append(layers, l.Index)
	}
	if got := fmt.Sprint(layers); p.TopK != 3 || got != "[1 2 3]" {
		t.Fatalf("top-k %d, MoE layers %s; want 3, [1 2 3]", p.TopK, got)
	}
	for _, c := range []struct {
		layer          int
		routed, shared layout.Activation
	}{
		{1, layout.Activation{}, layout.Activation{}},
		{2, layout.Activation{}, capped(16)},
		{3, capped(7), capped(16)},
	} {
		l := p.Layers[c.layer-1]
		if r, s := p.RoutedAct(l), p.SharedActOf(l); r != c.routed || s != c.shared {
			t.Errorf("layer %d: routed %+v shared %+v, want %+v and %+v", c.layer, r, s, c.routed, c.shared)
		}
	}
	for _, bad := range []struct {
		edit func(map[string]any)
		want string
	}{
		{func(c map[string]any) { c["swiglu_limits"] = []any{0.0, 7.0} }, "swiglu_limits"},
		{func(c map[string]any) { c["swiglu_limits"] = []any{0.0, 0.0, 0.0, 0.0, 0.0, 0.0} }, "num_nextn_predict_layers=1"},
		{func(c map[string]any) { c["swiglu_limits_shared"] = []any{0.0, 0.0, -1.0, 0.0} }, "swiglu_limits_shared[2]"},
		{func(c map[string]any) { c["moe_layers_enum"] = "1,x" }, `moe_layers_enum entry "x"`},
		{func(c map[string]any) { c["moe_layers_enum"] = 3.0 }, "moe_layers_enum is float64"},
		{func(c map[string]any) { c["moe_layers_enum"] = strings.Repeat(",", 1<<20) }, "moe_layers_enum has 1048577 entries"},
	} {
		_, err := synthPlan(t, "small-step3p5", func(c map[string]any) {
			hub(c)
			bad.edit(c)
		})
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("error %v, want one naming %q", err, bad.want)
		}
	}
	// The synth preset's own mlp_layer_types and unpadded lists: unchanged by the lift.
	p, err = synthPlan(t, "small-step3p5", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Layers) != 3 || !maps.Equal(p.ActByLayer, map[int]layout.Activation{2: capped(0.05), 3: capped(0.05)}) {
		t.Errorf("small-step3p5: %d layers, per-layer activations %v", len(p.Layers), p.ActByLayer)
	}
}
