package quantdesc

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// tensorNames are a checkpoint's tensor names and each one's rank, as
// ModulesOf reads them.
type tensorNames struct {
	names []string
	rank  map[string]int
}

func (f *tensorNames) add(name string, shape ...int64) {
	f.names = append(f.names, name)
	f.rank[name] = len(shape)
}

func (f *tensorNames) modules() *Modules {
	return ModulesOf(f.names, func(name string) bool { return f.rank[name] >= 2 }, nil)
}

// deepseekSizedNames is the module layout of a DeepSeek-V3-sized
// checkpoint's text layers (61 layers, the first 3 dense, 256 experts):
// 45,000 modules, metadata only.
func deepseekSizedNames() *tensorNames {
	f := &tensorNames{rank: map[string]int{}}
	for l := range 61 {
		pre := fmt.Sprintf("model.layers.%d.", l)
		for _, a := range []string{"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"} {
			f.add(pre+"self_attn."+a+".weight", 8, 8)
		}
		f.add(pre+"self_attn.q_a_layernorm.weight", 8)
		f.add(pre+"input_layernorm.weight", 8)
		if l < 3 {
			for _, p := range []string{"gate_proj", "up_proj", "down_proj"} {
				f.add(pre+"mlp."+p+".weight", 8, 8)
			}
			continue
		}
		f.add(pre+"mlp.gate.weight", 256, 8)
		for _, p := range []string{"gate_proj", "up_proj", "down_proj"} {
			f.add(pre+"mlp.shared_experts."+p+".weight", 8, 8)
			for e := range 256 {
				f.add(fmt.Sprintf("%smlp.experts.%d.%s.weight_packed", pre, e, p), 8, 1)
			}
		}
	}
	return f
}

func int4Config(ignore []any) map[string]any {
	return map[string]any{"quantization_config": map[string]any{"quant_method": "compressed-tensors", "format": "pack-quantized",
		"config_groups": map[string]any{"g": map[string]any{"weights": map[string]any{"num_bits": 4.0, "type": "int", "strategy": "group", "group_size": 32.0}}},
		"ignore":        ignore}}
}

// costOf runs f and returns its wall time and heap allocated.
func costOf(f func()) (time.Duration, uint64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	f()
	d := time.Since(start)
	runtime.ReadMemStats(&after)
	return d, after.TotalAlloc - before.TotalAlloc
}

// Lists that cost RE2 gigabytes, and lists built to make a backtracking
// matcher work, each cost milliseconds and megabytes over a DeepSeek-V3
// sized checkpoint: read when valid, refused in one line naming file, key
// and entry when too costly. The time bounds are 10-50× what they take
// here, so a loaded CI machine does not flake; the memory bounds are
// 5-15× (allocation does not vary with load).
func TestQuantListCost(t *testing.T) {
	names := deepseekSizedNames()
	re2Killer := make([]any, 250) // 260 KB: 3.4 GB and half a minute under RE2
	for i := range re2Killer {
		re2Killer[i] = "re:" + strings.Repeat(".{1000}", 145) + fmt.Sprintf("%03d", i)
	}
	literalKiller := make([]any, 250) // the same, ending in text every name holds
	for i := range literalKiller {
		literalKiller[i] = "re:" + strings.Repeat(".{1000}", 145) + "mlp"
	}
	backtracker := []any{"lm_head", "re:.*.*.*.*.*.*[z]"} // O(n^6) per name
	globs := make([]any, 250)
	for i := range globs {
		globs[i] = strings.Repeat("*.", 300) + fmt.Sprintf("x%d", i)
	}
	kimi := []any{"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", `re:.*mlp\.(gate|up|gate_up|down)_proj.*`}
	for _, tc := range []struct {
		name   string
		cfg    map[string]any
		hf     map[string]any
		want   string // "" reads; else the refusal's start
		maxDur time.Duration
		maxMB  uint64
	}{
		{"RE2's costly patterns", int4Config(re2Killer), nil, "", 5 * time.Second, 200},
		{"RE2's costly patterns, literal present", int4Config(literalKiller), nil, "", 5 * time.Second, 200},
		{"backtracking pattern", int4Config(backtracker), nil,
			`config.json: quantization_config.ignore: element 1: "re:.*.*.*.*.*.*[z]": matching the list against the checkpoint's module names took over 33554432 steps (at "model.layers.`,
			10 * time.Second, 200},
		{"ModelOpt's exclude_modules as globs", map[string]any{}, map[string]any{"quantization": map[string]any{
			"quant_algo": "NVFP4", "group_size": 16.0, "exclude_modules": append(append([]any{}, re2Killer...), globs...)}}, "", 5 * time.Second, 200},
		{"Kimi's list", int4Config(kimi), nil, "", 5 * time.Second, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clear(resolveCache.m)
			var err error
			d, mem := costOf(func() { _, err = Detect(tc.cfg, tc.hf, names.modules()) })
			t.Logf("%v, %.1f MB allocated", d, float64(mem)/1e6)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Fatalf("got %v\nwant %s", err, tc.want)
			}
			if d > tc.maxDur || mem > tc.maxMB<<20 {
				t.Errorf("took %v and %d MB; want under %v and %d MB", d, mem>>20, tc.maxDur, tc.maxMB)
			}
			// The second resolution of the same list comes from the cache.
			before := resolutions.Load()
			Detect(tc.cfg, tc.hf, names.modules())
			if n := resolutions.Load() - before; n != 0 {
				t.Errorf("second detection resolved %d lists again: not cached", n)
			}
		})
	}
}

// Each producer's list is read as its producer reads it: compressed-
// tensors' re: entries with Python's re.match (lookaheads too), ModelOpt's
// exclude_modules with fnmatch, where "re:" is no prefix.
func TestQuantListSyntax(t *testing.T) {
	names := deepseekSizedNames()
	for _, tc := range []struct {
		name    string
		cfg, hf map[string]any
		want    string // the summary
	}{
		{"ct lookahead", int4Config([]any{"lm_head", `re:.*mlp\.(?!experts)(gate|up|down)_proj.*`}), nil,
			"compressed-tensors pack-quantized int4 (group 32, symmetric) on the routed experts, shared expert, attention (unquantised: router, dense MLP)"},
		{"ct lookbehind", int4Config([]any{`re:.*(?<=shared_experts\.)\w+_proj$`, `re:.*self_attn\.`}), nil,
			"compressed-tensors pack-quantized int4 (group 32, symmetric) on the routed experts, dense MLP (unquantised: shared expert, router, attention)"},
		{"ct re: is re.match, from the start", int4Config([]any{`re:self_attn`}), nil,
			"compressed-tensors pack-quantized int4 (group 32, symmetric) on the routed experts, shared expert, attention, dense MLP (unquantised: router)"},
		{"modelopt re: is a literal", map[string]any{}, map[string]any{"quantization": map[string]any{
			"quant_algo": "NVFP4", "group_size": 16.0, "exclude_modules": []any{"re:.*self_attn.*"}}},
			"modelopt nvfp4 (group 16) on the routed experts, shared expert, attention, dense MLP (unquantised: router)"},
		{"modelopt globs", map[string]any{}, map[string]any{"quantization": map[string]any{
			"quant_algo": "NVFP4", "group_size": 16.0, "exclude_modules": []any{"*self_attn*", "model.layers.[0-2].mlp.*"}}},
			"modelopt nvfp4 (group 16) on the routed experts, shared expert (unquantised: router, attention, dense MLP)"},
		{"modelopt glob missing some layers", map[string]any{}, map[string]any{"quantization": map[string]any{
			"quant_algo": "NVFP4", "group_size": 16.0, "exclude_modules": []any{"model.layers.?.self_attn*"}}},
			"modelopt nvfp4 (group 16) on the routed experts, shared expert, attention, dense MLP (unquantised: router)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			descs, err := Detect(tc.cfg, tc.hf, names.modules())
			if err != nil {
				t.Fatal(err)
			}
			if got := descs[len(descs)-1].Summary(); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}
