package family

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

// ernieVLFixture is the transformers-written ERNIE-4.5-VL fixture's
// config.json and tensor metadata.
func ernieVLFixture(t *testing.T) (map[string]any, *MemTensors) {
	t.Helper()
	d := filepath.Join("..", "fixtures", "hf", "ernie4-5-vl-moe")
	cfg := testkit.ReadJSON(t, filepath.Join(d, "config.json"))
	sf, err := safetensors.Open(filepath.Join(d, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	ts := &MemTensors{}
	for _, ti := range sf.Tensors {
		ts.Add(ti.Name, ti.DType, ti.Shape...)
	}
	return cfg, ts
}

// TestErnieVLPlan: each MoE layer of the fixture is planned as two banks,
// both at the decoder layer's index, the text bank's Key that index and the
// vision bank's it plus 65536, each with its own router (a transposed view of its stored
// [H, E] router), correction bias row, experts (the vision bank's are the
// stored E..2E-1) and width, and the one shared MLP.
func TestErnieVLPlan(t *testing.T) {
	cfg, ts := ernieVLFixture(t)
	p, err := Detect(cfg, ts)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		index, key           int
		bank                 Bank
		router, bias, expert string
		inter                int
	}
	wants := []want{
		{1, 1, BankText, "model.layers.1.mlp.gate.weight[T:0:8:1]", "model.layers.1.mlp.moe_statics.e_score_correction_bias[0:1]", "model.layers.1.mlp.experts.5.up_proj.weight", 32},
		{2, 2, BankText, "model.layers.2.mlp.gate.weight[T:0:8:1]", "model.layers.2.mlp.moe_statics.e_score_correction_bias[0:1]", "model.layers.2.mlp.experts.5.up_proj.weight", 32},
		{1, 65537, BankVision, "model.layers.1.mlp.gate.weight_1[T:0:8:1]", "model.layers.1.mlp.moe_statics.e_score_correction_bias[1:2]", "model.layers.1.mlp.experts.13.up_proj.weight", 16},
		{2, 65538, BankVision, "model.layers.2.mlp.gate.weight_1[T:0:8:1]", "model.layers.2.mlp.moe_statics.e_score_correction_bias[1:2]", "model.layers.2.mlp.experts.13.up_proj.weight", 16},
	}
	if len(p.Layers) != len(wants) || p.NumExperts != 8 || p.MoEIntermediateSize != 32 || p.SharedIntermediateSize != 32 {
		t.Fatalf("%d layers, E %d, I %d, shared I %d", len(p.Layers), p.NumExperts, p.MoEIntermediateSize, p.SharedIntermediateSize)
	}
	for i, w := range wants {
		l := p.Layers[i]
		got := want{l.Index, l.Key(), l.Bank, l.Router, l.RouterBias, l.Experts[5].Weight(layout.ProjUp), p.IntermediateOf(l)}
		if got != w {
			t.Errorf("layer %d:\n got %+v\nwant %+v", i, got, w)
		}
		if l.Shared == nil || l.Shared.Weight(layout.ProjDown) != "model.layers."+strconv.Itoa(l.Index)+".mlp.shared_experts.down_proj.weight" || !strings.HasSuffix(l.Prefix, "."+l.Bank.String()+"_moe") {
			t.Errorf("layer %s: shared %+v prefix %s", l.Label(), l.Shared, l.Prefix)
		}
	}
	if p.Layers[3].Label() != "2 (vision bank)" || p.Layers[1].Label() != "2" {
		t.Errorf("labels: %q %q", p.Layers[3].Label(), p.Layers[1].Label())
	}
}

// TestErnieVLRefusals: what the two banks cannot be read from is refused in
// one line naming the key or tensor.
func TestErnieVLRefusals(t *testing.T) {
	text := func(edit func(m map[string]any)) func(map[string]any, *MemTensors) {
		return func(c map[string]any, _ *MemTensors) { edit(c["text_config"].(map[string]any)) }
	}
	for _, c := range []struct {
		name string
		edit func(map[string]any, *MemTensors)
		want string
	}{
		{"one width", text(func(m map[string]any) { m["moe_intermediate_size"] = 32.0 }), "moe_intermediate_size"},
		{"three widths", text(func(m map[string]any) { m["moe_intermediate_size"] = []any{32.0, 16.0, 8.0} }), "want [text, vision]"},
		{"zero width", text(func(m map[string]any) { m["moe_intermediate_size"] = []any{32.0, 0.0} }), "want [text, vision]"},
		{"no width", text(func(m map[string]any) { delete(m, "moe_intermediate_size") }), "moe_intermediate_size"},
		{"expert counts differ", text(func(m map[string]any) { m["moe_num_experts"] = []any{8.0, 6.0} }), "same count"},
		{"quantised", func(c map[string]any, _ *MemTensors) {
			c["quantization_config"] = map[string]any{"quant_method": "fp8"}
		}, "quantised ERNIE-4.5-VL"},
		{"router not transposed", func(_ map[string]any, ts *MemTensors) {
			ts.Add("model.layers.1.mlp.gate.weight_1", safetensors.BF16, 8, 64)
		}, "router model.layers.1.mlp.gate.weight_1: shape [8 64], want [64, 8]"},
		{"one bias row", func(_ map[string]any, ts *MemTensors) {
			ts.Add("model.layers.2.mlp.moe_statics.e_score_correction_bias", safetensors.F32, 1, 8)
		}, "router bias model.layers.2.mlp.moe_statics.e_score_correction_bias: shape [1 8], want [2, 8]"},
		{"a vision expert narrow", func(_ map[string]any, ts *MemTensors) {
			ts.Add("model.layers.2.mlp.experts.12.up_proj.weight", safetensors.BF16, 8, 64)
		}, "vision bank (experts 8..15, router gate.weight_1): layer 2: expert 12: up_proj shape [8,64], expected [16,64]"},
		{"a vision expert missing", func(_ map[string]any, ts *MemTensors) {
			ts.Delete("model.layers.1.mlp.experts.15.down_proj.weight")
		}, "missing tensor model.layers.1.mlp.experts.15.down_proj.weight"},
		{"an expert past both banks", func(_ map[string]any, ts *MemTensors) {
			ts.Add("model.layers.1.mlp.experts.16.gate_proj.weight", safetensors.BF16, 32, 64)
		}, "tensor model.layers.1.mlp.experts.16.gate_proj.weight: expert 16 is past both routed banks (text 0..7, vision 8..15"},
	} {
		cfg, ts := ernieVLFixture(t)
		c.edit(cfg, ts)
		_, err := Detect(cfg, ts)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
	// The hub's per-bank expert count list, equal, plans as the count.
	cfg, ts := ernieVLFixture(t)
	cfg["text_config"].(map[string]any)["moe_num_experts"] = []any{8.0, 8.0}
	if p, err := Detect(cfg, ts); err != nil || p.NumExperts != 8 {
		t.Errorf("moe_num_experts [8, 8]: %v", err)
	}
}
