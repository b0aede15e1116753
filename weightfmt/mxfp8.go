package weightfmt

import (
	"fmt"

	"github.com/moeprep/moeprep/safetensors"
)

// QuantMXFP8 is the quantization of MXFP8 weights: NVIDIA ModelOpt's
// quant_algo MXFP8 export and quant_method mxfp8 (MiniMax-M3-MXFP8).
const QuantMXFP8 = "mxfp8"

// MXFP8Group is the number of elements of a row one E8M0 scale covers
// (OCP MX; ModelOpt's MXFP8QTensor.BLOCK_SIZE, MiniMax's
// weight_block_size [1, 32]).
const MXFP8Group = 32

// NamingMiniMax: quant_method mxfp8 as MiniMax-M3-MXFP8 writes it (and
// SGLang's and vLLM's Mxfp8Config read it): x.weight F8_E4M3 and its E8M0
// scales as x.weight_scale_inv.
const NamingMiniMax = "minimax"

// mxfp8 is OCP MX FP8: F8_E4M3 elements, one byte each, and one E8M0 scale
// per 32 elements of a row; w = e4m3(q) * 2^(e - 127). The producers agree
// on the arithmetic and differ in the scale's name:
//
//   - ModelOpt (NVIDIA/Model-Optimizer@a2fbac7b modelopt/torch/quantization/
//     qtensor/mxfp8_tensor.py, exported by modelopt/torch/export/
//     unified_export_hf.py; read by vLLM@00155cde quantization/modelopt.py's
//     ModelOptMxFp8 classes):
//     x.weight F8_E4M3 [out, in] and x.weight_scale U8 [out, in/32], the
//     biased exponent; dequantize is q * exp2(scale - 127). The exporter
//     asserts in % 32 == 0; experts are exported one module each
//     (experts.E.{gate,up,down}_proj).
//   - MiniMax-M3-MXFP8 (quant_method mxfp8, weight_block_size [1, 32];
//     NVIDIA/TensorRT-LLM@2c039e8b minimaxm3_weight_mapper.py, SGLang's
//     and vLLM's Mxfp8Config): x.weight F8_E4M3 and x.weight_scale_inv U8, one per
//     1x32 block: a multiplier despite its name, as DeepSeek's FP8 is.
//
// Rows must be whole groups (both producers assert it). E8M0 0xFF is NaN
// (OCP MX; numfmt), which neither producer writes: ModelOpt clamps the
// exponent to [-127, 127], so its bytes are 0..254.
type mxfp8 struct {
	naming string
	scale  safetensors.DType // U8, or F8_E8M0: the same bytes
}

// MXFP8 is the MXFP8 format with scales of dtype scale (U8 or F8_E8M0)
// named as naming says (NamingModelOpt: x.weight_scale; NamingMiniMax:
// x.weight_scale_inv).
func MXFP8(naming string, scale safetensors.DType) Format {
	return mxfp8{naming: naming, scale: scale}
}

func init() {
	c := specCheck{name: "MXFP8",
		dtypes:  []safetensors.DType{safetensors.F8E4M3},
		scales:  []safetensors.DType{safetensors.U8, safetensors.F8E8M0},
		namings: []string{NamingModelOpt, NamingMiniMax},
		block:   &[2]int64{1, MXFP8Group}}
	// F8_E4M3 weights are FP8 blocks unless a config says MXFP8.
	registerByConfig(QuantMXFP8, func(s Spec) (Format, error) {
		_, sd, naming, err := c.read(s)
		if err != nil {
			return nil, err
		}
		return MXFP8(naming, sd), nil
	})
}

func (f mxfp8) Quantization() string          { return QuantMXFP8 }
func (f mxfp8) DType() safetensors.DType      { return safetensors.F8E4M3 }
func (f mxfp8) Packing() (elems, bytes int64) { return 1, 1 }
func (f mxfp8) String() string                { return "MXFP8" }

// Naming is whose tensor names the weights carry (Named).
func (f mxfp8) Naming() string { return f.naming }

// Scale is the E8M0 grid, [rows, cols/32]: "x.weight" + "_scale"
// (ModelOpt) or + "_scale_inv" (MiniMax); a stack's "gate_up_proj" +
// the same suffix.
func (f mxfp8) Scale() (Scale, bool) {
	suffix := "_scale"
	if f.naming == NamingMiniMax {
		suffix = "_scale_inv"
	}
	return Scale{Suffix: suffix, DType: f.scale, Block: [2]int64{1, MXFP8Group}}, true
}

// Fold: E8M0 scales are powers of two, and a factor such as 2.5 would
// leave that grid; folding into the E4M3 bytes would round every element
// a second time.
func (f mxfp8) Fold() FoldRule {
	return FoldRule{refusal: "the MXFP8 scales are E8M0 (powers of two) and cannot absorb %s exactly"}
}

// Dequantise is e4m3(q) * 2^(e-127) for each element, one float32
// multiply (exact: a 4-bit significand times a power of two, rounded only
// where the product is a float32 subnormal or past float32).
func (f mxfp8) Dequantise(raw []byte, rows, cols int, scale []byte, dst []float32) error {
	s, bo, bi, err := f.e4m3Grid(rows, cols, scale)
	if err != nil {
		return err
	}
	return DequantE4M3(raw, rows, cols, s, bo, bi, dst)
}

// e4m3Grid is the weight's E8M0 grid decoded to float32 and the block it
// scales, 1x32 (e4m3Scaled: the FP8 formats' fast paths take it).
func (f mxfp8) e4m3Grid(rows, cols int, scale []byte) ([]float32, int, int, error) {
	m := Matrix{Format: f, Rows: int64(rows), Cols: int64(cols)}
	sr, sc := m.ScaleShape()
	if rows < 0 || cols < 0 || product(sr, sc) != int64(len(scale)) {
		return nil, 0, 0, fmt.Errorf("%s dequant: %d scale bytes for a %dx%d weight, want %dx%d %s", f, len(scale), rows, cols, sr, sc, f.scale)
	}
	if err := wholeGroups(f, cols, MXFP8Group); err != nil {
		return nil, 0, 0, err
	}
	s := make([]float32, len(scale))
	if err := Decode(safetensors.F8E8M0, scale, s); err != nil { // U8 holds the same bytes
		return nil, 0, 0, err
	}
	return s, 1, MXFP8Group, nil
}

// exactValues: the E4M3 value times its group's E8M0 scale, exact in
// float64 (exactDequantiser).
func (f mxfp8) exactValues(raw []byte, rows, cols int, scale, _ []byte) (func(int) (float64, bool), error) {
	return exactE4M3(f, raw, rows, cols, scale)
}

// RequantRule is ModelOpt's MXFP8 rule (mxfp8_tensor.py
// _compute_e8m0_exponent and quantize_with_scale), the only producer's
// rule that is published: per group of 32 along a row, e = ceil(log2(amax
// / 448)) clamped to [-127, 127] (amax 0 gives -127), stored as the byte e
// + 127; each element e4m3(clamp(w * 2^-e, -448, 448)), rounded to the
// nearest E4M3 value, ties to even. In requant.go's terms: scale = amax /
// 448 in float32, raised to 2^-127 where smaller, rounded up to a power
// of two. One difference, on purpose: torch's float32 log2 of an amax /
// 448 within a few float32 ulps above a power of two 2^k rounds to k,
// where the exact ceil here gives k+1; ModelOpt's codes then saturate at
// 448 where these are one step lower. No bf16 or f16 weight meets it
// (amax / 448 is then at least 2^-8 relative away from a power of two,
// or exactly one).
func (f mxfp8) RequantRule() RequantRule {
	r := e4m3Rule(true)
	r.Name, r.MinScale = "mxfp8-e8m0", MXFP8MinScale
	return r
}

// MXFP8MinScale is the smallest MXFP8 scale, 2^-127 (E8M0 byte 0): ModelOpt
// clamps the exponent of an all-zero or tiny group to -127.
const MXFP8MinScale = 0x1p-127

func (f mxfp8) encodeRow(vals, scales []float32, bc int, dst []byte) {
	encodeE4M3Row(vals, scales, bc, dst)
}
