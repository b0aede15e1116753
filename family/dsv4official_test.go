package family_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// TestDeepSeekV4OfficialLayout: DeepSeek-V4's official repo layout (no
// "model." prefix, FP8 x.scale F8_E8M0) plans to the same MoE tensors,
// below layers.L, as transformers' save: the layer prefix is the only
// rename, the shared expert's FP8 names and scale dtype are recorded, and
// its dequantisation is q * 2^(e-127).
func TestDeepSeekV4OfficialLayout(t *testing.T) {
	cases := []struct {
		preset           string
		prefix           string // layer 1's MoE module
		sharedScale      string // layer 1's shared gate scale tensor
		sharedNaming     string
		sharedScaleDType safetensors.DType
	}{
		{"small-deepseek-v4-official", "layers.1.ffn", "layers.1.ffn.shared_experts.w1.scale", weightfmt.NamingDeepSeek, safetensors.F8E8M0},
		{"small-deepseek-v4-fp4", "model.layers.1.ffn", "model.layers.1.ffn.shared_experts.w1.weight_scale_inv", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.preset, func(t *testing.T) {
			dir := cktest.WriteSpec(t, filepath.Join(t.TempDir(), "src"), cktest.Preset(t, tc.preset))
			ck := cktest.Open(t, dir)
			p, err := planEditedDir(t, dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			if p.Family != "deepseek_v4" || p.Quantization != family.QuantMXFP4 || p.Naming != weightfmt.NamingDeepSeek || len(p.Layers) != 3 {
				t.Fatalf("plan %s %s %q, %d layers", p.Family, p.Quantization, p.Naming, len(p.Layers))
			}
			l0, l1 := p.Layers[0], p.Layers[1]
			if l1.Prefix != tc.prefix || l1.Router != tc.prefix+".gate.weight" || l1.RouterBias != tc.prefix+".gate.bias" || l1.HashTable != "" {
				t.Errorf("layer 1: prefix %q router %q bias %q hash %q", l1.Prefix, l1.Router, l1.RouterBias, l1.HashTable)
			}
			if want := tc.prefix[:len(tc.prefix)-len("1.ffn")] + "0.ffn.gate.tid2eid"; l0.HashTable != want {
				t.Errorf("layer 0 hash table %q, want %q", l0.HashTable, want)
			}
			if e := l1.Experts[5]; e.Weight(layout.ProjDown) != tc.prefix+".experts.5.w2.weight" || e.Get(layout.ProjDown, layout.RoleScale) != tc.prefix+".experts.5.w2.scale" {
				t.Errorf("expert 5 down %q scale %q", e.Weight(layout.ProjDown), e.Get(layout.ProjDown, layout.RoleScale))
			}
			if l1.Shared == nil || l1.Shared.Get(layout.ProjGate, layout.RoleScale) != tc.sharedScale {
				t.Fatalf("layer 1 shared %+v, want gate scale %s", l1.Shared, tc.sharedScale)
			}
			if p.SharedQuantization != family.QuantFP8Block || p.SharedNaming != tc.sharedNaming || p.SharedScaleDType != tc.sharedScaleDType {
				t.Errorf("shared %s naming %q scale %q", p.SharedQuantization, p.SharedNaming, p.SharedScaleDType)
			}
			sf, err := p.SharedFormat()
			if err != nil {
				t.Fatal(err)
			}
			if got := weightfmt.TensorsOf(sf, l1.Shared.Weight(layout.ProjGate)).Scale; got != tc.sharedScale {
				t.Errorf("shared format names the scale %q, want %q", got, tc.sharedScale)
			}
			// One 32x64 block: decode it from the file and check every value
			// is its code times the one scale entry.
			raw, scale := cktest.Bytes(t, ck, l1.Shared.Weight(layout.ProjGate)), cktest.Bytes(t, ck, l1.Shared.Get(layout.ProjGate, layout.RoleScale))
			dst := make([]float32, 32*64)
			if err := sf.Dequantise(raw, 32, 64, scale, dst); err != nil {
				t.Fatal(err)
			}
			s := make([]float32, 1)
			sd := safetensors.F32
			if tc.sharedScaleDType != "" {
				sd = tc.sharedScaleDType
			}
			if err := weightfmt.Decode(sd, scale, s); err != nil {
				t.Fatal(err)
			}
			code := make([]float32, len(raw))
			if err := weightfmt.Decode(safetensors.F8E4M3, raw, code); err != nil {
				t.Fatal(err)
			}
			for i := range dst {
				if dst[i] != code[i]*s[0] {
					t.Fatalf("element %d: %g, want %g * %g", i, dst[i], code[i], s[0])
				}
			}
		})
	}
}

// TestDeepSeekV41Plan: DeepSeek-V4.1's release (preset small-deepseek-v41:
// the composite config, DeepSeek's names, FP4 experts beside FP8 32x32)
// plans its text model inside the wrapper: every layer routed by top-k (no
// hash table), the routed experts MXFP4 in DeepSeek's names, the shared
// expert FP8 in 32x32 blocks under x.scale F8_E8M0, whose format says so.
func TestDeepSeekV41Plan(t *testing.T) {
	dir := cktest.WriteSpec(t, filepath.Join(t.TempDir(), "src"), cktest.Preset(t, "small-deepseek-v41"))
	p, err := planEditedDir(t, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Family != "deepseek_v41_text" || p.Wrapper == nil || p.Wrapper.ModelType != "deepseek_v41" || p.Wrapper.Layers != "layers." {
		t.Fatalf("plan family %s wrapper %+v", p.Family, p.Wrapper)
	}
	if p.Quantization != family.QuantMXFP4 || p.Naming != weightfmt.NamingDeepSeek || p.FP8Block != 32 || len(p.Layers) != 3 ||
		p.RoutedScalingFactor != 1.5 || p.Scoring != moe.SqrtSoftplus || p.Act.Limit != 10 {
		t.Fatalf("plan %s %q block %d, %d layers, rsf %g scoring %v limit %g", p.Quantization, p.Naming, p.FP8Block, len(p.Layers), p.RoutedScalingFactor, p.Scoring, p.Act.Limit)
	}
	for _, l := range p.Layers {
		if l.HashTable != "" || l.RouterBias != l.Prefix+".gate.bias" || !strings.HasPrefix(l.Prefix, "layers.") {
			t.Errorf("layer %d: prefix %q hash %q bias %q", l.Index, l.Prefix, l.HashTable, l.RouterBias)
		}
	}
	if s := p.Layers[2].Shared; s == nil || s.Get(layout.ProjDown, layout.RoleScale) != "layers.2.ffn.shared_experts.w2.scale" {
		t.Fatalf("layer 2 shared %+v", s)
	}
	if p.SharedQuantization != family.QuantFP8Block || p.SharedScaleDType != safetensors.F8E8M0 || !slices.Equal(p.SharedBlock(), []int64{32, 32}) {
		t.Errorf("shared %s scale %s block %v", p.SharedQuantization, p.SharedScaleDType, p.SharedBlock())
	}
	sf, err := p.SharedFormat()
	if err != nil {
		t.Fatal(err)
	}
	if sc, _ := sf.Scale(); sc.Block != [2]int64{32, 32} || sc.DType != safetensors.F8E8M0 || sc.Suffix != ".scale" {
		t.Errorf("shared format scale %+v, want 32x32 F8_E8M0 .scale", sc)
	}
}
