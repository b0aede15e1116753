package family

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/moeprep/moeprep/layout"
	"maps"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// del deletes name from f, failing the test where f does not hold it (a
// mutation that deletes nothing would test nothing).
func del(t *testing.T, f *MemTensors, name string) {
	t.Helper()
	if !f.Delete(name) {
		t.Fatalf("fixture has no tensor %s to delete", name)
	}
}

// hubName is how the hub names one family's MoE tensors, written out here
// independently of the package's specs.
type hubName struct {
	module     string
	proj       [3]string
	shared     string
	sharedGate string
}

var hubNames = map[string]hubName{
	"deepseek_v2": {"mlp", [3]string{"gate_proj", "up_proj", "down_proj"}, "shared_experts", ""},
	"deepseek_v3": {"mlp", [3]string{"gate_proj", "up_proj", "down_proj"}, "shared_experts", ""},
	"kimi_k2":     {"mlp", [3]string{"gate_proj", "up_proj", "down_proj"}, "shared_experts", ""},
	"qwen2_moe":   {"mlp", [3]string{"gate_proj", "up_proj", "down_proj"}, "shared_expert", "shared_expert_gate"},
	"qwen3_moe":   {"mlp", [3]string{"gate_proj", "up_proj", "down_proj"}, "", ""},
	"mixtral":     {"block_sparse_moe", [3]string{"w1", "w3", "w2"}, "", ""},
}

// gen describes a synthetic checkpoint: config.json (as JSON would decode
// it) and the tensors of every layer. Tensor shapes are given directly, not
// derived from the config, so that the planner's reading of the config is
// tested against an independent statement of the truth.
type gen struct {
	cfg      map[string]any
	layers   int   // decoder layers 0..layers-1 get attention and norms
	moe      []int // layers holding routed experts (MTP layers included)
	mtp      []int // of moe, the layers that also get MTP extras
	h, i     int64
	e        int
	sharedI  int64 // intermediate of the shared MLP; 0: none
	bias     bool
	dtype    safetensors.DType
	fp8      bool
	module   string // overrides the hub module name
	useNum   bool   // decode config.json with json.Decoder.UseNumber
	modelTyp string // hubNames key; defaults to cfg["model_type"]
}

func (g gen) names() hubName {
	mt := g.modelTyp
	if mt == "" {
		mt, _ = g.cfg["model_type"].(string)
	}
	n := hubNames[mt]
	if g.module != "" {
		n.module = g.module
	}
	return n
}

func (g gen) clone() gen {
	g.cfg = maps.Clone(g.cfg)
	g.moe = slices.Clone(g.moe)
	g.mtp = slices.Clone(g.mtp)
	return g
}

// decodeConfig round-trips cfg through JSON so numbers are float64 (or
// json.Number), exactly as checkpoint hands config.json to Detect.
func decodeConfig(t testing.TB, cfg map[string]any, useNumber bool) map[string]any {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	if useNumber {
		dec.UseNumber()
	}
	if err := dec.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// build writes the checkpoint's tensor table.
func (g gen) build(t testing.TB) (map[string]any, *MemTensors) {
	t.Helper()
	f := &MemTensors{}
	bf := safetensors.BF16
	f.Add("model.embed_tokens.weight", bf, 64, g.h)
	n := g.names()
	last := g.layers - 1
	if len(g.moe) > 0 {
		last = max(last, slices.Max(g.moe))
	}
	for l := 0; l <= last; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		if l >= g.layers && !slices.Contains(g.moe, l) {
			continue
		}
		f.Add(p+"input_layernorm.weight", bf, g.h)
		f.Add(p+"self_attn.o_proj.weight", bf, g.h, g.h)
		if slices.Contains(g.mtp, l) {
			f.Add(p+"eh_proj.weight", bf, g.h, 2*g.h)
			f.Add(p+"enorm.weight", bf, g.h)
			f.Add(p+"shared_head.head.weight", bf, 64, g.h)
		}
		if !slices.Contains(g.moe, l) {
			f.Add(p+"mlp.gate_proj.weight", bf, 3*g.h, g.h)
			f.Add(p+"mlp.up_proj.weight", bf, 3*g.h, g.h)
			f.Add(p+"mlp.down_proj.weight", bf, g.h, 3*g.h)
			continue
		}
		m := p + n.module + "."
		f.Add(m+"gate.weight", bf, int64(g.e), g.h)
		if g.bias {
			f.Add(m+"gate.e_score_correction_bias", safetensors.F32, int64(g.e))
		}
		for e := 0; e < g.e; e++ {
			g.mlp(f, fmt.Sprintf("%sexperts.%d.", m, e), n.proj, g.i)
		}
		if g.sharedI > 0 {
			g.mlp(f, m+n.shared+".", n.proj, g.sharedI)
			if n.sharedGate != "" {
				f.Add(m+n.sharedGate+".weight", bf, 1, g.h)
			}
		}
	}
	f.Add("model.norm.weight", bf, g.h)
	f.Add("lm_head.weight", bf, 64, g.h)
	return decodeConfig(t, g.cfg, g.useNum), f
}

func (g gen) mlp(f *MemTensors, prefix string, proj [3]string, inter int64) {
	dt := g.dtype
	if g.fp8 {
		dt = safetensors.F8E4M3
	}
	shapes := [3][2]int64{{inter, g.h}, {inter, g.h}, {g.h, inter}}
	for k, pr := range proj {
		f.Add(prefix+pr+".weight", dt, shapes[k][0], shapes[k][1])
		if g.fp8 {
			f.Add(prefix+pr+".weight_scale_inv", safetensors.F32, (shapes[k][0]+127)/128, (shapes[k][1]+127)/128)
		}
	}
}

// wantLayers is the plan's Layers for g, spelled out from the hub naming.
func (g gen) wantLayers() []Layer {
	n := g.names()
	var out []Layer
	for _, l := range g.moe {
		prefix := fmt.Sprintf("model.layers.%d.%s", l, n.module)
		layer := Layer{Index: l, MTP: slices.Contains(g.mtp, l), Prefix: prefix, Router: prefix + ".gate.weight"}
		if g.bias {
			layer.RouterBias = prefix + ".gate.e_score_correction_bias"
		}
		for e := 0; e < g.e; e++ {
			layer.Experts = append(layer.Experts, g.wantMLP(fmt.Sprintf("%s.experts.%d", prefix, e), n.proj))
		}
		if g.sharedI > 0 {
			m := g.wantMLP(prefix+"."+n.shared, n.proj)
			layer.Shared = &m
			if n.sharedGate != "" {
				layer.SharedGate = prefix + "." + n.sharedGate + ".weight"
			}
		}
		out = append(out, layer)
	}
	return out
}

func (g gen) wantMLP(prefix string, proj [3]string) MLP {
	m := MLPOf(prefix+"."+proj[0]+".weight", prefix+"."+proj[1]+".weight", prefix+"."+proj[2]+".weight")
	if g.fp8 {
		m.Set(layout.ProjGate, layout.RoleScale, prefix+"."+proj[0]+".weight_scale_inv")
		m.Set(layout.ProjUp, layout.RoleScale, prefix+"."+proj[1]+".weight_scale_inv")
		m.Set(layout.ProjDown, layout.RoleScale, prefix+"."+proj[2]+".weight_scale_inv")
	}
	return m
}
