package family

import (
	"fmt"
	"maps"
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
	var block []int64
	if q == QuantInt4Pack {
		block = []int64{1, p.GroupSize}
	}
	if q.nvfp4() {
		block = []int64{1, weightfmt.NVFP4Group}
	}
	return weightfmt.New(weightfmt.Spec{Quantization: string(q), DType: p.WeightDType, ScaleFmt: p.ScaleFmt, ScaleDType: p.ScaleDType, Block: block,
		Naming: p.Naming})
}

// nvfp4 reports whether q is NVFP4, ModelOpt's or compressed-tensors'.
func (q Quantization) nvfp4() bool { return q == QuantNVFP4 || q == QuantNVFP4CT }

// scaleDTypeRead reports whether the plan's format takes its scale dtype
// from the checkpoint's scale tensors (Plan.ScaleDType).
func (q Quantization) scaleDTypeRead() bool {
	return q == QuantFP8Channel || q == QuantFP8Tensor || q == QuantInt4Pack
}

// readQuant reads config.json's quantisation description, wherever it
// lives (quantConfig: quantization_config, text_config's, or
// compression_config). Supported: DeepSeek-style FP8
// (quant_method fp8, e4m3, weight_block_size [128,128], dynamic
// activations); FP8 per tensor (quant_method fp8 without
// weight_block_size, dynamic activations); and compressed-tensors
// float-quantized FP8 per channel or per tensor (readCTFP8). Other methods
// pack weights differently (int4 groups, zero points, static activation
// scales) and would be copied or stacked wrongly; refuseQuant has refused
// them before this runs.
func readQuant(c config) (Quantization, string, error) {
	q, method, ok, err := quantConfig(c)
	if err != nil || !ok {
		return QuantNone, "", err
	}
	if method == "" {
		return "", "", q.missing("quant_method")
	}
	if method == "mxfp4" {
		return QuantMXFP4, "", nil // checkMXFP4Groups reads the rest
	}
	if method == "compressed-tensors" && ctUses(q, "pack-quantized") {
		return QuantInt4Pack, "", nil // readCTInt4 reads the rest
	}
	if method == "compressed-tensors" && ctUses(q, "nvfp4-pack-quantized") {
		return QuantNVFP4CT, "", readCTFP4(q, ctNVFP4)
	}
	if method == "compressed-tensors" && ctUses(q, "mxfp4-pack-quantized") {
		return QuantMXFP4, "", readCTFP4(q, ctMXFP4) // Plan.Naming: plan reads it from the description
	}
	if method == "modelopt" {
		return readModelOptNVFP4(q)
	}
	if method == "compressed-tensors" {
		qu, err := readCTFP8(q)
		return qu, "", err
	}
	if method != "fp8" {
		return "", "", q.errorf("quant_method", "%q is not supported (only fp8 and compressed-tensors float-quantized fp8)", method)
	}
	if f, err := q.str("fmt", "e4m3"); err != nil {
		return "", "", err
	} else if f != "e4m3" {
		return "", "", q.errorf("fmt", "%q is not supported (only e4m3)", f)
	}
	if a, err := q.str("activation_scheme", "dynamic"); err != nil {
		return "", "", err
	} else if a != "dynamic" {
		return "", "", q.errorf("activation_scheme", "%q is not supported (only dynamic: static activation scales, input_scale, are not carried)", a)
	}
	if !q.has("weight_block_size") {
		// One weight_scale per weight, a scalar (vLLM's and transformers'
		// fp8 without blocks).
		return QuantFP8Tensor, "", nil
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

// readCTFP8 reads a compressed-tensors quantization_config whose every
// config group is float-quantized FP8 (num_bits 8, type float, symmetric)
// per channel or per tensor, with dynamic activations or none, all of one
// strategy (compressed-tensors' forward.py: w = q * weight_scale). The
// ignore list was resolved by DetectQuant (checkQuantGroups).
func readCTFP8(q config) (Quantization, error) {
	topFmt, err := q.str("format", "")
	if err != nil {
		return "", err
	}
	groups, ok, err := q.object("config_groups")
	if err != nil {
		return "", err
	}
	if !ok || len(groups.m) == 0 {
		return "", q.missing("config_groups")
	}
	var out Quantization
	for _, name := range slices.Sorted(maps.Keys(groups.m)) {
		g, _, err := groups.object(name)
		if err != nil {
			return "", err
		}
		f, err := g.str("format", topFmt)
		if err != nil {
			return "", err
		}
		if f != "float-quantized" {
			return "", g.errorf("format", "%q is not supported (only float-quantized FP8 per channel or per tensor)", f)
		}
		w, ok, err := g.object("weights")
		if err != nil {
			return "", err
		}
		if !ok {
			return "", g.missing("weights")
		}
		if t, err := w.str("type", "int"); err != nil {
			return "", err
		} else if t != "float" {
			return "", w.errorf("type", "%q is not supported (only float)", t)
		}
		if b, err := w.intIn("num_bits", 8, 1, 64); err != nil {
			return "", err
		} else if b != 8 {
			return "", w.errorf("num_bits", "%d is not supported (only 8: FP8 E4M3)", b)
		}
		if sym, err := w.boolean("symmetric", true); err != nil {
			return "", err
		} else if !sym {
			return "", w.errorf("symmetric", "false is not supported (a zero point, weight_zero_point, is not carried)")
		}
		if d, err := w.boolean("dynamic", false); err != nil {
			return "", err
		} else if d {
			return "", w.errorf("dynamic", "true is not supported (weights quantised at run time have no stored scales)")
		}
		strategy, err := w.str("strategy", "tensor")
		if err != nil {
			return "", err
		}
		var qu Quantization
		switch strategy {
		case "channel":
			qu = QuantFP8Channel
		case "tensor":
			qu = QuantFP8Tensor
		default:
			return "", w.errorf("strategy", "%q is not supported (only channel or tensor)", strategy)
		}
		if out != "" && qu != out {
			return "", groups.errorf(name, "weights strategy %q differs from another config group's: one expert format per checkpoint", strategy)
		}
		out = qu
		if a, ok, err := g.object("input_activations"); err != nil {
			return "", err
		} else if ok && len(a.m) > 0 {
			d, err := a.boolean("dynamic", false)
			if err != nil {
				return "", err
			}
			if !d {
				return "", a.errorf("dynamic", "false is not supported: static activation scales (input_scale) are not carried (only dynamic activations or none)")
			}
		}
	}
	return out, nil
}

// checkQuantGroups refuses an FP8 per-channel or per-tensor checkpoint
// whose ignore list leaves the routed experts unquantised, or quantises the
// shared expert of a family that has one otherwise than the routed ones:
// every routed expert is of one format. A shared expert the ignore list
// leaves unquantised is recorded as SharedQuantization none (convert copies
// it; fuse-shared fuses it only requantised). Attention and dense MLPs are
// copied as they are, whatever their format.
func checkQuantGroups(raw map[string]any, t Tensors, p *Plan) error {
	if p.Quantization == QuantInt4Pack {
		return checkInt4Groups(raw, t, p)
	}
	if p.Quantization.nvfp4() {
		return checkNVFP4Groups(raw, t, p)
	}
	if p.Quantization == QuantMXFP4 {
		return checkMXFP4Groups(raw, t, p)
	}
	if !p.Quantization.scaleDTypeRead() {
		return nil
	}
	return eachQuantDesc(raw, t, p.textLayers(), func(d QuantDesc) error {
		if err := routedUnquantised(d, "the ignore list", "one expert format"); err != nil {
			return err
		}
		if p.NumSharedExperts > 0 && d.Groups[GroupShared] == "" {
			p.SharedQuantization = QuantNone
			return nil
		}
		if p.NumSharedExperts > 0 && d.Groups[GroupShared] != d.Groups[GroupExperts] {
			return fmt.Errorf("%s: %s: %s: the shared expert is not stored like the routed experts (%s); moeprep carries one expert format per checkpoint",
				d.File, d.Key, d.Summary(), d.Groups[GroupExperts])
		}
		return nil
	})
}

// eachQuantDesc calls f on each quantisation description of the checkpoint
// (detectQuant's: config.json's quantization_config, hf_quant_config.json's,
// ignore lists resolved against t's modules under layers), stopping at the
// first error.
func eachQuantDesc(raw map[string]any, t Tensors, layers []string, f func(QuantDesc) error) error {
	descs, err := detectQuant(raw, hfQuantOf(t), quantModulesOf(t, layers))
	if err != nil {
		return err
	}
	for _, d := range descs {
		if err := f(d); err != nil {
			return err
		}
	}
	return nil
}

// routedUnquantised refuses a description whose exclusion list (by: "the
// ignore list", "the exclude list", "modules_to_not_convert") leaves the
// routed experts unquantised; carries says what moeprep carries per
// checkpoint. Nil when the routed experts are quantised.
func routedUnquantised(d QuantDesc, by, carries string) error {
	if d.Groups[GroupExperts] != "" {
		return nil
	}
	return fmt.Errorf("%s: %s: %s: the routed experts are left unquantised by %s while the format is %s; moeprep carries %s per checkpoint",
		d.File, d.Key, d.Summary(), by, d.Label, carries)
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

// CanonicalScaledShape is the shape that the weight_scale of an FP8
// [rows, cols] weight scaled per channel or per tensor is read as: [1,1]
// for a per-tensor scale stored as a scalar [] or [1] (quant_method fp8 and
// ModelOpt write a scalar, compressed-tensors strategy tensor [1]), and
// [rows,1] for a per-channel one stored as [rows]. The bytes are the same
// grid. ok is false when shape is already 2-D or is neither form.
func CanonicalScaledShape(weight, shape []int64) (canon []int64, ok bool) {
	if len(weight) != 2 || weight[0] <= 0 || weight[1] <= 0 {
		return nil, false
	}
	switch {
	case len(shape) == 0, len(shape) == 1 && shape[0] == 1:
		return []int64{1, 1}, true
	case len(shape) == 1 && shape[0] == weight[0]:
		return []int64{weight[0], 1}, true
	}
	return nil, false
}
