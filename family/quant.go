package family

import (
	"fmt"
	"slices"

	"github.com/moeprep/moeprep/weightfmt"
)

// fp8Format is the only FP8 layout readQuant accepts: DeepSeek's official
// 128x128 blocks (Qwen3's FP8 releases copy it). scale_fmt does not change
// its shapes, only whether rsf folds (Plan.Format). Only
// CanonicalScaleShape, which the checkpoint reader calls before any plan
// exists, names it; the checks ask the plan's Format.
var fp8Format = weightfmt.FP8Block(weightfmt.FP8DefaultBlock, weightfmt.FP8DefaultBlock, false)

// Format is how the plan's expert weights are stored, from what readQuant
// read (quantization_config) and the experts' dtype.
func (p *Plan) Format() (weightfmt.Format, error) {
	q := p.Quantization
	if q == "" {
		q = QuantNone
	}
	return weightfmt.New(weightfmt.Spec{Quantization: string(q), DType: p.WeightDType, ScaleFmt: p.ScaleFmt})
}

// readQuant reads quantization_config. Only DeepSeek-style FP8 (quant_method
// fp8, e4m3, weight_block_size [128,128], dynamic activations) is supported:
// other methods pack weights differently (int4 groups, zero points, static
// activation scales) and would be copied or stacked wrongly.
func readQuant(c config) (Quantization, string, error) {
	q, ok, err := c.object("quantization_config")
	if err != nil || !ok {
		return QuantNone, "", err
	}
	method, err := q.str("quant_method", "")
	if err != nil {
		return "", "", err
	}
	if method == "" {
		return "", "", q.missing("quant_method")
	}
	if method != "fp8" {
		return "", "", q.errorf("quant_method", "%q is not supported (only fp8 with 128x128 block scales)", method)
	}
	if f, err := q.str("fmt", "e4m3"); err != nil {
		return "", "", err
	} else if f != "e4m3" {
		return "", "", q.errorf("fmt", "%q is not supported (only e4m3)", f)
	}
	if a, err := q.str("activation_scheme", "dynamic"); err != nil {
		return "", "", err
	} else if a != "dynamic" {
		return "", "", q.errorf("activation_scheme", "%q is not supported (only dynamic)", a)
	}
	if !q.has("weight_block_size") {
		return "", "", q.missing("weight_block_size")
	}
	block, err := q.ints("weight_block_size")
	if err != nil {
		return "", "", err
	}
	if !slices.Equal(block, []int{weightfmt.FP8DefaultBlock, weightfmt.FP8DefaultBlock}) {
		return "", "", q.errorf("weight_block_size", "%v is not supported (only [128,128])", block)
	}
	scaleFmt, err := q.str("scale_fmt", "")
	if err != nil {
		return "", "", err
	}
	return QuantFP8Block, scaleFmt, nil
}

func shapeString(s []int64) string {
	out := "["
	for i, d := range s {
		if i > 0 {
			out += ","
		}
		out += fmt.Sprint(d)
	}
	return out + "]"
}

// CanonicalScaleShape is the [ceil(rows/128), ceil(cols/128)] shape that a
// weight_scale_inv of an FP8 [rows, cols] weight is read as, when the file
// stores it with its size-1 dimensions dropped or added. transformers 5
// writes a per-expert scale so: it quantises the fused [E, ...] expert
// tensors and, splitting them back into hub names on save, squeezes the
// expert's scale ([1,2] saved as [2] for a [128,256] weight). The bytes are
// the same row-major grid, so only the shape changes. ok is false when
// shape is already canonical or is not a squeezed form of it.
func CanonicalScaleShape(weight, shape []int64) (canon []int64, ok bool) {
	if len(weight) != 2 || weight[0] <= 0 || weight[1] <= 0 {
		return nil, false
	}
	r, c := weightfmt.Matrix{Format: fp8Format, Rows: weight[0], Cols: weight[1]}.ScaleShape()
	want := []int64{r, c}
	if slices.Equal(shape, want) {
		return nil, false
	}
	squeeze := func(s []int64) []int64 {
		var out []int64
		for _, d := range s {
			if d != 1 {
				out = append(out, d)
			}
		}
		return out
	}
	for _, d := range shape {
		if d < 0 {
			return nil, false
		}
	}
	if !slices.Equal(squeeze(shape), squeeze(want)) {
		return nil, false
	}
	return want, true
}
