package quantweights

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// shapedTensors is family.MemTensors that also hands out small tensors' bytes
// (compressed-tensors' weight_shape), as a checkpoint does.
type shapedTensors struct {
	*family.MemTensors
	bytes map[string][]byte
}

func (s shapedTensors) SmallTensorBytes(name string, max int64) ([]byte, error) {
	b, ok := s.bytes[name]
	if !ok || int64(len(b)) > max {
		return nil, fmt.Errorf("no bytes for %s", name)
	}
	return b, nil
}

func newShaped() shapedTensors {
	return shapedTensors{&family.MemTensors{}, map[string][]byte{}}
}

// Find finds each format's weights outside the experts by the
// format's own names, with their [rows, cols] and the tensors
// dequantising them drops (input_scale included), in the checkpoint's
// order, and leaves the experts (skip), plain tensors and integer tensors
// without a scale alone.
func TestQuantisedWeightsFinds(t *testing.T) {
	const attn = "model.layers.1.self_attn.o_proj"
	for _, tc := range []struct {
		f     weightfmt.Format
		build func(s shapedTensors)
		want  []Weight
	}{
		{weightfmt.FP8Block(128, 128, false), func(s shapedTensors) {
			s.Add(attn+".weight", safetensors.F8E4M3, 300, 200)
			s.Add(attn+".weight_scale_inv", safetensors.F32, 3, 2)
			s.Add("model.norm.weight", safetensors.BF16, 200)
			s.Add("model.layers.1.mlp.experts.0.down_proj.weight", safetensors.F8E4M3, 64, 32)
			s.Add("model.layers.1.mlp.experts.0.down_proj.weight_scale_inv", safetensors.F32, 1, 1)
		}, []Weight{{Name: attn + ".weight", Tensors: weightfmt.Tensors{Weight: attn + ".weight", Scale: attn + ".weight_scale_inv"}, Rows: 300, Cols: 200}}},
		{weightfmt.FP8Tensor(safetensors.F32), func(s shapedTensors) {
			s.Add(attn+".weight", safetensors.F8E4M3, 8, 16)
			s.Add(attn+".weight_scale", safetensors.F32, 1, 1)
		}, []Weight{{Name: attn + ".weight", Tensors: weightfmt.Tensors{Weight: attn + ".weight", Scale: attn + ".weight_scale"}, Rows: 8, Cols: 16}}},
		{weightfmt.Int4Pack(32, safetensors.BF16), func(s shapedTensors) {
			s.Add(attn+".weight_packed", safetensors.I32, 8, 12)
			s.Add(attn+".weight_scale", safetensors.BF16, 8, 3)
			s.Add(attn+".weight_shape", safetensors.I64, 2)
			s.bytes[attn+".weight_shape"] = binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 8), 96)
			s.Add("model.layers.1.mlp.gate.tid2eid", safetensors.I32, 64, 2) // a token table, no scale
		}, []Weight{{Name: attn + ".weight", Tensors: weightfmt.Tensors{Weight: attn + ".weight_packed", Scale: attn + ".weight_scale", Shape: attn + ".weight_shape"}, Rows: 8, Cols: 96}}},
		{weightfmt.NVFP4ModelOpt(), func(s shapedTensors) {
			s.Add(attn+".weight", safetensors.U8, 8, 16)
			s.Add(attn+".weight_scale", safetensors.F8E4M3, 8, 2)
			s.Add(attn+".weight_scale_2", safetensors.F32)
			s.Add(attn+".input_scale", safetensors.F32)
		}, []Weight{{Name: attn + ".weight", Tensors: weightfmt.Tensors{Weight: attn + ".weight", Scale: attn + ".weight_scale", Global: attn + ".weight_scale_2",
			Input: attn + ".input_scale"}, Input: attn + ".input_scale", Rows: 8, Cols: 32}}},
	} {
		s := newShaped()
		tc.build(s)
		for i := range tc.want {
			tc.want[i].Format = tc.f // each weight found carries the format it was found in
		}
		got, err := Find(s, tc.f, func(n string) bool { return strings.Contains(n, ".experts.") })
		if err != nil {
			t.Fatalf("%s: %v", tc.f, err)
		}
		if !slices.EqualFunc(got, tc.want, func(a, b Weight) bool { return a == b }) {
			t.Errorf("%s: %+v, want %+v", tc.f, got, tc.want)
		}
	}
	q := Weight{Tensors: weightfmt.Tensors{Weight: "w_packed", Scale: "w_scale", Global: "g", Shape: "s"}, Input: "i"}
	if got := q.Dropped(); !slices.Equal(got, []string{"w_packed", "w_scale", "g", "s", "i"}) {
		t.Errorf("Dropped %v", got)
	}
}

// What cannot be dequantised is refused naming the tensor: an FP8 weight
// without its scale, a weight that is not 2-D, a scale of the wrong grid
// or dtype, a missing global scale, a weight_shape that disagrees, a plain
// name stored beside the packed weight.
func TestQuantisedWeightsRefusals(t *testing.T) {
	const w = "model.layers.0.self_attn.q_proj"
	for _, tc := range []struct {
		name  string
		f     weightfmt.Format
		build func(s shapedTensors)
		want  string
	}{
		{"fp8 without a scale", weightfmt.FP8Block(128, 128, false), func(s shapedTensors) {
			s.Add(w+".weight", safetensors.F8E4M3, 4, 4)
		}, "q_proj.weight is F8_E4M3 without a FP8 scale next to it (" + w + ".weight_scale_inv)"},
		{"3-D", weightfmt.FP8Block(128, 128, false), func(s shapedTensors) {
			s.Add(w+".weight", safetensors.F8E4M3, 2, 4, 4)
			s.Add(w+".weight_scale_inv", safetensors.F32, 1, 1)
		}, "not a 2-D [out, in] matrix"},
		{"scale grid", weightfmt.FP8Block(128, 128, false), func(s shapedTensors) {
			s.Add(w+".weight", safetensors.F8E4M3, 300, 4)
			s.Add(w+".weight_scale_inv", safetensors.F32, 2, 1)
		}, "is F32 [3,1]"},
		{"scale dtype", weightfmt.FP8Channel(safetensors.BF16), func(s shapedTensors) {
			s.Add(w+".weight", safetensors.F8E4M3, 3, 4)
			s.Add(w+".weight_scale", safetensors.F32, 3, 1)
		}, "is BF16 [3,1]"},
		{"global", weightfmt.NVFP4ModelOpt(), func(s shapedTensors) {
			s.Add(w+".weight", safetensors.U8, 2, 8)
			s.Add(w+".weight_scale", safetensors.F8E4M3, 2, 1)
		}, "needs its one F32 global scale " + w + ".weight_scale_2"},
		{"partial group", weightfmt.NVFP4ModelOpt(), func(s shapedTensors) {
			s.Add(w+".weight", safetensors.U8, 2, 4)
			s.Add(w+".weight_scale", safetensors.F8E4M3, 2, 1)
		}, "8 columns, not a whole number of 16-column"},
		{"weight_shape", weightfmt.Int4Pack(0, safetensors.BF16), func(s shapedTensors) {
			s.Add(w+".weight_packed", safetensors.I32, 2, 2)
			s.Add(w+".weight_scale", safetensors.BF16, 2, 1)
			s.Add(w+".weight_shape", safetensors.I64, 2)
			s.bytes[w+".weight_shape"] = binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 3), 16)
		}, "says [3, 16], the weight has 2 rows"},
		{"both plain and packed", weightfmt.Int4Pack(0, safetensors.BF16), func(s shapedTensors) {
			s.Add(w+".weight", safetensors.BF16, 2, 16)
			s.Add(w+".weight_packed", safetensors.I32, 2, 2)
			s.Add(w+".weight_scale", safetensors.BF16, 2, 1)
		}, "stored both plain and as INT4"},
		{"plain format", weightfmt.Plain(safetensors.BF16), func(shapedTensors) {}, "not quantised"},
	} {
		s := newShaped()
		tc.build(s)
		_, err := Find(s, tc.f, func(string) bool { return false })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestMixedQuantisedWeights: a checkpoint mixing two quantised formats
// lists each weight with the format it is stored in: DeepSeek-V4's FP8
// blocks beside its FP4 experts (transformers' weight_scale_inv, or the
// official x.scale E8M0), ModelOpt's FP8 per tensor beside NVFP4; a
// one-format checkpoint has no second format.
func TestMixedQuantisedWeights(t *testing.T) {
	const attn, sh = "layers.1.attn.wkv", "layers.1.ffn.shared_experts.w1"
	dsv4 := weightfmt.MXFP4(weightfmt.NamingDeepSeek, safetensors.I8, safetensors.F8E8M0)
	cases := []struct {
		name  string
		f     weightfmt.Format
		build func(s shapedTensors)
		other string // the second format's quantization and scale dtype; "" none
		want  map[string]string
	}{
		{"DeepSeek-V4 official x.scale", dsv4, func(s shapedTensors) {
			s.Add(attn+".weight", safetensors.F8E4M3, 256, 64)
			s.Add(attn+".scale", safetensors.F8E8M0, 2, 1)
			s.Add(sh+".weight", safetensors.F8E4M3, 32, 64)
			s.Add(sh+".scale", safetensors.F8E8M0, 1, 1)
			s.Add("layers.1.ffn.experts.0.w1.weight", safetensors.I8, 32, 32)
			s.Add("layers.1.ffn.experts.0.w1.scale", safetensors.F8E8M0, 32, 2)
		}, "fp8_block_128x128 F8_E8M0", map[string]string{attn + ".weight": "FP8", sh + ".weight": "FP8"}},
		{"DeepSeek-V4 transformers weight_scale_inv", dsv4, func(s shapedTensors) {
			s.Add(attn+".weight", safetensors.F8E4M3, 256, 64)
			s.Add(attn+".weight_scale_inv", safetensors.F32, 2, 1)
			s.Add("layers.1.mlp.w3.weight", safetensors.I8, 32, 32) // an FP4 weight outside the experts
			s.Add("layers.1.mlp.w3.scale", safetensors.F8E8M0, 32, 2)
		}, "fp8_block_128x128 F32", map[string]string{attn + ".weight": "FP8", "layers.1.mlp.w3.weight": "MXFP4"}},
		{"ModelOpt MIXED_PRECISION", weightfmt.NVFP4ModelOpt(), func(s shapedTensors) {
			s.Add(attn+".weight", safetensors.F8E4M3, 8, 16)
			s.Add(attn+".weight_scale", safetensors.F32, 1, 1) // [] as checkpoint.Open canonicalises it
			s.Add(attn+".input_scale", safetensors.F32)
			s.Add(sh+".weight", safetensors.U8, 8, 16)
			s.Add(sh+".weight_scale", safetensors.F8E4M3, 8, 2)
			s.Add(sh+".weight_scale_2", safetensors.F32)
		}, "fp8_tensor F32", map[string]string{attn + ".weight": "FP8 per-tensor", sh + ".weight": "NVFP4"}},
		{"gpt-oss one format", weightfmt.MXFP4(weightfmt.NamingGptOss, safetensors.U8, safetensors.U8), func(s shapedTensors) {
			s.Add("model.layers.0.self_attn.q_proj.weight", safetensors.BF16, 8, 8)
		}, "", map[string]string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newShaped()
			tc.build(s)
			other, ok := OtherFormat(s, tc.f, 0)
			got := ""
			if ok {
				sc, _ := other.Scale()
				got = other.Quantization() + " " + string(sc.DType)
			}
			if got != tc.other {
				t.Errorf("OtherFormat = %q, want %q", got, tc.other)
			}
			qs, err := FindMixed(s, tc.f, 0, func(n string) bool { return strings.Contains(n, ".experts.") })
			if err != nil {
				t.Fatal(err)
			}
			formats := map[string]string{}
			for _, q := range qs {
				formats[q.Name] = q.Format.String()
			}
			if !maps.Equal(formats, tc.want) {
				t.Errorf("weights %v, want %v", formats, tc.want)
			}
		})
	}
}
