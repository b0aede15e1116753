package inspect

import (
	"bytes"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/internal/testkit/quantwrap"
)

// inspect says, per description and wherever it lives, what is quantised
// how: Kimi's INT4 moved into text_config (routed experts only),
// DeepSeek-V4's FP4 experts beside FP8, ModelOpt MIXED_PRECISION.
func TestQuantDescriptions(t *testing.T) {
	for _, tc := range []struct {
		preset string
		edit   func(c map[string]any)
		key    string
		groups map[string]string
		line   string
	}{
		{"small-kimi-k2-int4", func(c map[string]any) {
			c["text_config"] = map[string]any{"quantization_config": c["quantization_config"]}
			delete(c, "quantization_config")
		}, "text_config.quantization_config",
			map[string]string{"routed experts": "compressed-tensors pack-quantized int4 (group 32, symmetric)"},
			"quantised:       config.json text_config.quantization_config: compressed-tensors pack-quantized int4 (group 32, symmetric) on the routed experts (unquantised: shared expert, router, attention, dense MLP)"},
		{"small-deepseek-v4-fp4", nil, "quantization_config",
			map[string]string{"routed experts": "mxfp4 (expert_dtype fp4)", "shared expert": "fp8 128x128 block", "attention": "fp8 128x128 block", "dense MLP": "fp8 128x128 block"},
			"quantised:       config.json quantization_config: fp8 128x128 block (mxfp4 (expert_dtype fp4) on the routed experts; fp8 128x128 block on the shared expert, attention, dense MLP) (unquantised: router)"},
		{"small-deepseek-v3-nvfp4-mixed", nil, "quantization_config",
			map[string]string{"routed experts": "nvfp4 (group 16)", "shared expert": "nvfp4 (group 16)", "attention": "fp8 per-tensor", "dense MLP": "fp8 per-tensor"},
			"quantised:       hf_quant_config.json quantization: modelopt MIXED_PRECISION (nvfp4 (group 16) on the routed experts, shared expert; fp8 per-tensor on the attention, dense MLP) (unquantised: router)"},
	} {
		t.Run(tc.preset, func(t *testing.T) {
			dir := cktest.WritePreset(t, tc.preset)
			if tc.edit != nil {
				testkit.EditJSON(t, filepath.Join(dir, "config.json"), tc.edit)
			}
			s, err := Summarize(cktest.Open(t, dir))
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Quant) == 0 || s.Quant[0].Key != tc.key || !maps.Equal(s.Quant[0].Groups, tc.groups) {
				t.Errorf("descriptions %+v, want key %s groups %v", s.Quant, tc.key, tc.groups)
			}
			var b bytes.Buffer
			if err := WriteText(&b, s); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(unwrapped(b.String()), tc.line+"\n") {
				t.Errorf("table:\n%s\nwant the line\n%s", b.String(), tc.line)
			}
		})
	}
}

// A quantised multimodal wrapper: inspect names the wrapper and says how
// each tensor group of its text model is stored, the ignore lists
// resolved under the wrapper's layer prefix (Qwen3.5's FP8 release leaves
// model.language_model.layers.1.self_attn unquantised by that name).
func TestQuantisedWrapperDescriptions(t *testing.T) {
	fp8 := "fp8 128x128 block"
	for _, tc := range []struct {
		q      quantwrap.Spec
		key    string
		groups map[string]string
		line   string
	}{
		{quantwrap.KimiK25Int4(), "text_config.quantization_config",
			map[string]string{"routed experts": "compressed-tensors pack-quantized int4 (group 32, symmetric)"},
			"quantised:       config.json text_config.quantization_config: compressed-tensors pack-quantized int4 (group 32, symmetric) on the routed experts (unquantised: shared expert, router, attention, dense MLP)"},
		{quantwrap.Qwen35FP8(), "quantization_config",
			map[string]string{"routed experts": fp8, "shared expert": fp8, "dense MLP": fp8},
			"quantised:       config.json quantization_config: fp8 128x128 block on the routed experts, shared expert, dense MLP (unquantised: router, attention)"},
	} {
		t.Run(tc.q.Fixture, func(t *testing.T) {
			s, err := Summarize(cktest.Open(t, quantwrap.Write(t, filepath.Join("..", "fixtures", "hf"), tc.q)))
			if err != nil {
				t.Fatal(err)
			}
			if s.Wrapper == nil || len(s.Quant) != 1 || s.Quant[0].Key != tc.key || !maps.Equal(s.Quant[0].Groups, tc.groups) {
				t.Errorf("wrapper %+v, descriptions %+v, want key %s groups %v", s.Wrapper, s.Quant, tc.key, tc.groups)
			}
			var b bytes.Buffer
			if err := WriteText(&b, s); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(unwrapped(b.String()), tc.line+"\n") {
				t.Errorf("table:\n%s\nwant the line\n%s", b.String(), tc.line)
			}
			t.Logf("%s", b.String())
		})
	}
}

// inspect ends with what to run next on a source checkpoint: fuse-shared
// where its shared expert fuses, else convert, saying why not.
func TestInspectNextStep(t *testing.T) {
	for _, tc := range []struct{ dir, want string }{
		{"deepseek-v3-bf16", "next:            moeprep fuse-shared --tp 8 ../fixtures/hf/deepseek-v3-bf16 OUT (the shared expert fuses), or convert --layout transformers (transformers 5 loads it)"},
		{"qwen2-moe", "next:            moeprep convert --layout transformers ../fixtures/hf/qwen2-moe OUT (transformers 5 loads it; fuse-shared does not apply: its shared expert is gated per token)"},
		{"mixtral", "fuse-shared does not apply: it has no shared expert)"},
	} {
		s, err := Summarize(cktest.Open(t, filepath.Join("..", "fixtures", "hf", tc.dir)))
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		if err := WriteText(&b, s); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(unwrapped(b.String()), tc.want) {
			t.Errorf("%s: no %q in\n%s", tc.dir, tc.want, b.String())
		}
	}
}

// unwrapped joins the lines WriteText wrapped under the values' column.
func unwrapped(text string) string {
	return strings.ReplaceAll(text, "\n"+strings.Repeat(" ", valueColumn), " ")
}

// Every line of inspect's text fits 100 columns on every fixture of
// fixtures/hf but a command to copy, which is never broken (issue 46).
func TestInspectTextFits(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("..", "fixtures", "hf", "*", "config.json"))
	if err != nil || len(dirs) < 50 {
		t.Fatalf("%d fixtures: %v", len(dirs), err)
	}
	for _, cfg := range dirs {
		c, err := checkpoint.Open(filepath.Dir(cfg))
		if err != nil {
			continue // a fixture inspect refuses (a dense model) prints an error
		}
		s, err := Summarize(c)
		c.Close()
		if err != nil {
			continue
		}
		var b strings.Builder
		if err := WriteText(&b, s); err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(b.String(), "\n") {
			if n := len([]rune(l)); n > lineWidth && !strings.HasPrefix(l, "next:            moeprep ") {
				t.Errorf("%s: a line of %d columns: %s", filepath.Dir(cfg), n, l)
			}
		}
	}
}

// wrapValue breaks at spaces under the values' column, and never inside
// the command it names.
func TestWrapValue(t *testing.T) {
	long := strings.Repeat("word ", 20) + "end"
	cmd := "moeprep convert --layout gate-up /a/very/long/path/" + strings.Repeat("x", 70) + " OUT (why it applies)"
	for _, tc := range []struct {
		v       string
		command bool
		want    string
	}{
		{"short value", false, "short value"},
		{long, false, strings.Repeat("word ", 15) + "word\n" + strings.Repeat(" ", 17) + "word word word word end"},
		{cmd, true, strings.TrimSuffix(cmd, " (why it applies)") + "\n" + strings.Repeat(" ", 17) + "(why it applies)"},
	} {
		if got := wrapValue(tc.v, tc.command); got != tc.want {
			t.Errorf("wrapValue(%q):\n got %q\nwant %q", tc.v, got, tc.want)
		}
	}
}
