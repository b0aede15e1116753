package weightfmt

import (
	"fmt"
	"math"
	"slices"
	"strings"

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
	// For a Renamed format it follows the plain weight name where it can
	// ("x.weight" + "_scale" next to x.weight_packed); TensorsOf is right
	// for every format.
	Suffix string
	DType  safetensors.DType
	// Block is the [rows, cols] of weight elements one entry covers. 0
	// along an axis means the whole axis (a per-channel or per-tensor
	// scale): the grid is 1 long there, whatever the weight's size.
	Block [2]int64
}

// Name is the scale tensor of the weight tensor named weight, for a
// format that is not Renamed; TensorsOf names the tensors of every format.
func (s Scale) Name(weight string) string { return weight + s.Suffix }

// GlobalScale is a weight's second scale: one value for the whole weight
// (NVFP4's per-tensor scale), on top of the Scale grid. A stack of N
// weights has N of them, one per weight, in order.
type GlobalScale struct {
	// Suffix names it after the plain weight name: "x.weight" +
	// "_scale_2" (ModelOpt), + "_global_scale" (compressed-tensors).
	Suffix string
	DType  safetensors.DType
	// Divides: the weight is its grid's dequantisation divided by the
	// global scale (compressed-tensors' weight_global_scale), not
	// multiplied by it (ModelOpt's weight_scale_2).
	Divides bool
}

// GlobalScaled is what a Format with a GlobalScale also implements. Its
// plain Dequantise refuses to run (it cannot be right without the global
// scale): callers use DequantiseGlobal, or DequantiseWeight for any format.
type GlobalScaled interface {
	Format
	GlobalScale() GlobalScale
	// DequantiseGlobal is Dequantise with global, the raw bytes of the
	// weight's one global scale entry.
	DequantiseGlobal(raw []byte, rows, cols int, scale, global []byte, dst []float32) error
}

// GlobalOf is f's global scale; ok is false when it has none.
func GlobalOf(f Format) (g GlobalScale, ok bool) {
	if gs, is := f.(GlobalScaled); is {
		return gs.GlobalScale(), true
	}
	return GlobalScale{}, false
}

// DequantiseWeight dequantises a weight of any format: Dequantise, or
// DequantiseGlobal for a GlobalScaled format. global must be nil for a
// format without a global scale.
func DequantiseWeight(f Format, raw []byte, rows, cols int, scale, global []byte, dst []float32) error {
	if gs, ok := f.(GlobalScaled); ok {
		return gs.DequantiseGlobal(raw, rows, cols, scale, global, dst)
	}
	if global != nil {
		return fmt.Errorf("%s weights have no global scale, got %d bytes of one", f, len(global))
	}
	return f.Dequantise(raw, rows, cols, scale, dst)
}

// Tensors are the names of the stored tensors of one weight.
type Tensors struct {
	Weight string
	Scale  string // "" when the format has no scale
	Global string // the GlobalScale tensor; "" when none
	// Shape is compressed-tensors' weight_shape, an I64 [2] tensor holding
	// the unpacked [rows, cols]; "" when the format has none.
	Shape string
	// Input is the static activation scale a W4A4 export may store beside
	// the weight (NVFP4: ModelOpt's x.input_scale, compressed-tensors'
	// x.input_global_scale; a stack's "gate_up_proj" + "_input_scale"),
	// carried and never read; "" when the format has none. Whether a
	// checkpoint has it is the checkpoint's to say.
	Input string
}

// inputName names the activation scale leaf ("input_scale") of the weight
// a plain checkpoint names weight: x.weight's is x.<leaf>, a stack's
// ("...gate_up_proj") is the stack's name + "_" + leaf.
func inputName(weight, leaf string) string {
	if base, ok := strings.CutSuffix(weight, ".weight"); ok {
		return base + "." + leaf
	}
	return weight + "_" + leaf
}

// Renamed is what a Format also implements when its tensors are not named
// as a plain checkpoint names the weight (and Scale.Name, GlobalScale's
// Suffix after that): compressed-tensors packs x.weight into
// x.weight_packed, gpt-oss stores gate_up_proj as gate_up_proj_blocks,
// DeepSeek-V4 names x.weight's scale x.scale.
type Renamed interface {
	// TensorsOf names the tensors holding the weight that a plain
	// checkpoint names weight ("x.weight", or a stack's "x.gate_up_proj").
	TensorsOf(weight string) Tensors
}

// TensorsOf names the tensors of the weight that a plain checkpoint names
// weight, stored in format f: weight itself and its Scale and GlobalScale
// suffixes, unless f is Renamed.
func TensorsOf(f Format, weight string) Tensors {
	if r, ok := f.(Renamed); ok {
		return r.TensorsOf(weight)
	}
	t := Tensors{Weight: weight}
	if s, ok := f.Scale(); ok {
		t.Scale = s.Name(weight)
	}
	if g, ok := GlobalOf(f); ok {
		t.Global = weight + g.Suffix
	}
	return t
}

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
	// ScaleDType is the scale tensors' dtype where a format's checkpoints
	// differ in it (compressed-tensors stores scales in the model's dtype,
	// ModelOpt in F32); "" gives the format's own. Plain and FP8 block
	// weights ignore it.
	ScaleDType safetensors.DType
	// Naming is whose tensor names the weights carry where a format's
	// producers differ (Naming* constants); "" gives the format's own.
	// Plain and FP8 block weights ignore it.
	Naming string
	// ZeroPoint: the weights have a zero point (compressed-tensors
	// symmetric: false, weight_zero_point). The formats that read Spec's
	// newer fields refuse it.
	ZeroPoint bool
	// GroupIndex: the columns are assigned to scale groups by
	// compressed-tensors' weight_g_idx (actorder "group") rather than in
	// order. The formats that read Spec's newer fields refuse it.
	GroupIndex bool
}

// Naming values: whose tensor names a quantised checkpoint uses.
const (
	// NamingCompressedTensors: x.weight_packed (packed formats), x.weight
	// (FP8), x.weight_scale, x.weight_global_scale, x.weight_shape.
	NamingCompressedTensors = "compressed-tensors"
	// NamingModelOpt: x.weight, x.weight_scale, x.weight_scale_2.
	NamingModelOpt = "modelopt"
	// NamingGptOss: stacked gate_up_proj_blocks and gate_up_proj_scales.
	NamingGptOss = "gpt-oss"
	// NamingDeepSeek: DeepSeek-V4's x.weight and x.scale.
	NamingDeepSeek = "deepseek"
)

// Named is what a Format also implements when its producers name its
// tensors differently (Spec.Naming): Naming says whose names it uses.
type Named interface {
	Naming() string
}

// ContractSpec is what a record of f (a moeprep contract) must say beyond
// its quantization, weight dtype and block for New to build f again: its
// scale dtype and naming where they are not those New gives the
// quantization by default ("" where they are).
func ContractSpec(f Format) (scaleDType safetensors.DType, naming string) {
	def, err := New(Spec{Quantization: f.Quantization(), DType: f.DType()})
	if err != nil {
		return "", ""
	}
	if s, ok := f.Scale(); ok {
		if ds, _ := def.Scale(); ds.DType != s.DType {
			scaleDType = s.DType
		}
	}
	if n, ok := f.(Named); ok {
		if dn, _ := def.(Named); dn == nil || dn.Naming() != n.Naming() {
			naming = n.Naming()
		}
	}
	return scaleDType, naming
}

// formats maps a quantization name to what builds its Format; each
// format's file adds itself, so that a new format is one file.
var formats = map[string]func(Spec) (Format, error){}

// byConfigOnly holds the quantizations that only a config names: Scaled
// leaves them out (registerByConfig).
var byConfigOnly = map[string]bool{}

func register(quantization string, build func(Spec) (Format, error)) {
	if _, dup := formats[quantization]; dup {
		panic("weightfmt: quantization " + quantization + " registered twice")
	}
	formats[quantization] = build
}

// registerByConfig registers a format that its weights' dtype does not
// identify (U8 is MXFP4 or NVFP4, I32 any packed integer, F8_E4M3 with a
// weight_scale FP8 per channel or per tensor): New builds it for a config
// or contract that names it, AllScaled lists it, Scaled and ScaledDType,
// which name one format per dtype of a checkpoint whose config names none,
// do not.
func registerByConfig(quantization string, build func(Spec) (Format, error)) {
	register(quantization, build)
	byConfigOnly[quantization] = true
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
// quantization whose weights carry a scale tensor and whose weight dtype
// identifies it (not registerByConfig), in the order of their names: what
// a checker asks to recognise weights or scale tensors of a quantised
// format in a checkpoint whose config names none.
func Scaled() []Format { return scaled(false) }

// AllScaled is Scaled with the formats that only a config names: every
// quantised format New knows, with its own defaults.
func AllScaled() []Format { return scaled(true) }

func scaled(all bool) []Format {
	var out []Format
	for _, q := range Quantizations() {
		if byConfigOnly[q] && !all {
			continue
		}
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

// product is the product of non-negative sizes, or -1 when one is
// negative or the product overflows int64: compared with a length, a
// hostile size then never matches.
func product(xs ...int64) int64 {
	p := int64(1)
	for _, x := range xs {
		if x < 0 || x != 0 && p > math.MaxInt64/x {
			return -1
		}
		p *= x
	}
	return p
}

// checkSizes checks what a Dequantise is handed for a rows x cols weight
// of m's format: non-negative sizes, rows*cols outputs, the weight's bytes
// and its scale grid's bytes (Matrix's, which the formats' arithmetic
// relies on). It never panics, whatever the sizes.
func checkSizes(m Matrix, raw, scale []byte, ndst int) error {
	rows, cols := m.Rows, m.Cols
	if n := product(rows, cols); rows < 0 || cols < 0 || n != int64(ndst) {
		return fmt.Errorf("%s dequant: %d outputs for a %dx%d weight", m.Format, ndst, rows, cols)
	}
	e, b := m.Format.Packing()
	if want := product(rows, ceilDiv(cols, e), b); want != int64(len(raw)) {
		return fmt.Errorf("%s dequant: %d weight bytes for a %dx%d weight, want %d", m.Format, len(raw), rows, cols, want)
	}
	s, ok := m.Format.Scale()
	if !ok {
		return nil
	}
	gr, gc := m.ScaleShape()
	if want := product(gr, gc, int64(s.DType.Size())); want != int64(len(scale)) {
		return fmt.Errorf("%s dequant: %d scale bytes for a %dx%d weight, want %dx%d %s", m.Format, len(scale), rows, cols, gr, gc, s.DType)
	}
	return nil
}

// wholeGroups refuses a row that does not split into whole scale groups
// of g columns, which the packed formats' producers never write and their
// dequantisers refuse (compressed-tensors' _process_group raises for it).
func wholeGroups(f Format, cols int, g int64) error {
	if g > 0 && int64(cols)%g != 0 {
		return fmt.Errorf("%s dequant: %d columns is not a whole number of %d-column scale groups", f, cols, g)
	}
	return nil
}

// specCheck is what a newer format accepts of a Spec: the weight dtypes
// (the first is the default), the scale dtypes likewise, the namings
// likewise (Spec's "" is the first); no zero point, no weight_g_idx.
type specCheck struct {
	name           string // the format in messages
	dtypes, scales []safetensors.DType
	namings        []string
	// block, where set, is the one weight_block_size the format takes (a
	// Spec without one is taken as it); nil: the format reads it itself.
	block *[2]int64
}

// read checks s (its block first, where c fixes one) and returns its
// weight dtype, scale dtype and naming with the defaults filled in.
func (c specCheck) read(s Spec) (d, sd safetensors.DType, naming string, err error) {
	if c.block != nil {
		if err := blockIs(c.name, s.Block, *c.block); err != nil {
			return "", "", "", err
		}
	}
	pick := func(what string, got safetensors.DType, allowed []safetensors.DType) (safetensors.DType, error) {
		if got == "" {
			return allowed[0], nil
		}
		if !slices.Contains(allowed, got) {
			return "", fmt.Errorf("%s %s %s: want one of %v", c.name, what, got, allowed)
		}
		return got, nil
	}
	switch {
	case s.ZeroPoint:
		return "", "", "", fmt.Errorf("%s with a zero point (asymmetric, weight_zero_point) is not supported: moeprep reads symmetric weights only", c.name)
	case s.GroupIndex:
		return "", "", "", fmt.Errorf("%s with weight_g_idx (actorder \"group\") is not supported: its columns are not in scale-group order", c.name)
	}
	if d, err = pick("weight dtype", s.DType, c.dtypes); err != nil {
		return "", "", "", err
	}
	if sd, err = pick("scale dtype", s.ScaleDType, c.scales); err != nil {
		return "", "", "", err
	}
	naming = s.Naming
	if naming == "" {
		naming = c.namings[0]
	} else if !slices.Contains(c.namings, naming) {
		return "", "", "", fmt.Errorf("%s weights named as %q: want one of %q", c.name, naming, c.namings)
	}
	return d, sd, naming, nil
}

// blockIs refuses a Spec.Block other than nil and want.
func blockIs(name string, b []int64, want [2]int64) error {
	if b != nil && !slices.Equal(b, want[:]) {
		return fmt.Errorf("%s weight_block_size %v: want %v", name, b, want)
	}
	return nil
}
