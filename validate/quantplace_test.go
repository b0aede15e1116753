package validate

import (
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
)

// Where config.json holds the quantisation description (issue 29): a
// text model whose description sits in compression_config (older
// compressed-tensors, no quant_method) or in text_config's
// quantization_config (Kimi-K2.5's placement) converts and validates as
// with quantization_config, byte proof included; two descriptions that
// disagree are refused in one line.

// moveQuant moves config.json's quantization_config to compression_config
// (without its quant_method) or into text_config.
func moveQuant(to string) func(c map[string]any) {
	return func(c map[string]any) {
		q := c["quantization_config"].(map[string]any)
		delete(c, "quantization_config")
		switch to {
		case "compression_config":
			delete(q, "quant_method")
			c[to] = q
		case "text_config":
			c[to] = map[string]any{"quantization_config": q}
		}
	}
}

func TestQuantConfigPlaces(t *testing.T) {
	for _, tc := range []struct {
		name, to, fixture string
		specs             map[string]fixtures.SynthSpec
		quant             quantContract
	}{
		{"int4 in compression_config", "compression_config", "kimi-g32", int4Specs(), quantContract{"int4_pack", "I32", "BF16", []int64{1, 32}}},
		{"int4 in text_config", "text_config", "deepseek-v3-g16", int4Specs(), quantContract{"int4_pack", "I32", "BF16", []int64{1, 16}}},
		{"nvfp4 compressed-tensors in compression_config", "compression_config", "deepseek-v3-ct", nvfp4CTSpecs(), quantContract{"nvfp4_ct", "U8", "", []int64{1, 16}}},
		{"fp8 per channel in text_config", "text_config", "deepseek-v2-channel", fp8ScaledSpecs(), quantContract{"fp8_channel", "F8_E4M3", "BF16", nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := synthFrom(t, tc.specs, tc.fixture)
			testkit.EditJSON(t, filepath.Join(src, "config.json"), moveQuant(tc.to))
			conversionsPass(t, src, DeviceCPU, []convert.Options{{Layout: layout.Stacked}, {Layout: layout.UpGate}}, func(o convert.Options, c *layout.Contract) {
				tc.quant.check(t, o, c)
			})
		})
	}
	refusalsHold(t, int4Specs(), []refusal{
		{"two descriptions that differ", "qwen3-channel", func(c map[string]any) {
			c["compression_config"] = map[string]any{"format": "pack-quantized", "config_groups": map[string]any{"group_0": map[string]any{
				"weights": map[string]any{"num_bits": 4, "type": "int", "strategy": "group", "group_size": 16}}}}
		}, nil, false, "config.json: quantization_config and compression_config describe the quantisation differently; moeprep reads one description"},
		{"asymmetric INT4 in compression_config", "qwen3-channel", func(c map[string]any) {
			ctGroup0(c)["weights"].(map[string]any)["symmetric"] = false
			moveQuant("compression_config")(c)
		}, nil, false, "config.json: compression_config.config_groups.group_0.weights.symmetric: false is not supported"},
	})
}
