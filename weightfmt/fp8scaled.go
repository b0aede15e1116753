package weightfmt

import "github.com/moeprep/moeprep/safetensors"

// Quantizations of FP8 weights with one scale per output row or one for
// the whole weight.
const (
	QuantFP8Channel = "fp8_channel"
	QuantFP8Tensor  = "fp8_tensor"
)

// fp8Scaled is F8_E4M3 weights multiplied by a weight_scale that spans
// whole axes: per channel, a [rows, 1] grid (compressed-tensors
// float-quantized strategy "channel": initialize_qparams makes the scale
// (observed_shape[-2], 1)); per tensor, one entry (compressed-tensors
// strategy "tensor", shape (1,); quant_method "fp8" without
// weight_block_size and ModelOpt FP8, a scalar). In both the scale is a
// multiplier, w = q * s (compressed-tensors forward.py _dequantize:
// x_q * scale; llama.cpp convert_hf_to_gguf.py dequant_simple:
// weight.float() * scale).
//
// The scale's dtype depends on the producer: compressed-tensors makes it
// the dtype of the weight it observed (lifecycle/initialize.py:
// scale_dtype = observed_dtype: BF16 for a bf16 model, F16 for a dtype
// that is not a float), while ModelOpt's and quant_method "fp8" per-tensor
// checkpoints store an F32 scalar (llama.cpp's handling of
// ModelOpt's 1-D FP8 weight_scale; not checked against hub files here:
// vLLM allocates every FP8 scale as float32 and casts whatever it loads,
// so its loaders do not tell). Both occur, so Spec.ScaleDType says which;
// the defaults are BF16 per channel (what llm-compressor writes for a
// bf16 model) and F32 per tensor.
type fp8Scaled struct {
	block [2]int64 // {1, 0} per channel, {0, 0} per tensor
	scale safetensors.DType
}

// FP8Channel is FP8 weights with one scale of dtype scale per output row.
func FP8Channel(scale safetensors.DType) Format {
	return fp8Scaled{block: [2]int64{1, 0}, scale: scale}
}

// FP8Tensor is FP8 weights with one scale of dtype scale for the whole
// weight.
func FP8Tensor(scale safetensors.DType) Format {
	return fp8Scaled{block: [2]int64{0, 0}, scale: scale}
}

func init() {
	floats := []safetensors.DType{safetensors.BF16, safetensors.F32, safetensors.F16}
	build := func(name string, block [2]int64, scales []safetensors.DType) func(Spec) (Format, error) {
		c := specCheck{name: name, dtypes: []safetensors.DType{safetensors.F8E4M3}, scales: scales,
			namings: []string{NamingCompressedTensors, NamingModelOpt}, block: &block}
		return func(s Spec) (Format, error) {
			_, sd, _, err := c.read(s)
			if err != nil {
				return nil, err
			}
			return fp8Scaled{block: block, scale: sd}, nil
		}
	}
	registerByConfig(QuantFP8Channel, build("FP8 per-channel", [2]int64{1, 0}, floats))
	registerByConfig(QuantFP8Tensor, build("FP8 per-tensor", [2]int64{0, 0},
		[]safetensors.DType{safetensors.F32, safetensors.BF16, safetensors.F16}))
}

func (f fp8Scaled) perTensor() bool { return f.block[0] == 0 }

func (f fp8Scaled) Quantization() string {
	if f.perTensor() {
		return QuantFP8Tensor
	}
	return QuantFP8Channel
}

func (f fp8Scaled) DType() safetensors.DType      { return safetensors.F8E4M3 }
func (f fp8Scaled) Packing() (elems, bytes int64) { return 1, 1 }

func (f fp8Scaled) String() string {
	if f.perTensor() {
		return "FP8 per-tensor"
	}
	return "FP8 per-channel"
}

// Scale is weight_scale next to weight (compressed-tensors, ModelOpt and
// vLLM's fp8 all name it so).
func (f fp8Scaled) Scale() (Scale, bool) {
	return Scale{Suffix: "_scale", DType: f.scale, Block: f.block}, true
}

// Fold multiplies the scales, leaving the FP8 bytes alone: by default
// where they are F32 (half a float32 ulp), only when asked where they are
// BF16 or F16.
func (f fp8Scaled) Fold() FoldRule {
	return FoldRule{Into: FoldScales, DType: f.scale, ByDefault: f.scale == safetensors.F32}
}

// Dequantise is each E4M3 value times its row's (or the weight's) scale,
// rounded once to float32.
func (f fp8Scaled) Dequantise(raw []byte, rows, cols int, scale []byte, dst []float32) error {
	m := Matrix{Format: f, Rows: int64(rows), Cols: int64(cols)}
	if err := checkSizes(m, raw, scale, len(dst)); err != nil || len(dst) == 0 {
		return err
	}
	return dequantE4M3(f, raw, rows, cols, scale, dst)
}

// exactValues: the E4M3 value times its row's or the weight's scale
// (exactDequantiser).
func (f fp8Scaled) exactValues(raw []byte, rows, cols int, scale, _ []byte) (func(int) (float64, bool), error) {
	return exactE4M3(f, raw, rows, cols, scale)
}

// e4m3Grid is the weight's scales decoded to float32 and the block each
// scales: a row, or the whole weight (e4m3Scaled).
func (f fp8Scaled) e4m3Grid(rows, cols int, scale []byte) ([]float32, int, int, error) {
	s := make([]float32, len(scale)/f.scale.Size())
	if err := Decode(f.scale, scale, s); err != nil {
		return nil, 0, 0, err
	}
	bo, bi := max(rows, 1), max(cols, 1)
	if !f.perTensor() {
		bo = 1
	}
	return s, bo, bi, nil
}

// RequantRule is the E4M3 rule (requant.go): scale = amax / 448 per row or
// per weight, rounded to the scale dtype.
func (f fp8Scaled) RequantRule() RequantRule { return e4m3Rule(false) }

func (f fp8Scaled) encodeRow(vals, scales []float32, bc int, dst []byte) {
	encodeE4M3Row(vals, scales, bc, dst)
}
