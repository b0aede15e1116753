package quantweights

import (
	"strings"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// Mixed-format checkpoints store their quantised weights in two formats:
// DeepSeek-V4's FP4 experts beside FP8 128x128 blocks everywhere else
// (attention, the shared expert; transformers' F32 weight_scale_inv, or
// the official layout's x.scale E8M0), ModelOpt MIXED_PRECISION's NVFP4
// experts beside FP8 per-tensor attention and dense MLPs (F32
// weight_scale and input_scale) or MXFP8 ones (U8 E8M0 weight_scale per
// 32). convert --dtype dequantises each weight
// by its own format, and the byte proof predicts each by it.

// secondFormats lists, by the experts' format (its quantization and
// naming), the formats the checkpoint's other weights may be stored in,
// each as a spec; the first one a tensor of the checkpoint is stored in
// is the one (OtherFormat). Data, not branches: a new mixed release is a
// row.
var secondFormats = []struct {
	quant, naming string
	other         []weightfmt.Spec
}{
	{weightfmt.QuantMXFP4, weightfmt.NamingDeepSeek, []weightfmt.Spec{
		{Quantization: weightfmt.QuantFP8Block, ScaleFmt: "ue8m0", Naming: weightfmt.NamingDeepSeek, ScaleDType: safetensors.F8E8M0},
		{Quantization: weightfmt.QuantFP8Block, ScaleFmt: "ue8m0", Naming: weightfmt.NamingDeepSeek, ScaleDType: safetensors.U8},
		{Quantization: weightfmt.QuantFP8Block, ScaleFmt: "ue8m0"},
	}},
	{weightfmt.QuantNVFP4ModelOpt, "", []weightfmt.Spec{
		{Quantization: weightfmt.QuantFP8Tensor, ScaleDType: safetensors.F32, Naming: weightfmt.NamingModelOpt},
		{Quantization: weightfmt.QuantFP8Channel, ScaleDType: safetensors.F32, Naming: weightfmt.NamingModelOpt},
		// ModelOpt's mixed NVFP4-routed / MXFP8-dense exports.
		{Quantization: weightfmt.QuantMXFP8, Naming: weightfmt.NamingModelOpt},
	}},
}

// OtherFormat is the second format of a mixed-format checkpoint whose
// experts are stored as f: the first of f's candidates (secondFormats)
// that some weight of t is stored in (a tensor of its weight dtype named
// as it names weights, with its scale tensor beside it, of its scale
// dtype). ok is false for a checkpoint of one format. fp8Block is the
// edge of the FP8 candidates' square blocks as the checkpoint's
// quantization_config gives it (family.Plan.FP8Block: DeepSeek-V4.1's 32);
// 0 for DeepSeek's 128.
func OtherFormat(t family.Tensors, f weightfmt.Format, fp8Block int64) (other weightfmt.Format, ok bool) {
	naming := ""
	if n, is := f.(weightfmt.Named); is {
		naming = n.Naming()
	}
	for _, row := range secondFormats {
		if row.quant != f.Quantization() || row.naming != naming {
			continue
		}
		for _, s := range row.other {
			if s.Quantization == weightfmt.QuantFP8Block && fp8Block > 0 {
				s.Block = []int64{fp8Block, fp8Block}
			}
			c, err := weightfmt.New(s)
			if err != nil {
				continue
			}
			if storesAny(t, c) {
				return c, true
			}
		}
	}
	return nil, false
}

// storesAny reports whether some weight of t is stored in format f, its
// scale of f's dtype and shape rank beside it.
func storesAny(t family.Tensors, f weightfmt.Format) bool {
	sc, _ := f.Scale()
	wsuffix := strings.TrimPrefix(weightfmt.TensorsOf(f, "w").Weight, "w")
	for _, n := range t.Names() {
		meta, ok := t.Lookup(n)
		if !ok || meta.DType != f.DType() || len(meta.Shape) != 2 {
			continue
		}
		plain, named := strings.CutSuffix(n, wsuffix)
		if !named {
			continue
		}
		ts := weightfmt.TensorsOf(f, plain)
		if sm, ok := t.Lookup(ts.Scale); ok && ts.Weight == n && sm.DType == sc.DType && (sc.Block != [2]int64{0, 0} || oneElement(sm.Shape)) {
			return true
		}
	}
	return false
}

// FindMixed is Find of f, then, for a mixed-format
// checkpoint, of its OtherFormat over what f's weights leave: every
// quantised weight outside skip, each with the format it is stored in
// (Weight.Format). fp8Block is OtherFormat's.
func FindMixed(t family.Tensors, f weightfmt.Format, fp8Block int64, skip func(string) bool) ([]Weight, error) {
	other, mixed := OtherFormat(t, f, fp8Block)
	if !mixed {
		return Find(t, f, skip)
	}
	// f's weights first (the experts' FP4, whose scale tensors may be of an
	// FP8 dtype, NVFP4's E4M3), then the second format's among the rest.
	first, err := Find(t, f, skip)
	if err != nil {
		return nil, err
	}
	taken := map[string]bool{}
	for _, q := range first {
		for _, n := range q.Dropped() {
			taken[n] = true
		}
	}
	second, err := Find(t, other, func(n string) bool { return taken[n] || skip(n) })
	if err != nil {
		return nil, err
	}
	return append(first, second...), nil
}
