package quantdesc

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/jsoncfg"
)

const int4Group = `{"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": true}}}`

// Hostile ignore lists are refused in one line, quickly.
func TestDetectQuantBounded(t *testing.T) {
	many := make([]any, jsoncfg.MaxList+1)
	for i := range many {
		many[i] = fmt.Sprintf("model.layers.%d.self_attn", i)
	}
	regexes := make([]any, maxQuantRegexes+1)
	for i := range regexes {
		regexes[i] = fmt.Sprintf("re:.*layers\\.%d\\..*", i)
	}
	for _, tc := range []struct {
		name   string
		ignore []any
		want   string
	}{
		{"huge ignore list", many, "config.json: quantization_config.ignore: 4097 entries, over the limit of 4096"},
		{"too many regexes", regexes, "config.json: quantization_config.ignore: more than 256 patterns, over the limit"},
		{"long regex", []any{"re:" + strings.Repeat("a", 2000)}, "config.json: quantization_config.ignore: element 0: 2003 bytes, over the limit of 1024"},
		{"backreference", []any{`re:(a)\1`}, "config.json: quantization_config.ignore: element 0: \"re:(a)\\\\1\" is not a Python regular expression moeprep can read: backreferences are not read"},
		{"invalid in Python", []any{`re:a**`}, "config.json: quantization_config.ignore: element 0: \"re:a**\" is not a Python regular expression moeprep can read: multiple repeat at position 2"},
	} {
		cfg := map[string]any{"quantization_config": map[string]any{"quant_method": "compressed-tensors", "format": "pack-quantized",
			"config_groups": map[string]any{"g": map[string]any{"weights": map[string]any{"num_bits": 4.0, "type": "int", "strategy": "group", "group_size": 32.0}}},
			"ignore":        tc.ignore}}
		_, err := Detect(cfg, nil, nil)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.want)
		}
	}
	// A nested-star regex fails the representative names at once (none
	// holds the "b" every match needs).
	cfg := map[string]any{"quantization_config": map[string]any{"quant_method": "mxfp4",
		"modules_to_not_convert": []any{"re:(a*)*(a*)*(a*)*b"}}}
	if _, err := Detect(cfg, nil, nil); err != nil {
		t.Error(err)
	}
}

// Config finds config.json's one description wherever it lives,
// takes two identical ones, refuses two that differ, and gives
// compression_config's missing quant_method as compressed-tensors.
func TestQuantConfig(t *testing.T) {
	int4 := `{"format": "pack-quantized", "config_groups": ` + int4Group + `}`
	for _, tc := range []struct {
		config, at, method, err string
	}{
		{`{}`, "", "", ""},
		{`{"compression_config": ` + int4 + `}`, "compression_config.", "compressed-tensors", ""},
		{`{"text_config": {"quantization_config": {"quant_method": "fp8"}}}`, "text_config.quantization_config.", "fp8", ""},
		{`{"quantization_config": {"quant_method": "fp8"}, "text_config": {"quantization_config": {"quant_method": "fp8"}}}`, "quantization_config.", "fp8", ""},
		{`{"quantization_config": {"quant_method": "fp8"}, "compression_config": ` + int4 + `}`, "", "",
			"config.json: quantization_config and compression_config describe the quantisation differently; moeprep reads one description"},
		{`{"text_config": {"quantization_config": 3}}`, "", "", "config.json: text_config.quantization_config: want an object, got 3"},
	} {
		var raw map[string]any
		if err := json.Unmarshal([]byte(tc.config), &raw); err != nil {
			t.Fatal(err)
		}
		q, method, ok, err := Config(jsoncfg.Object{M: raw})
		if got := fmt.Sprint(err); tc.err != "" && got != tc.err || tc.err == "" && err != nil {
			t.Errorf("%s: error %v, want %q", tc.config, err, tc.err)
			continue
		}
		if q.At != tc.at || method != tc.method || ok != (tc.at != "") {
			t.Errorf("%s: at %q method %q ok %v, want %q %q", tc.config, q.At, method, ok, tc.at, tc.method)
		}
	}
}

// Read takes MXFP8 as each producer describes it: ModelOpt's quant_algo
// MXFP8 (config.json without group_size, or hf_quant_config.json with
// group_size 32), MiniMax's quant_method mxfp8 with weight_block_size
// [1, 32] and dynamic activations; anything else is refused naming the key.
func TestReadMXFP8(t *testing.T) {
	for _, tc := range []struct {
		config, hf, err string
	}{
		{config: `{"quantization_config": {"quant_method": "modelopt", "quant_algo": "MXFP8", "ignore": ["lm_head"]}}`},
		{config: `{"quantization_config": {"quant_method": "modelopt", "quant_algo": "MXFP8", "group_size": 16}}`,
			err: "config.json: quantization_config.group_size: 16 is not supported (MXFP8 scales groups of 32)"},
		{config: `{"quantization_config": {"quant_method": "mxfp8", "activation_scheme": "dynamic", "weight_block_size": [1, 32], "ignored_layers": ["lm_head"]}}`},
		{config: `{"quantization_config": {"quant_method": "mxfp8"}}`},
		{config: `{"quantization_config": {"quant_method": "mxfp8", "weight_block_size": [32, 32]}}`,
			err: "config.json: quantization_config.weight_block_size: [32 32] is not supported with quant_method mxfp8 (only [1, 32]: one E8M0 scale per 32 elements of a row)"},
		{config: `{"quantization_config": {"quant_method": "mxfp8", "activation_scheme": "static"}}`,
			err: `config.json: quantization_config.activation_scheme: "static" is not supported (only dynamic: static activation scales, input_scale, are not carried)`},
		{config: `{}`, hf: `{"quantization": {"quant_algo": "MXFP8", "group_size": 32}}`},
	} {
		var raw, hf map[string]any
		if err := json.Unmarshal([]byte(tc.config), &raw); err != nil {
			t.Fatal(err)
		}
		var q string
		var err error
		if tc.hf != "" {
			if err := json.Unmarshal([]byte(tc.hf), &hf); err != nil {
				t.Fatal(err)
			}
			q, err = ReadHF(hf)
		} else {
			q, _, err = Read(jsoncfg.Object{M: raw})
		}
		switch {
		case tc.err != "" && fmt.Sprint(err) != tc.err:
			t.Errorf("%s%s: %v, want %s", tc.config, tc.hf, err, tc.err)
		case tc.err == "" && (err != nil || q != "mxfp8"):
			t.Errorf("%s%s: %q %v, want mxfp8", tc.config, tc.hf, q, err)
		}
	}
}
