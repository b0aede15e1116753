package family

import (
	"fmt"
	"slices"
)

// fp8Block is the only block size moeprep's FP8 handling knows: DeepSeek's
// official format (and Qwen3's FP8 releases, which copy it).
const fp8Block = 128

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
	if !slices.Equal(block, []int{fp8Block, fp8Block}) {
		return "", "", q.errorf("weight_block_size", "%v is not supported (only [128,128])", block)
	}
	scaleFmt, err := q.str("scale_fmt", "")
	if err != nil {
		return "", "", err
	}
	return QuantFP8Block, scaleFmt, nil
}

// scaleShape is the weight_scale_inv shape of an FP8 [rows, cols] weight.
func scaleShape(rows, cols int64) []int64 {
	return []int64{(rows + fp8Block - 1) / fp8Block, (cols + fp8Block - 1) / fp8Block}
}

// scaleName is the block-scale tensor that belongs to a weight.
func scaleName(weight string) string {
	const suffix = ".weight"
	if len(weight) > len(suffix) && weight[len(weight)-len(suffix):] == suffix {
		return weight[:len(weight)-len(suffix)] + ".weight_scale_inv"
	}
	return weight + "_scale_inv"
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
