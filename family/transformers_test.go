package family

import (
	"strings"
	"testing"

	"github.com/moeprep/moeprep/layout"
)

// TestTransformersOutputForm: --layout transformers writes the family's
// form for bf16 experts and the experts as stored for every quantised
// format, with the reason of the loader that reads that format; a family
// already written as stored keeps its own reason.
func TestTransformersOutputForm(t *testing.T) {
	llama4 := TransformersForm{InOut: true, Why: "Llama4TextExperts computes x @ W"}
	gptOSS := TransformersForm{AsStored: true, Why: "GptOssExperts holds gate_up_proj interleaved"}
	for _, tc := range []struct {
		name   string
		family TransformersForm
		q      Quantization
		layout layout.Layout
		or     layout.Orientation
		module string
		why    string // a part of the form's Why; "" where it must be the family's
	}{
		{"bf16 gate-up", TransformersForm{}, QuantNone, layout.GateUp, layout.OutIn, "", ""},
		{"unset quantization", TransformersForm{}, "", layout.GateUp, layout.OutIn, "", ""},
		{"bf16 llama4", llama4, QuantNone, layout.GateUp, layout.InOut, "", ""},
		{"bf16 granite", graniteTransformers, QuantNone, layout.GateUp, layout.OutIn, "block_sparse_moe", ""},
		{"fp8 block", TransformersForm{}, QuantFP8Block, layout.AsStored, layout.OutIn, "", "gate_up_proj_scale_inv is an unexpected key with dequantize=True"},
		{"fp8 tensor", TransformersForm{}, QuantFP8Tensor, layout.AsStored, layout.OutIn, "", "dequantises FP8 experts per expert"},
		{"fp8 block llama4", llama4, QuantFP8Block, layout.AsStored, layout.OutIn, "", "dequantises FP8 experts per expert"},
		{"fp8 block granite", graniteTransformers, QuantFP8Block, layout.AsStored, layout.OutIn, "", "reads no stacked FP8 scale"},
		{"fp8 channel", TransformersForm{}, QuantFP8Channel, layout.AsStored, layout.OutIn, "", "decompresses compressed-tensors experts per expert"},
		{"int4", TransformersForm{}, QuantInt4Pack, layout.AsStored, layout.OutIn, "", "decompresses compressed-tensors experts per expert"},
		{"nvfp4 ct", TransformersForm{}, QuantNVFP4CT, layout.AsStored, layout.OutIn, "", "decompresses compressed-tensors experts per expert"},
		{"nvfp4 modelopt", TransformersForm{}, QuantNVFP4, layout.AsStored, layout.OutIn, "", "reads nvfp4_modelopt experts per expert"},
		{"mxfp8", TransformersForm{}, QuantMXFP8, layout.AsStored, layout.OutIn, "", "reads mxfp8 experts per expert"},
		{"gpt-oss mxfp4 keeps its reason", gptOSS, QuantMXFP4, layout.AsStored, layout.OutIn, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Plan{Transformers: tc.family, Quantization: tc.q}
			got := p.TransformersOutputForm()
			l, or := got.Layout()
			if l != tc.layout || or != tc.or || got.Module != tc.module {
				t.Errorf("written %s %s under %q, want %s %s under %q", l, or, got.Module, tc.layout, tc.or, tc.module)
			}
			if tc.why == "" && got != tc.family {
				t.Errorf("form %+v, want the family's %+v", got, tc.family)
			}
			if tc.why != "" && !strings.Contains(got.Why, tc.why) {
				t.Errorf("why %q, want it to say %q", got.Why, tc.why)
			}
			if got.AsStored && !strings.HasPrefix(got.Describe("m"), "its experts are written as the checkpoint stores them: ") {
				t.Errorf("notice %q", got.Describe("m"))
			}
		})
	}
}
