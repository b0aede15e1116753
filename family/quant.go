package family

import (
	"fmt"
	"slices"

	"github.com/moeprep/moeprep/quantdesc"
	"github.com/moeprep/moeprep/weightfmt"
)

// This file plans by the checkpoint's quantisation descriptions
// (quantdesc): which format the plan's experts are stored in, and which
// combinations of formats over the tensor groups a plan carries.

// HFQuantConfigs is what a Tensors may also implement to hand family the
// decoded hf_quant_config.json of the checkpoint directory (nil when it has
// none); checkpoint.Checkpoint does.
type HFQuantConfigs interface {
	HFQuantConfig() map[string]any
}

func hfQuantOf(t Tensors) map[string]any {
	if h, ok := t.(HFQuantConfigs); ok {
		return h.HFQuantConfig()
	}
	return nil
}

// DetectQuantOf is quantdesc.Detect with the ignore lists resolved against
// t's modules (nil: representative names) in the text layers of raw's
// model type (a multimodal wrapper's), as planning resolves them.
func DetectQuantOf(raw map[string]any, hf map[string]any, t Tensors) ([]quantdesc.Desc, error) {
	var layers []string
	if mt, _ := raw["model_type"].(string); wrapperOf(mt) != nil {
		layers = wrapperOf(mt).layers
	}
	return quantdesc.Detect(raw, hf, quantModulesOf(t, layers))
}

// detectQuant is quantdesc.Detect of the checkpoint's descriptions
// (config.json's, and t's hf_quant_config.json), the ignore lists resolved
// against t's modules under layers.
func detectQuant(raw map[string]any, t Tensors, layers []string) ([]quantdesc.Desc, error) {
	return quantdesc.Detect(raw, hfQuantOf(t), quantModulesOf(t, layers))
}

// quantModulesOf is t's modules (t may be nil: then only representative
// names are known) under the text layer prefixes layers.
func quantModulesOf(t Tensors, layers []string) *quantdesc.Modules {
	if t == nil {
		return quantdesc.Representative(layers)
	}
	build := func() *quantdesc.Modules {
		return quantdesc.ModulesOf(t.Names(), func(name string) bool {
			meta, ok := t.Lookup(name)
			return ok && len(meta.Shape) >= 2
		}, layers)
	}
	if m, ok := t.(ModulesMemo); ok {
		return m.QuantModules(layers, build)
	}
	return build()
}

// refuseQuant refuses the first description moeprep cannot carry, its
// ignore lists resolved under layers.
func refuseQuant(raw map[string]any, t Tensors, layers []string) error {
	return eachQuantDesc(raw, t, layers, func(d quantdesc.Desc) error {
		if !d.Supported() {
			return d.Refusal()
		}
		return nil
	})
}

// readQuant is quantdesc.Read: how config.json says the experts are
// stored, and FP8 blocks' scale_fmt.
func readQuant(c config) (Quantization, string, error) {
	q, scaleFmt, err := quantdesc.Read(c.j())
	return Quantization(q), scaleFmt, err
}

// readHF is quantdesc.ReadHF of t's hf_quant_config.json: QuantNVFP4 or
// QuantNone.
func readHF(t Tensors) (Quantization, error) {
	q, err := quantdesc.ReadHF(hfQuantOf(t))
	return Quantization(q), err
}

// readQuantDetails reads what a plan's format needs beyond its
// quantization and scale_fmt (readQuant): MXFP4's naming
// (readMXFP4Naming); MXFP8's, quant_method mxfp8 (MiniMax-M3) naming its
// scales x.weight_scale_inv where ModelOpt's keep the format's own
// x.weight_scale; and FP8's square block where it is not 128
// (weight_block_size [32, 32]: Plan.FP8Block).
func readQuantDetails(c config, p *Plan) {
	readMXFP4Naming(c, p)
	q, m, ok, _ := quantdesc.Config(c.j())
	if p.Quantization == QuantMXFP8 && m == "mxfp8" {
		p.Naming = weightfmt.NamingMiniMax
	}
	if ok && p.Quantization == QuantFP8Block && q.Has("weight_block_size") {
		if b, err := q.Ints("weight_block_size"); err == nil && len(b) == 2 && b[0] == b[1] && b[0] != weightfmt.FP8DefaultBlock {
			p.FP8Block = int64(b[0]) // quantdesc.Read checked it
		}
	}
}

// fp8Format is DeepSeek's official FP8 layout, 128x128 blocks (Qwen3's
// FP8 releases copy it; readQuant also takes other square blocks,
// Plan.FP8Block). scale_fmt does not change
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
	if q == QuantFP8Block && p.FP8Block > 0 {
		block = []int64{p.FP8Block, p.FP8Block}
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

// checkQuantGroups refuses an FP8 per-channel or per-tensor (or MXFP8) checkpoint
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
	if !p.Quantization.scaleDTypeRead() && p.Quantization != QuantMXFP8 {
		return nil
	}
	return eachQuantDesc(raw, t, p.textLayers(), func(d quantdesc.Desc) error {
		if err := routedUnquantised(d, "the ignore list", "one expert format"); err != nil {
			return err
		}
		if p.NumSharedExperts > 0 && d.Groups[quantdesc.GroupShared] == "" {
			p.SharedQuantization = QuantNone
			return nil
		}
		if p.NumSharedExperts > 0 && d.Groups[quantdesc.GroupShared] != d.Groups[quantdesc.GroupExperts] {
			return fmt.Errorf("%s: %s: %s: the shared expert is not stored like the routed experts (%s); moeprep carries one expert format per checkpoint",
				d.File, d.Key, d.Summary(), d.Groups[quantdesc.GroupExperts])
		}
		return nil
	})
}

// eachQuantDesc calls f on each quantisation description of the checkpoint
// (detectQuant's: config.json's quantization_config, hf_quant_config.json's,
// ignore lists resolved against t's modules under layers), stopping at the
// first error.
func eachQuantDesc(raw map[string]any, t Tensors, layers []string, f func(quantdesc.Desc) error) error {
	descs, err := detectQuant(raw, t, layers)
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
func routedUnquantised(d quantdesc.Desc, by, carries string) error {
	if d.Groups[quantdesc.GroupExperts] != "" {
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
