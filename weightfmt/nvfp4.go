package weightfmt

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
)

// Quantizations of NVFP4 weights. ModelOpt's and compressed-tensors'
// differ in names and in what their per-tensor scale means (the one is
// the reciprocal of the other), so a contract must say which it holds.
const (
	QuantNVFP4ModelOpt = "nvfp4_modelopt"
	QuantNVFP4CT       = "nvfp4_ct"
)

// NVFP4Group is the number of elements one E4M3 block scale covers.
const NVFP4Group = 16

// nvfp4 is NVIDIA's FP4: E2M1 elements two to a byte, EVEN element in the
// LOW nibble; one F8_E4M3 scale per 16 elements of a row; and one F32
// scale for the whole weight:
//
//   - ModelOpt (NVIDIA's DeepSeek-R1/V3.2, Kimi-K2.5, MiniMax, Qwen
//     releases): x.weight U8 [rows, cols/2], x.weight_scale F8_E4M3
//     [rows, cols/16], x.weight_scale_2 F32 scalar (and x.input_scale, an
//     activation scale this format does not read): w = fp4 * s * scale_2.
//     llama.cpp's convert_hf_to_gguf.py (_nvfp4_pack: w & 0x0F is the
//     first of a pair; the scale_2 tensor is applied as a multiplier at
//     inference) and vLLM's NVFP4 emulation (dequantize_to_dtype:
//     break_fp4_bytes stacks the low nibble first) read it so.
//   - compressed-tensors nvfp4-pack-quantized (compressors/nvfp4/):
//     x.weight_packed U8 [rows, cols/2] (helpers.py pack_fp4_to_uint8:
//     indices[:, 0] | indices[:, 1] << 4; unpack_fp4_from_uint8 stacks
//     low before high), x.weight_scale F8_E4M3 [rows, cols/16],
//     x.weight_global_scale F32 [1]: w = fp4 * (s / global_scale)
//     (forward.py _dequantize: scale = scale / global_scale). The global
//     scale is the RECIPROCAL of ModelOpt's scale_2: llama.cpp converts it
//     with 1 / scale before treating both alike.
//
// Dequantisation computes as those references do, in float32: the block's
// effective scale first, rounded to float32 (s * scale_2, or s /
// global_scale), then the E2M1 value times it, rounded again. A row must
// be whole groups (compressed-tensors' _process_group raises otherwise;
// vLLM's reference reshapes the row into groups of 16).
type nvfp4 struct {
	ct bool // compressed-tensors: the global scale divides
}

// NVFP4ModelOpt is ModelOpt's NVFP4 (weight_scale_2 multiplies).
func NVFP4ModelOpt() Format { return nvfp4{} }

// NVFP4CT is compressed-tensors' NVFP4 (weight_global_scale divides).
func NVFP4CT() Format { return nvfp4{ct: true} }

func init() {
	build := func(ct bool, naming string) func(Spec) (Format, error) {
		c := specCheck{name: nvfp4{ct: ct}.String(), dtypes: []safetensors.DType{safetensors.U8},
			scales: []safetensors.DType{safetensors.F8E4M3}, namings: []string{naming}, block: &[2]int64{1, NVFP4Group}}
		return func(s Spec) (Format, error) {
			if _, _, _, err := c.read(s); err != nil {
				return nil, err
			}
			return nvfp4{ct: ct}, nil
		}
	}
	registerByConfig(QuantNVFP4ModelOpt, build(false, NamingModelOpt))
	registerByConfig(QuantNVFP4CT, build(true, NamingCompressedTensors))
}

func (f nvfp4) Quantization() string {
	if f.ct {
		return QuantNVFP4CT
	}
	return QuantNVFP4ModelOpt
}

func (f nvfp4) DType() safetensors.DType { return safetensors.U8 }

// Packing: two E2M1 elements to a byte.
func (f nvfp4) Packing() (elems, bytes int64) { return 2, 1 }

func (f nvfp4) String() string {
	if f.ct {
		return "NVFP4 (compressed-tensors)"
	}
	return "NVFP4"
}

// Scale is the E4M3 block scale, x.weight_scale for both producers.
func (f nvfp4) Scale() (Scale, bool) {
	return Scale{Suffix: "_scale", DType: safetensors.F8E4M3, Block: [2]int64{1, NVFP4Group}}, true
}

// GlobalScale is ModelOpt's weight_scale_2 (a multiplier) or
// compressed-tensors' weight_global_scale (a divisor), F32.
func (f nvfp4) GlobalScale() GlobalScale {
	if f.ct {
		return GlobalScale{Suffix: "_global_scale", DType: safetensors.F32, Divides: true}
	}
	return GlobalScale{Suffix: "_scale_2", DType: safetensors.F32}
}

// TensorsOf names the weight's tensors as its producer does, with the
// static activation scale of a W4A4 export (ModelOpt's input_scale,
// compressed-tensors' input_global_scale, its reciprocal likewise).
func (f nvfp4) TensorsOf(weight string) Tensors {
	if f.ct {
		return Tensors{Weight: weight + "_packed", Scale: weight + "_scale", Global: weight + "_global_scale",
			Input: inputName(weight, "input_global_scale")}
	}
	return Tensors{Weight: weight, Scale: weight + "_scale", Global: weight + "_scale_2", Input: inputName(weight, "input_scale")}
}

// Fold: a factor would fold exactly (to float32) into the per-tensor
// scale (ModelOpt: multiply weight_scale_2; compressed-tensors: divide
// weight_global_scale), not into the E4M3 block scales, which would round
// coarsely. FoldRule cannot name that tensor yet, so the fold is refused.
func (f nvfp4) Fold() FoldRule {
	return FoldRule{refusal: "the NVFP4 block scales are E4M3 and would round %s; it belongs in the per-tensor " +
		"weight" + f.GlobalScale().Suffix + ", which moeprep does not fold into yet"}
}

// Dequantise refuses: an NVFP4 weight means nothing without its global
// scale (DequantiseGlobal).
func (f nvfp4) Dequantise(raw []byte, rows, cols int, scale []byte, dst []float32) error {
	return fmt.Errorf("%s dequant: the weight needs its global scale (%s): use DequantiseGlobal", f, "weight"+f.GlobalScale().Suffix)
}

// DequantiseGlobal is e2m1(nibble) * eff[s] for each element, eff[s] =
// float32(e4m3(s) * scale_2) (ModelOpt) or float32(e4m3(s) / global)
// (compressed-tensors), each product rounded to float32.
// exactValues is what DequantiseGlobal computes, in float64: the block's
// effective scale rounded to float32 as the references round it, the E2M1
// value times it; where that scale is itself past float32 (the references
// get an infinity), the E2M1 value times its exact value, and NaN for a
// zero (0 times their infinity). Finite unless the block scale is E4M3's
// NaN or the global scale is not finite (exactDequantiser).
func (f nvfp4) exactValues(raw []byte, rows, cols int, scale, global []byte) (func(int) (float64, bool), error) {
	m := Matrix{Format: f, Rows: int64(rows), Cols: int64(cols)}
	if err := checkSizes(m, raw, scale, rows*cols); err != nil {
		return nil, err
	}
	if len(global) != 4 {
		return nil, fmt.Errorf("%s dequant: %d bytes of global scale, want one F32", f, len(global))
	}
	if err := wholeGroups(f, cols, NVFP4Group); err != nil {
		return nil, err
	}
	g := math.Float32frombits(binary.LittleEndian.Uint32(global))
	return func(i int) (float64, bool) {
		n, s := fp4At(raw, scale, cols, NVFP4Group, i)
		e, x := numfmt.E4M3ToF32(s), float64(numfmt.E2M1ToF32(n))
		eff := float64(e) * float64(g) // exact: 4 bits of significand times 24
		if f.ct {
			eff = float64(e) / float64(g) // rounded to float32 below as if once
		}
		ok := finite32(e) && finite32(g)
		if e32 := float32(eff); !math.IsInf(float64(e32), 0) {
			return x * float64(e32), ok
		}
		if x == 0 {
			return math.NaN(), ok
		}
		return x * eff, ok
	}, nil
}

func (f nvfp4) DequantiseGlobal(raw []byte, rows, cols int, scale, global []byte, dst []float32) error {
	m := Matrix{Format: f, Rows: int64(rows), Cols: int64(cols)}
	if err := checkSizes(m, raw, scale, len(dst)); err != nil {
		return err
	}
	if len(global) != 4 {
		return fmt.Errorf("%s dequant: %d bytes of global scale, want one F32", f, len(global))
	}
	if err := wholeGroups(f, cols, NVFP4Group); err != nil {
		return err
	}
	g := math.Float32frombits(binary.LittleEndian.Uint32(global))
	var tab [256][16]float32
	for s := range 256 {
		// The explicit conversions round each step to float32 (Go may
		// otherwise fuse or widen).
		eff := float32(numfmt.E4M3ToF32(byte(s)) * g)
		if f.ct {
			eff = float32(numfmt.E4M3ToF32(byte(s)) / g)
		}
		for n := range 16 {
			tab[s][n] = float32(numfmt.E2M1ToF32(byte(n)) * eff)
		}
	}
	return decodeFP4(raw, rows, cols, NVFP4Group, scale, &tab, dst)
}
