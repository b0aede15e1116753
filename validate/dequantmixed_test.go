package validate

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/byteproof"
	"github.com/moeprep/moeprep/weightfmt"
)

// convert --dtype over checkpoints mixing two quantised formats (issue
// 29): DeepSeek-V4's FP4 experts beside FP8 128x128 blocks (transformers'
// F32 weight_scale_inv, or the official layout's x.scale E8M0), ModelOpt
// MIXED_PRECISION's NVFP4 experts beside FP8 per-tensor attention. Each
// weight is dequantised by its own format; the contract records a group
// per (group, source format); a value of a second-format weight in DST is
// exactly its code times its scale rounded once; and one ulp off in such a
// weight fails the byte proof.
func TestDequantMixedFormats(t *testing.T) {
	type group struct {
		group, quantization, scaleDType string
		tensors                         int
	}
	cases := []struct {
		preset string
		o      convert.Options
		groups []group
		// fp8 is a weight of the second format (F8_E4M3, its 128x128 or
		// per-tensor scale beside it) and its scale tensor in SRC
		fp8, fp8Scale string
	}{
		{"small-deepseek-v4-fp4", convert.Options{DType: safetensors.BF16},
			[]group{{"experts", "mxfp4", "F8_E8M0", 72}, {"other", "fp8_block_128x128", "", 21}},
			"model.layers.1.ffn.shared_experts.w1.weight", "model.layers.1.ffn.shared_experts.w1.weight_scale_inv"},
		{"small-deepseek-v4-official", convert.Options{DType: safetensors.BF16, Layout: layout.GateUp},
			[]group{{"experts", "mxfp4", "F8_E8M0", 72}, {"other", "fp8_block_128x128", "F8_E8M0", 31}},
			"layers.2.ffn.shared_experts.w2.weight", "layers.2.ffn.shared_experts.w2.scale"},
		{"small-deepseek-v4-official", convert.Options{DType: safetensors.BF16, FuseShared: true, TP: 2},
			[]group{{"experts", "mxfp4", "F8_E8M0", 72}, {"experts", "fp8_block_128x128", "F8_E8M0", 9}, {"other", "fp8_block_128x128", "F8_E8M0", 22}},
			"layers.1.attn.wkv.weight", "layers.1.attn.wkv.scale"},
		{"small-deepseek-v3-nvfp4-mixed", convert.Options{DType: safetensors.F16, Layout: layout.UpGate},
			[]group{{"experts", "nvfp4_modelopt", "", 96}, {"other", "nvfp4_modelopt", "", 6}, {"other", "fp8_tensor", "F32", 18}},
			"model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.q_a_proj.weight_scale"},
	}
	specs := presetSpecs(t)
	for _, tc := range cases {
		t.Run(tc.preset+"/"+string(tc.o.Layout)+map[bool]string{true: "/fused"}[tc.o.FuseShared], func(t *testing.T) {
			src := synthFrom(t, specs, tc.preset)
			dst := convertInto(t, src, tc.o)
			c := readContract(t, dst)
			if c.Dequantized == nil || len(c.Dequantized.Groups) != len(tc.groups) {
				t.Fatalf("dequantized %+v, want groups %+v", c.Dequantized, tc.groups)
			}
			for i, g := range c.Dequantized.Groups {
				if got := (group{g.Group, g.Quantization, g.ScaleDType, g.Tensors}); got != tc.groups[i] {
					t.Errorf("group %d: %+v, want %+v", i, got, tc.groups[i])
				}
			}
			if c.SharedQuantization != "" || c.SharedNaming != "" {
				t.Errorf("shared_quantization %q naming %q: a dequantised shared expert is stored like the experts", c.SharedQuantization, c.SharedNaming)
			}
			rep := runPass(t, Options{Src: src, Dst: dst, Device: DeviceCPU}, "mixed --dtype")
			// Element 0 of the FP8 weight: its code times its scale's first
			// entry, rounded once to the target dtype.
			sck := cktest.Open(t, src)
			code, scale := cktest.Bytes(t, sck, tc.fp8), cktest.Bytes(t, sck, tc.fp8Scale)
			st, _ := sck.Tensor(tc.fp8Scale)
			s := make([]float32, 1)
			sd := st.DType
			if err := weightfmt.Decode(sd, scale[:sd.Size()], s); err != nil {
				t.Fatal(err)
			}
			exact := numfmt.E4M3ToF32(code[0]) * s[0]
			if exact == 0 {
				t.Fatalf("%s[0] is zero: pick an element that tests the scale", tc.fp8)
			}
			want := uint16(0)
			switch tc.o.DType {
			case safetensors.BF16:
				want = numfmt.F32ToBF16(exact)
			case safetensors.F16:
				want = numfmt.F32ToF16(exact)
			}
			dck := cktest.Open(t, dst)
			got := cktest.Bytes(t, dck, tc.fp8)
			if v := binary.LittleEndian.Uint16(got); v != want {
				t.Errorf("%s[0] = 0x%04x, want 0x%04x (E4M3 0x%02x x %g = %g rounded once)", tc.fp8, v, want, code[0], s[0], exact)
			}
			// One ulp off in that dequantised weight: the byte proof fails.
			rewriteTensor(t, dst, tc.fp8, func(raw []byte, _ []int64) {
				binary.LittleEndian.PutUint16(raw[2:], binary.LittleEndian.Uint16(raw[2:])^1)
			})
			rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Device: DeviceCPU, Bytes: BytesOnly})
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Failed() || rep.Bytes == nil || rep.Bytes.Mismatch == nil || rep.Bytes.Mismatch.Kind != byteproof.MismatchDequant {
				t.Fatalf("one ulp off in %s: failed %v, byte proof %+v, want a %q mismatch", tc.fp8, rep.Failed(), rep.Bytes, byteproof.MismatchDequant)
			}
		})
	}
}
