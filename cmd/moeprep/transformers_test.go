package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestLayoutTransformersNextStep: convert --layout transformers prints the
// command that loads the output in transformers with the class it was
// verified with (a wrapper's own), and the notice of the form it wrote;
// --layout gate-up on a family whose form is another, or on quantised
// experts, prints no load line.
func TestLayoutTransformersNextStep(t *testing.T) {
	for _, tc := range []struct {
		fixture, layout, want, notice string
	}{
		{"gpt-oss", "transformers", "t.AutoModelForCausalLM.from_pretrained(", "its experts are written as the checkpoint stores them"},
		{"llama4", "transformers", "t.Llama4ForConditionalGeneration.from_pretrained(", "writing layout gate-up, orientation in-out"},
		{"qwen3-moe", "transformers", "t.AutoModelForCausalLM.from_pretrained(", "writing layout gate-up"},
		{"deepseek-v3-fp8", "transformers", "t.AutoModelForCausalLM.from_pretrained(", "dequantises FP8 experts per expert, each weight with its own scale, before it stacks them"},
		{"llama4", "gate-up", `then: README "Using the output"`, ""},
		{"gpt-oss", "gate-up", `then: README "Using the output"`, ""},
		// Stacked FP8 is not what transformers loads as the original (its
		// dequantising load leaves the stacked scales unexpected).
		{"deepseek-v3-fp8", "gate-up", `then: README "Using the output"`, ""},
	} {
		t.Run(tc.fixture+"/"+tc.layout, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "out")
			code, out, errOut := runCLI(t, "convert", "--no-progress", "--layout", tc.layout, filepath.Join("..", "..", "fixtures", "hf", tc.fixture), dst)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("no %q in\n%s", tc.want, out)
			}
			if all := out + errOut; tc.notice != "" && (!strings.Contains(all, "--layout transformers: ") || !strings.Contains(all, tc.notice)) {
				t.Errorf("no notice %q in\n%s", tc.notice, errOut)
			}
		})
	}
}
