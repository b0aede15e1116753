package family

import (
	"strings"
	"testing"
)

// TestNemotronHConfig: the block types are read as NemotronHConfig reads
// them (the list, its alias, the hub's pattern, the class's default), the
// layer count is the list's, and what moeprep cannot carry is refused in
// one line naming the key.
func TestNemotronHConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  map[string]any
		want string // "" : lifted; else a substring of the error
		n    int    // layers
		moe  []any
	}{
		{"list", map[string]any{"layers_block_type": []any{"linear_attention", "moe", "full_attention", "moe", "mlp"}, "num_hidden_layers": 9.0},
			"", 5, []any{"dense", "sparse", "dense", "sparse", "dense"}},
		{"alias and legacy names", map[string]any{"layer_types": []any{"mamba", "moe", "attention"}}, "", 3, []any{"dense", "sparse", "dense"}},
		{"hub pattern", map[string]any{"hybrid_override_pattern": "MEM*E-"}, "", 6, []any{"dense", "sparse", "dense", "dense", "sparse", "dense"}},
		{"list wins over pattern", map[string]any{"layers_block_type": []any{"moe"}, "hybrid_override_pattern": "M-"}, "", 1, []any{"sparse"}},
		{"class default", map[string]any{}, "", 4, []any{"dense", "sparse", "dense", "dense"}},
		{"unknown block", map[string]any{"hybrid_override_pattern": "ME?"}, `hybrid_override_pattern[2] = "?"`, 0, nil},
		{"unknown type", map[string]any{"layers_block_type": []any{"moe", "conv"}}, `layers_block_type[1] = "conv"`, 0, nil},
		{"empty", map[string]any{"layers_block_type": []any{}}, "has 0 blocks", 0, nil},
		{"hostile pattern", map[string]any{"hybrid_override_pattern": strings.Repeat("E", 1<<20)}, "over the limit", 0, nil},
	} {
		got, err := nemotronHLift(config{m: c.cfg})
		switch {
		case c.want != "":
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%s: %v, want %q", c.name, err, c.want)
			}
		case err != nil:
			t.Errorf("%s: %v", c.name, err)
		default:
			if n, _ := got.m["num_hidden_layers"].(float64); int(n) != c.n {
				t.Errorf("%s: %v layers, want %d", c.name, got.m["num_hidden_layers"], c.n)
			}
			if types, _ := got.m["mlp_layer_types"].([]any); len(types) != len(c.moe) || strings.Join(strs(types), ",") != strings.Join(strs(c.moe), ",") {
				t.Errorf("%s: %v, want %v", c.name, types, c.moe)
			}
		}
	}
	for _, c := range []struct {
		cfg  map[string]any
		want string
	}{
		{map[string]any{"moe_latent_size": 1024.0}, "moe_latent_size=1024"},
		{map[string]any{"mlp_hidden_act": "silu"}, `mlp_hidden_act "silu"`},
		{map[string]any{"mlp_bias": true}, "mlp_bias is true"},
		{map[string]any{"quantization_config": map[string]any{"quant_method": "fp8"}}, "unquantised"},
	} {
		if err := nemotronHRefuse(config{m: c.cfg}); err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v, want %q", c.cfg, err, c.want)
		}
	}
	if err := nemotronHRefuse(config{m: map[string]any{"moe_latent_size": nil, "mlp_hidden_act": "relu2"}}); err != nil {
		t.Errorf("Nano's config refused: %v", err)
	}
}

func strs(l []any) []string {
	out := make([]string, len(l))
	for i, v := range l {
		out[i], _ = v.(string)
	}
	return out
}
