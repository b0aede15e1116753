// Package quantwrap (only tests import it) builds quantised multimodal wrapper checkpoints for
// tests from the committed bf16 wrapper fixtures (fixtures/hf/export_wrappers.py)
// by quantising their text MoE layers' experts with weightfmt's requantiser
// and writing the quantisation description where the hub's release has it:
// Kimi-K2.5's INT4 routed experts (text_config.quantization_config, an
// ignore list naming vision modules and the wrapper's prefixes), and
// Qwen3.5-MoE's FP8 128x128 blocks (quantization_config at the top level,
// modules_to_not_convert naming the visual modules and prefixed names).
package quantwrap

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// Quantised multimodal wrappers, built from the committed bf16 wrapper
// fixtures (fixtures/hf/export_wrappers.py) by quantising their text MoE
// layers' experts with weightfmt's requantiser and writing the
// quantisation description where the hub's release has it: Kimi-K2.5's
// INT4 routed experts (text_config.quantization_config, an ignore list
// naming vision modules and the wrapper's prefixes), and Qwen3.5-MoE's FP8
// 128x128 blocks (quantization_config at the top level,
// modules_to_not_convert naming the visual modules and prefixed names).

// Spec is one quantised wrapper: the bf16 fixture, the experts it
// quantises (a regexp on tensor names), their format, and the
// description it writes.
type Spec struct {
	Fixture string
	Experts *regexp.Regexp
	Format  weightfmt.Format
	// Describe edits config.json to describe the quantisation.
	Describe func(cfg map[string]any)
}

// KimiK25Int4 is Kimi-K2.5's INT4 release in small.
func KimiK25Int4() Spec {
	return Spec{Fixture: "kimi-k25",
		Experts: regexp.MustCompile(`^language_model\.model\.blocks\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$`),
		Format:  weightfmt.Int4Pack(32, safetensors.BF16),
		Describe: func(cfg map[string]any) {
			text := cfg["text_config"].(map[string]any)
			text["quantization_config"] = map[string]any{
				"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
				"config_groups": map[string]any{"group_0": map[string]any{
					"targets": []any{"Linear"}, "input_activations": nil, "output_activations": nil, "format": "pack-quantized",
					"weights": map[string]any{"num_bits": 4.0, "type": "int", "strategy": "group", "group_size": 32.0,
						"symmetric": true, "dynamic": false, "actorder": nil, "observer": "minmax"},
				}},
				"ignore": []any{"re:.*vision_tower.*", "re:.*mm_projector.*", "language_model.lm_head", "re:.*self_attn.*",
					"re:.*shared_experts.*", `re:.*mlp\.(gate|up|gate_up|down)_proj.*`},
				"kv_cache_scheme": nil,
			}
		}}
}

// Qwen35FP8 is Qwen3.5-MoE's FP8 release in small.
func Qwen35FP8() Spec {
	return Spec{Fixture: "qwen3-5-moe",
		Experts: regexp.MustCompile(`^model\.language_model\.layers\.\d+\.mlp\.(experts\.\d+|shared_expert)\.(gate|up|down)_proj\.weight$`),
		Format:  weightfmt.FP8Block(128, 128, false),
		Describe: func(cfg map[string]any) {
			cfg["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
				"weight_block_size": []any{128.0, 128.0},
				// Prefixed names, as Qwen's FP8 releases list them: the
				// attention and the dense parts are left bf16.
				"modules_to_not_convert": []any{"lm_head", "model.visual.blocks.0.attn.qkv", "re:model\\.visual\\..*",
					"model.language_model.layers.0.linear_attn", "model.language_model.layers.1.self_attn",
					"model.language_model.layers.0.mlp.gate", "model.language_model.layers.1.mlp.gate",
					"model.language_model.layers.1.mlp.shared_expert_gate", "model.language_model.embed_tokens"},
			}
		}}
}

// Write writes q's checkpoint into a temporary directory: the fixture's
// files (from hf, fixtures/hf), its experts quantised, its config.json
// describing them.
func Write(t testing.TB, hf string, q Spec) string {
	t.Helper()
	src := filepath.Join(hf, q.Fixture)
	dir := filepath.Join(t.TempDir(), q.Fixture+"-quant")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var entries []safetensors.Entry
	add := func(name string, dt safetensors.DType, shape []int64, raw []byte) {
		entries = append(entries, safetensors.Entry{Name: name, DType: dt, Shape: shape,
			Open: func() (io.Reader, error) { return bytes.NewReader(raw), nil }})
	}
	quantised := 0
	for _, ti := range f.Tensors {
		raw, err := f.ReadTensor(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !q.Experts.MatchString(ti.Name) {
			add(ti.Name, ti.DType, ti.Shape, raw)
			continue
		}
		rows, cols := ti.Shape[0], ti.Shape[1]
		vals := make([]float32, rows*cols)
		for i := range vals {
			vals[i] = numfmt.BF16ToF32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
		w, s, err := weightfmt.Requantise(q.Format, vals, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		m := weightfmt.Matrix{Format: q.Format, Rows: rows, Cols: cols}
		names := weightfmt.TensorsOf(q.Format, ti.Name)
		sc, _ := q.Format.Scale()
		sr, scols := m.ScaleShape()
		add(names.Weight, q.Format.DType(), m.Shape(), w)
		add(names.Scale, sc.DType, []int64{sr, scols}, s)
		if names.Shape != "" {
			add(names.Shape, safetensors.I64, []int64{2}, binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, uint64(rows)), uint64(cols)))
		}
		quantised++
	}
	if quantised == 0 {
		t.Fatalf("%s: no expert matched %s", q.Fixture, q.Experts)
	}
	if _, err := safetensors.WriteFile(context.Background(), filepath.Join(dir, "model.safetensors"), f.Metadata, entries, nil); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"config.json", "generation_config.json"} {
		testkit.WriteFile(t, filepath.Join(dir, name), testkit.ReadFile(t, filepath.Join(src, name)))
	}
	testkit.EditJSON(t, filepath.Join(dir, "config.json"), q.Describe)
	return dir
}
