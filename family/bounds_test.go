package family

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/moeprep/moeprep/internal/costtest"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
)

// Hostile config.json numbers (issue 26): num_hidden_layers 100,000,000 cost
// 3.0 GB and 2,147,483,647 ran the Go runtime out of memory. Every count
// that sizes an allocation or a loop is bounded before it is used, and the
// error is one line naming config.json, the field and the limit.

// layerStubs is a checkpoint of n decoder layers holding one norm each: the
// planner must refuse a hostile config before it looks further.
func layerStubs(n int) *MemTensors {
	f := &MemTensors{}
	for l := range n {
		f.Add(fmt.Sprintf("model.layers.%d.input_layernorm.weight", l), safetensors.BF16, 32)
	}
	return f
}

func TestPlanBoundsConfigCounts(t *testing.T) {
	listOf := func(n int, v any) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	v4 := map[string]any{"model_type": "deepseek_v4", "hidden_size": 32, "moe_intermediate_size": 16,
		"n_routed_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 1, "mlp_layer_types": []any{"hash_moe"}}
	hugeTable := &MemTensors{}
	hugeTable.Add("model.layers.0.ffn.gate.weight", safetensors.BF16, 4, 32)
	hugeTable.Add("model.layers.0.ffn.gate.tid2eid", safetensors.I64, 1<<40, 2)
	cases := []struct {
		name    string
		g       gen
		tensors *MemTensors // nil: the generator's
		want    string      // the exact error
	}{
		{"100M layers (3.0 GB before)", qwenBig().with(map[string]any{"num_hidden_layers": 100_000_000}), nil,
			"config.json: num_hidden_layers=100000000 is over the limit of 4096 (the deepest released models have about 130)"},
		{"2^31-1 layers (out of memory before)", qwenBig().with(map[string]any{"num_hidden_layers": 1<<31 - 1}), nil,
			"config.json: num_hidden_layers=2147483647 is over the limit of 4096 (the deepest released models have about 130)"},
		{"4096 layers, tensors for 6", qwenBig().with(map[string]any{"num_hidden_layers": 4096}), nil,
			"config.json: num_hidden_layers=4096, but the checkpoint holds no tensor of layers 6 to 4095 (none named model.layers.6.*): truncated, or the config.json of another model"},
		{"no layer tensors at all", qwenBig(), layerStubs(0),
			"config.json: num_hidden_layers=6, but the checkpoint holds no tensor of layers 0 to 5 (none named model.layers.0.*): truncated, or the config.json of another model"},
		{"a million experts", qwenBig().with(map[string]any{"num_local_experts": 1 << 20}), nil,
			"config.json: num_local_experts=1048576 is over the limit of 16384 (released models route over at most 512)"},
		{"expert slots", qwen3MoEGen().with(map[string]any{"num_local_experts": 16384, "num_hidden_layers": 20, "mlp_only_layers": []any{}}), layerStubs(20),
			"config.json: 20 MoE layers of 16384 routed and 0 shared experts are 327680 experts to plan, over the limit of 262144 (released models have about 25,000)"},
		{"hidden_size", qwenBig().with(map[string]any{"hidden_size": 1 << 20}), nil,
			"config.json: hidden_size=1048576 is over the limit of 65536 (the widest released models have 16,384)"},
		{"expert width", qwenBig().with(map[string]any{"moe_intermediate_size": 1 << 30}), nil,
			"config.json: moe_intermediate_size=1073741824 is over the limit of 262144 (released experts are at most 14,336 wide)"},
		{"shared experts", deepseekV3Gen().with(map[string]any{"n_shared_experts": 1 << 30}), nil,
			"config.json: n_shared_experts=1073741824 is over the limit of 1024 (released models have one to eight)"},
		{"shared width", deepseekV3Gen().with(map[string]any{"n_shared_experts": 1024, "moe_intermediate_size": 1024}), nil,
			"config.json: n_shared_experts=1024 experts of moe_intermediate_size=1024 make a shared MLP 1048576 wide, over the limit of 262144"},
		{"shared width, own key", qwen2MoEGen().with(map[string]any{"shared_expert_intermediate_size": 1 << 30}), nil,
			"config.json: shared_expert_intermediate_size=1073741824 is over the limit of 262144 (released shared MLPs are at most 20,480 wide)"},
		{"mlp_only_layers of 5000", qwenBig().with(map[string]any{"mlp_only_layers": listOf(5000, 0)}), nil,
			"config.json: mlp_only_layers: 5000 entries, over the limit of 4096"},
		{"mlp_layer_types of a million", gen{cfg: map[string]any{"model_type": "hy_v3", "hidden_size": 32, "moe_intermediate_size": 16,
			"num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2, "mlp_layer_types": listOf(1_000_000, "sparse")}}, layerStubs(2),
			"config.json: mlp_layer_types: 1000000 entries, over the limit of 4096"},
		{"hash table of 2^40 rows", gen{cfg: v4}, hugeTable,
			"layer 0: hash routing table model.layers.0.ffn.gate.tid2eid has 1099511627776 rows, over the limit of 4194304 (vocabularies run to about 256,000)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, f := tc.g.build(t)
			if tc.tensors != nil {
				f = tc.tensors
			}
			var p *Plan
			var err error
			alloc, took := costtest.Measure(func() { p, err = Detect(cfg, f) })
			if err == nil {
				t.Fatalf("planned %d layers, want %q", len(p.Layers), tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("error\n got %q\nwant %q", err, tc.want)
			}
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Errorf("multi-line error %q", err)
			}
			// The planner builds nothing sized by the hostile number: what
			// is left is the tensor-name grouping and the small loops over
			// at most maxLayers layers.
			testkit.CheckCost(t, alloc, 1<<20, took, testkit.RefusalTime)
		})
	}
}

// TestPlanAtTheLimits: a config at the limits that the tensors bear out is
// still planned, in bounded time.
func TestPlanAtTheLimits(t *testing.T) {
	only := make([]any, maxConfigList)
	for i := range only {
		only[i] = i * 100 // layer 0, then layers past the last: they name none
	}
	cfg, f := qwen3MoEGen().with(map[string]any{"mlp_only_layers": only}).build(t)
	if _, err := Detect(cfg, f); err != nil {
		t.Fatalf("mlp_only_layers of %d entries: %v", maxConfigList, err)
	}
	g := mixtralGen().with(map[string]any{"num_hidden_layers": maxLayers})
	g.layers, g.moe = maxLayers, make([]int, maxLayers)
	for l := range g.moe {
		g.moe[l] = l
	}
	cfg, f = g.build(t)
	var p *Plan
	var err error
	alloc, took := costtest.Measure(func() { p, err = Detect(cfg, f) })
	if err != nil || len(p.Layers) != maxLayers {
		t.Fatalf("%d layers: %v", maxLayers, err)
	}
	// Alone it takes 0.5-0.9 s on a 2-core machine; go test runs packages
	// side by side, and on a loaded machine it was seen at 2.2-4.6 s. A plan
	// that grew worse than linear in the layers would take minutes here.
	if took > 8*time.Second {
		t.Errorf("planning %d layers took %v", maxLayers, took)
	}
	t.Logf("%d layers of %d experts planned: %.1f MB, %v", maxLayers, g.e, float64(alloc)/1e6, took)
}
