package weightfmt

import (
	"fmt"
	"strings"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
)

// QuantMXFP4 is the quantization of MXFP4 weights: gpt-oss, compressed-
// tensors' mxfp4-pack-quantized and DeepSeek-V4's FP4 experts.
const QuantMXFP4 = "mxfp4"

// MXFP4Group is the number of elements one E8M0 scale covers (OCP MX).
const MXFP4Group = 32

// mxfp4 is OCP MX FP4: E2M1 elements, two to a byte with the EVEN element
// in the LOW nibble, and one E8M0 scale per 32 elements of a row;
// w = e2m1(nibble) * 2^(e - 127). The producers agree on the arithmetic
// and differ in names and dtypes:
//
//   - gpt-oss (transformers integrations/mxfp4.py, convert_moe_packed_tensors:
//     idx_lo = blk & 0x0F goes to the even columns, idx_hi = blk >> 4 to
//     the odd ones, then torch.ldexp(lut value, scale - 127)): experts stacked
//     on disk as gate_up_proj_blocks U8 [E, rows, cols/32, 16] and
//     gate_up_proj_scales U8 [E, rows, cols/32], rows being the output
//     features (the dequantised [E, rows, cols] is transposed only
//     afterwards). Per expert, the blocks are the bytes of a [rows, cols/2]
//     U8 matrix and the scales a [rows, cols/32] grid: this format.
//   - compressed-tensors mxfp4-pack-quantized (compressors/mxfp4/base.py,
//     subclassing nvfp4's pack_fp4_to_uint8: indices[:, 0] | indices[:, 1]
//     << 4; mx_utils.py decompress_mx_scale: 2^(scale - 127)):
//     weight_packed U8 [rows, cols/2] and weight_scale U8 [rows, cols/32].
//   - DeepSeek-V4 (inference/convert.py: weight int8 viewed as uint8,
//     low = x & 0x0F stacked before high = x >> 4; scale float8_e8m0fnu
//     [rows, cols/32]): x.weight I8 and x.scale F8_E8M0.
//
// Rows must be whole groups (gpt-oss's [.., cols/32, 16] layout has no
// room for a partial one, compressed-tensors' _process_group raises,
// DeepSeek's convert asserts it). E8M0 0xFF is NaN (OCP MX; numfmt): the
// producers never write it, and torch.ldexp would instead give +-Inf.
type mxfp4 struct {
	naming string
	weight safetensors.DType // U8, or I8 (DeepSeek-V4)
	scale  safetensors.DType // U8 or F8_E8M0: the same bytes
}

// MXFP4 is the MXFP4 format with weights of dtype weight (U8 or I8),
// scales of dtype scale (U8 or F8_E8M0) and the tensor names of naming
// (NamingGptOss, NamingCompressedTensors or NamingDeepSeek).
func MXFP4(naming string, weight, scale safetensors.DType) Format {
	return mxfp4{naming: naming, weight: weight, scale: scale}
}

// mxfp4Table is every E8M0 scale byte times every E2M1 code, exact in
// float32 (2^-128 is a float32 subnormal; 2^128 and past are +-Inf):
// dequantising is one load per element.
var mxfp4Table [256][16]float32

func init() {
	for e := range 256 {
		for n := range 16 {
			mxfp4Table[e][n] = numfmt.E2M1ToF32(byte(n)) * numfmt.E8M0ToF32(byte(e))
		}
	}
	c := specCheck{name: "MXFP4",
		dtypes:  []safetensors.DType{safetensors.U8, safetensors.I8},
		scales:  []safetensors.DType{safetensors.U8, safetensors.F8E8M0},
		namings: []string{NamingGptOss, NamingCompressedTensors, NamingDeepSeek},
		block:   &[2]int64{1, MXFP4Group}}
	registerByConfig(QuantMXFP4, func(s Spec) (Format, error) {
		d, sd, naming, err := c.read(s)
		if err != nil {
			return nil, err
		}
		return MXFP4(naming, d, sd), nil
	})
}

func (f mxfp4) Quantization() string     { return QuantMXFP4 }
func (f mxfp4) DType() safetensors.DType { return f.weight }

// Packing: two E2M1 elements to a byte.
func (f mxfp4) Packing() (elems, bytes int64) { return 2, 1 }
func (f mxfp4) String() string                { return "MXFP4" }

// Scale is the E8M0 grid; its Suffix names it after a plain weight name
// for gpt-oss ("gate_up_proj" + "_scales") and compressed-tensors
// ("x.weight" + "_scale"); DeepSeek-V4's x.scale is no suffix of x.weight
// (".scale" here): name its tensors with TensorsOf.
func (f mxfp4) Scale() (Scale, bool) {
	suffix := "_scales"
	switch f.naming {
	case NamingCompressedTensors:
		suffix = "_scale"
	case NamingDeepSeek:
		suffix = ".scale"
	}
	return Scale{Suffix: suffix, DType: f.scale, Block: [2]int64{1, MXFP4Group}}, true
}

// TensorsOf names the weight's tensors as its producer does.
func (f mxfp4) TensorsOf(weight string) Tensors {
	switch f.naming {
	case NamingCompressedTensors:
		return Tensors{Weight: weight + "_packed", Scale: weight + "_scale"}
	case NamingDeepSeek:
		// x.weight's scale is x.scale; a stack's ("gate_up_proj", no
		// .weight to replace) is named after it, "gate_up_proj_scale".
		if base, ok := strings.CutSuffix(weight, ".weight"); ok {
			return Tensors{Weight: weight, Scale: base + ".scale"}
		}
		return Tensors{Weight: weight, Scale: weight + "_scale"}
	}
	return Tensors{Weight: weight + "_blocks", Scale: weight + "_scales"}
}

// Naming is whose tensor names the weights carry (Named).
func (f mxfp4) Naming() string { return f.naming }

// Fold: E8M0 scales are powers of two; a factor such as 2.5 would leave
// that grid (only a power of two could fold, and none is asked for).
func (f mxfp4) Fold() FoldRule {
	return FoldRule{refusal: "the MXFP4 scales are E8M0 (powers of two) and cannot absorb %s exactly"}
}

// Dequantise is e2m1(nibble) * 2^(e-127) for each element, exact.
func (f mxfp4) Dequantise(raw []byte, rows, cols int, scale []byte, dst []float32) error {
	m := Matrix{Format: f, Rows: int64(rows), Cols: int64(cols)}
	if err := checkSizes(m, raw, scale, len(dst)); err != nil {
		return err
	}
	if err := wholeGroups(f, cols, MXFP4Group); err != nil {
		return err
	}
	return decodeFP4(raw, rows, cols, MXFP4Group, scale, &mxfp4Table, dst)
}

// exactValues is e2m1(nibble) * 2^(e-127) in float64, where E8M0 254
// (2^127) times 6 is 1.02e39, a value the OCP MX spec defines, not
// float32's infinity; finite unless the scale is E8M0's NaN
// (exactDequantiser).
func (f mxfp4) exactValues(raw []byte, rows, cols int, scale, _ []byte) (func(int) (float64, bool), error) {
	m := Matrix{Format: f, Rows: int64(rows), Cols: int64(cols)}
	if err := checkSizes(m, raw, scale, rows*cols); err != nil {
		return nil, err
	}
	if err := wholeGroups(f, cols, MXFP4Group); err != nil {
		return nil, err
	}
	return func(i int) (float64, bool) {
		n, e := fp4At(raw, scale, cols, MXFP4Group, i)
		k := numfmt.E8M0ToF32(e)
		return float64(numfmt.E2M1ToF32(n)) * float64(k), finite32(k)
	}, nil
}

// fp4At is element i (row-major) of a weight of cols columns stored as
// decodeFP4 reads it: its E2M1 code and its group's one-byte scale entry.
func fp4At(raw, scale []byte, cols, g, i int) (code, s byte) {
	r, c := i/cols, i%cols
	return raw[(r*cols+c)/2] >> (4 * (c % 2)) & 0xF, scale[r*(cols/g)+c/g]
}

// decodeFP4 writes the rows x cols E2M1 weight packed two to a byte in raw
// (even element in the low nibble) to dst, each group of g elements of a
// row through the 16-entry table that its one-byte scale entry selects.
// The sizes are checked already; cols is a multiple of g, g even.
func decodeFP4(raw []byte, rows, cols, g int, scale []byte, tab *[256][16]float32, dst []float32) error {
	if g <= 0 || g%2 != 0 || cols%g != 0 {
		return fmt.Errorf("fp4 dequant: %d columns in groups of %d", cols, g)
	}
	if cols == 0 {
		return nil // any number of empty rows (a loop over 2^62 of them would not end)
	}
	if n := rows * cols; useAVX2 && (g == 16 || g == 32) && rows > 0 && n/rows == cols &&
		len(raw) >= n/2 && len(scale) >= n/g && len(dst) >= n {
		// Whole rows are whole 8-byte units, each within one group; the
		// lengths are checked again here, the kernel reading and writing
		// exactly those.
		fp4Units(&raw[0], &scale[0], tab, &dst[0], rows*cols/16, g/32)
		return nil
	}
	decodeFP4Go(raw, rows, cols, g, scale, tab, dst)
	return nil
}

// decodeFP4Go is decodeFP4's Go twin: one table entry an element.
func decodeFP4Go(raw []byte, rows, cols, g int, scale []byte, tab *[256][16]float32, dst []float32) {
	groups := cols / g
	for r := range rows {
		row := raw[r*cols/2 : (r+1)*cols/2]
		out := dst[r*cols : (r+1)*cols]
		for q := range groups {
			t := &tab[scale[r*groups+q]]
			in := row[q*g/2 : (q+1)*g/2]
			o := out[q*g : (q+1)*g]
			o = o[:2*len(in)]
			for i, b := range in {
				o[2*i] = t[b&0x0F]
				o[2*i+1] = t[b>>4]
			}
		}
	}
}
