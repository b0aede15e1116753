package weightfmt

import (
	"fmt"
	"slices"

	"github.com/moeprep/moeprep/safetensors"
)

// Format says how one expert weight, a [rows, cols] (out, in) matrix, is
// stored. The slicing questions (Matrix) are answered from Packing and
// Scale alone, so a format states only these facts and its arithmetic.
type Format interface {
	// Quantization is the format's name in the moeprep contract and in
	// family.Plan ("none" for plain weights).
	Quantization() string
	// DType is the element dtype of the weight tensor.
	DType() safetensors.DType
	// Packing: elems consecutive elements of a row are stored in bytes
	// bytes (1 and the dtype's size when every element is one value).
	Packing() (elems, bytes int64)
	// Scale is the weight's scale tensor; ok is false when it has none.
	Scale() (s Scale, ok bool)
	// Dequantise decodes a [rows, cols] weight, or a piece of one that
	// starts on a scale block, to float32: raw is its bytes, scale the raw
	// bytes of exactly its scale grid (Matrix.ScaleShape of the piece), nil
	// when the format has no scale. len(dst) is rows*cols.
	Dequantise(raw []byte, rows, cols int, scale []byte, dst []float32) error
	// Fold says how a constant factor multiplying the weight (rsf) can be
	// folded into the stored tensors.
	Fold() FoldRule
	// String names the format in messages ("BF16", "FP8").
	String() string
}

// Scale is a weight's scale tensor: a grid with one entry per block of
// weight elements.
type Scale struct {
	// Suffix names the scale after its weight: the weight's tensor name
	// plus Suffix ("x.weight" + "_scale_inv", "gate_up_proj" + "_scale_inv").
	Suffix string
	DType  safetensors.DType
	// Block is the [rows, cols] of weight elements one entry covers. 0
	// along an axis means the whole axis (a per-channel or per-tensor
	// scale): the grid is 1 long there, whatever the weight's size.
	Block [2]int64
}

// Name is the scale tensor of the weight tensor named weight.
func (s Scale) Name(weight string) string { return weight + s.Suffix }

// FoldTarget is which stored values a folded factor multiplies.
type FoldTarget int

const (
	// FoldNowhere: the format cannot take the factor (FoldRule.Refusal says why).
	FoldNowhere FoldTarget = iota
	// FoldWeights: every weight element, rounded once to the weight's dtype.
	FoldWeights
	// FoldScales: every scale entry, rounded once to the scale's dtype; the
	// weight's bytes stay as they are.
	FoldScales
)

// FoldRule is how a format folds a constant factor into its tensors.
type FoldRule struct {
	Into FoldTarget
	// DType is the dtype of the values multiplied: FoldInPlace and
	// FoldValue in it give the folded bytes.
	DType safetensors.DType
	// ByDefault: the fold rounds no coarser than float32, so a fold that
	// is asked for only where it is (nearly) exact takes it.
	ByDefault bool
	// refusal, for FoldNowhere: why, with %s where the factor's name goes.
	refusal string
}

// Refusal says why the factor called factor cannot be folded ("" when it
// can).
func (r FoldRule) Refusal(factor string) string {
	switch {
	case r.Into != FoldNowhere:
		return ""
	case r.refusal == "":
		return fmt.Sprintf("the weights cannot absorb %s", factor)
	}
	return fmt.Sprintf(r.refusal, factor)
}

// Spec is what a checkpoint's config (through family.Plan) or a moeprep
// contract says about its expert weights.
type Spec struct {
	// Quantization is the contract's quantization: "none" (or "") for
	// plain weights, "fp8_block_128x128", ...
	Quantization string
	DType        safetensors.DType // the weight tensors' dtype
	// Block is weight_block_size, [rows, cols]; nil gives the format's own.
	Block []int64
	// ScaleFmt is quantization_config.scale_fmt ("ue8m0"); "" when unset or
	// unknown (a contract does not record it).
	ScaleFmt string
}

// formats maps a quantization name to what builds its Format; each
// format's file adds itself, so that a new format is one file.
var formats = map[string]func(Spec) (Format, error){}

func register(quantization string, build func(Spec) (Format, error)) {
	if _, dup := formats[quantization]; dup {
		panic("weightfmt: quantization " + quantization + " registered twice")
	}
	formats[quantization] = build
}

// New is the Format a spec describes.
func New(s Spec) (Format, error) {
	q := s.Quantization
	if q == "" {
		q = QuantNone
	}
	build, ok := formats[q]
	if !ok {
		return nil, fmt.Errorf("quantization %q is not supported (known: %v)", s.Quantization, Quantizations())
	}
	return build(s)
}

// Quantizations lists the names New knows, sorted.
func Quantizations() []string {
	out := make([]string, 0, len(formats))
	for q := range formats {
		out = append(out, q)
	}
	slices.Sort(out)
	return out
}

// Scaled is the Format, with its own defaults, of every registered
// quantization whose weights carry a scale tensor, in the order of their
// names: what a checker asks to recognise weights or scale tensors of a
// quantised format in a checkpoint whose config names none.
func Scaled() []Format {
	var out []Format
	for _, q := range Quantizations() {
		f, err := formats[q](Spec{Quantization: q})
		if err != nil {
			continue
		}
		if _, ok := f.Scale(); ok {
			out = append(out, f)
		}
	}
	return out
}

// ScaledDType is the registered scaled format whose weights are stored as
// dtype d (values that mean nothing without their scales); ok is false
// when none is.
func ScaledDType(d safetensors.DType) (f Format, ok bool) {
	for _, f := range Scaled() {
		if f.DType() == d {
			return f, true
		}
	}
	return nil, false
}
