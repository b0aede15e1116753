package weightfmt

import (
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
)

// TestFP8BlockDeepSeekNaming: DeepSeek-V4's official FP8 (x.weight
// F8_E4M3, x.scale F8_E8M0 per 128x128 block) names, decodes, folds and
// records itself as the contract needs; transformers' F32
// weight_scale_inv is unchanged.
func TestFP8BlockDeepSeekNaming(t *testing.T) {
	cases := []struct {
		name        string
		spec        Spec
		tensors     Tensors
		scaleBytes  []byte // a 2x1 grid of a 200x64 weight
		want        [2]float32
		foldRefused bool
		contract    [2]string // scale dtype, naming ContractSpec records
		err         string
	}{
		{name: "transformers F32 weight_scale_inv", spec: Spec{Quantization: QuantFP8Block},
			tensors:    Tensors{Weight: "l.w1.weight", Scale: "l.w1.weight_scale_inv"},
			scaleBytes: []byte{0, 0, 0x80, 0x3f, 0, 0, 0x20, 0x40}, want: [2]float32{1, 2.5}},
		{name: "DeepSeek x.scale F8_E8M0", spec: Spec{Quantization: QuantFP8Block, Naming: NamingDeepSeek, ScaleDType: safetensors.F8E8M0},
			tensors:    Tensors{Weight: "l.w1.weight", Scale: "l.w1.scale"},
			scaleBytes: []byte{127, 130}, want: [2]float32{1, 8}, foldRefused: true, contract: [2]string{"F8_E8M0", NamingDeepSeek}},
		{name: "DeepSeek x.scale as U8 bytes", spec: Spec{Quantization: QuantFP8Block, Naming: NamingDeepSeek, ScaleDType: safetensors.U8},
			tensors:    Tensors{Weight: "l.w1.weight", Scale: "l.w1.scale"},
			scaleBytes: []byte{126, 120}, want: [2]float32{0.5, 1.0 / 128}, foldRefused: true, contract: [2]string{"U8", NamingDeepSeek}},
		{name: "DeepSeek x.scale F32", spec: Spec{Quantization: QuantFP8Block, Naming: NamingDeepSeek, ScaleDType: safetensors.F32},
			tensors:    Tensors{Weight: "l.w1.weight", Scale: "l.w1.scale"},
			scaleBytes: []byte{0, 0, 0x80, 0x3f, 0, 0, 0x20, 0x40}, want: [2]float32{1, 2.5}, contract: [2]string{"", NamingDeepSeek}},
		{name: "E8M0 scales without DeepSeek's names", spec: Spec{Quantization: QuantFP8Block, ScaleDType: safetensors.F8E8M0},
			err: "FP8 128x128 scale dtype F8_E8M0: want F32"},
		{name: "a naming FP8 has not", spec: Spec{Quantization: QuantFP8Block, Naming: NamingModelOpt}, err: `FP8 weights named as "modelopt"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := New(tc.spec)
			if testkit.WantErr(t, err, tc.err) {
				return
			}
			if got := TensorsOf(f, "l.w1.weight"); got != tc.tensors {
				t.Errorf("TensorsOf = %+v, want %+v", got, tc.tensors)
			}
			// A 200x64 weight: two 128-row blocks, every code 0x38 (E4M3 1.0)
			// except element (130, 5) = 0xC4 (-3.0).
			rows, cols := 200, 64
			raw := make([]byte, rows*cols)
			for i := range raw {
				raw[i] = 0x38
			}
			raw[130*cols+5] = 0xC4
			dst := make([]float32, rows*cols)
			if err := f.Dequantise(raw, rows, cols, tc.scaleBytes, dst); err != nil {
				t.Fatal(err)
			}
			if numfmt.E4M3ToF32(0xC4) != -3 {
				t.Fatalf("E4M3 0xC4 = %g", numfmt.E4M3ToF32(0xC4))
			}
			if dst[0] != tc.want[0] || dst[127*cols+63] != tc.want[0] || dst[128*cols] != tc.want[1] || dst[130*cols+5] != -3*tc.want[1] {
				t.Errorf("decoded %g %g %g %g, want %g %g %g %g", dst[0], dst[127*cols+63], dst[128*cols], dst[130*cols+5],
					tc.want[0], tc.want[0], tc.want[1], -3*tc.want[1])
			}
			if refused := f.Fold().Refusal("rsf") != ""; refused != tc.foldRefused {
				t.Errorf("fold refused %v, want %v", refused, tc.foldRefused)
			}
			sd, naming := ContractSpec(f)
			if got := [2]string{string(sd), naming}; got != tc.contract {
				t.Errorf("ContractSpec = %q, want %q", got, tc.contract)
			}
			if err := f.Dequantise(raw, rows, cols, append(tc.scaleBytes, 0), dst); err == nil {
				t.Error("a scale grid one byte long decoded")
			}
		})
	}
}
