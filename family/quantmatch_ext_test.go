package family_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
)

// explicitIgnore is the ignore list compressed-tensors'
// QuantizationConfig.from_pretrained writes: "lm_head" and the name of
// every leaf Linear it left unquantised, layer by layer.
func explicitIgnore(t *testing.T, ck *checkpoint.Checkpoint) []any {
	t.Helper()
	list := []any{"lm_head"}
	for _, n := range ck.Names() {
		mod, leaf, _ := strings.Cut(n, ".weight")
		if leaf != "" || !strings.HasSuffix(n, ".weight") {
			continue
		}
		if strings.HasSuffix(mod, "_proj") || strings.HasSuffix(mod, "_mqa") || strings.HasSuffix(mod, ".gate") {
			list = append(list, mod)
		}
	}
	if len(list) < 10 {
		t.Fatalf("explicit ignore list of %d entries: the fixture changed", len(list))
	}
	return list
}

// A compressed-tensors INT4 checkpoint whose first MoE layer is past 1
// (DeepSeek-V3, GLM-4.5: first_k_dense_replace 3), with the explicit
// ignore list its producer writes, plans: every layer's BF16 shared
// expert, attention and dense MLP read as unquantised, the routed experts
// as INT4. Resolved against layer-1 names only, no entry matched and the
// BF16 shared expert was refused as "stored unpacked".
func TestExplicitIgnoreListEveryLayer(t *testing.T) {
	spec := cktest.Preset(t, "small-kimi-k2-int4")
	spec.DenseLayers, spec.Layers = 3, 5
	dir := cktest.WriteSpec(t, filepath.Join(t.TempDir(), "kimi-int4-dense3"), spec)
	ck := cktest.Open(t, dir)
	ignore := explicitIgnore(t, ck)
	if slices.ContainsFunc(ignore, func(e any) bool {
		return strings.HasPrefix(e.(string), "model.layers.1.") && strings.Contains(e.(string), "shared")
	}) {
		t.Fatal("layer 1 has a shared expert: the fixture no longer tests layers past 1")
	}
	for _, tc := range []struct {
		name string
		edit func(q map[string]any)
		want string // "" plans; else the refusal's start
	}{
		{"explicit names", func(q map[string]any) { q["ignore"] = ignore }, ""},
		{"a lookahead", func(q map[string]any) {
			q["ignore"] = []any{"lm_head", `re:.*self_attn.*`, `re:.*shared_experts.*`, `re:.*mlp\.(?!experts)(gate|up|down)_proj.*`, `re:.*\.gate$`}
		}, ""},
		{"one layer's experts too", func(q map[string]any) {
			q["ignore"] = append(slices.Clone(ignore), "model.layers.3.mlp.experts.0.gate_proj")
		}, "config.json: quantization_config: compressed-tensors pack-quantized int4 (group 32, symmetric) on the routed experts (unquantised: shared expert, router, attention, dense MLP): not carried: quantization_config.ignore leaves model.layers.3.mlp.experts.0.gate_proj unquantised but not model.layers.3.mlp.experts.0.down_proj; moeprep carries one routed expert format per checkpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testkit.ReadJSON(t, filepath.Join(dir, "config.json"))
			tc.edit(cfg["quantization_config"].(map[string]any))
			p, err := family.Detect(cfg, ck)
			if tc.want != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
					t.Fatalf("got %v\nwant %s", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Quantization != family.QuantInt4Pack || p.SharedQuantization != family.QuantNone {
				t.Errorf("routed %q, shared %q; want int4_pack and none", p.Quantization, p.SharedQuantization)
			}
			descs, err := family.DetectQuantOf(cfg, nil, ck)
			if err != nil {
				t.Fatal(err)
			}
			want := "compressed-tensors pack-quantized int4 (group 32, symmetric) on the routed experts (unquantised: shared expert, router, attention, dense MLP)"
			if len(descs) != 1 || descs[0].Summary() != want {
				t.Errorf("summary %v, want %s", descs, want)
			}
		})
	}
}

// config.json and hf_quant_config.json that describe the weights
// differently are refused naming both files and what each says, not as a
// fault of the format moeprep happens to read.
func TestConflictingQuantFiles(t *testing.T) {
	for _, tc := range []struct {
		preset, want string
	}{
		{"small-kimi-k2-int4", "config.json: quantization_config says compressed-tensors pack-quantized int4 (group 32, symmetric) on the routed experts (unquantised: shared expert, router, attention, dense MLP), but hf_quant_config.json: quantization says modelopt nvfp4 (group 16) on the routed experts, shared expert, attention, dense MLP (unquantised: router); the two files describe the weights differently and moeprep reads one description (remove the one the tensors do not follow)"},
		{"tiny-deepseek-v3-fp8", "config.json: quantization_config says fp8 128x128 block on the routed experts, shared expert, attention, dense MLP (unquantised: router), but hf_quant_config.json: quantization says modelopt nvfp4 (group 16) on the routed experts, shared expert, attention, dense MLP (unquantised: router); the two files describe the weights differently"},
	} {
		t.Run(tc.preset, func(t *testing.T) {
			dir := cktest.WritePreset(t, tc.preset)
			testkit.WriteFile(t, filepath.Join(dir, "hf_quant_config.json"),
				[]byte(`{"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16}}`))
			ck := cktest.Open(t, dir)
			_, err := family.Detect(ck.Config, ck)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("got  %v\nwant %s", err, tc.want)
			}
		})
	}
}
