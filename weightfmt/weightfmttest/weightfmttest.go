// Package weightfmttest is a conformance suite for weight decoders, in the
// shape of gonum's testblas: an implementation under test (weightfmt's
// reference Dequantise, its fast Dequantiser, the GPU decoders in kernels)
// provides a Decoder, and the suite's Test functions hand it stored
// weights of each format moeprep reads and compare what it decodes with
// what the format defines, bit for bit.
//
// The expected values are not computed by weightfmt. Each element's value
// is written here from the format's definition (values.go: the E4M3, E2M1,
// E8M0, binary16 and bfloat16 codes; cases.go: how each format packs its
// elements and applies its scales), in float64 where it is exact, and
// rounded once to float32 by a rounding of the suite's own. The cases hold
// the edges a decoder gets wrong: every code of every element type, zero,
// negative zero, subnormal, infinite and NaN scales, E8M0's 0 (2^-127),
// 254 and 255 (NaN), E4M3's NaN codes, products past float32 and past
// bf16, ties of the output rounding, the nibble order of packed bytes (the
// even element in the low nibble), INT4's word order (element 8j+k in
// bits 4k..4k+3 of word j), partial last words, scale groups that split a
// word, and rows long enough to take several GPU blocks.
package weightfmttest

import (
	"fmt"
	"math"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// Weight is one stored [Rows, Cols] weight, as a checkpoint holds it.
type Weight struct {
	// Format is how it is stored (weightfmt names the formats; the
	// suite's expectations do not use its code).
	Format     weightfmt.Format
	Rows, Cols int
	// Raw is the weight tensor's bytes, row-major: Rows rows of
	// ceil(Cols / elements per unit) units (weightfmt.Format.Packing).
	Raw []byte
	// Scale is the scale grid's bytes, row-major; nil when the format has
	// no scale.
	Scale []byte
	// Global is the weight's one per-tensor scale entry (NVFP4's F32
	// weight_scale_2 or weight_global_scale); nil when the format has none.
	Global []byte
}

// Decoder is an implementation under test.
type Decoder interface {
	// Decode decodes w to its Rows*Cols values, row-major, widened to
	// float32 where Output is narrower. It may refuse (an error) a weight
	// with an element whose value, computed from finite stored values, is
	// not finite in Output; any other error fails the case.
	Decode(w Weight) ([]float32, error)
	// Output is the dtype the implementation writes: F32, the exact
	// float32 dequantisation; BF16 or F16, that value rounded once to
	// nearest even.
	Output() safetensors.DType
}

// Case is one weight and what it decodes to.
type Case struct {
	Name   string
	Weight Weight
	// Want is each element's dequantisation: the format's formula on the
	// stored codes, rounded once to float32 (any NaN stands for every NaN).
	Want []float32
	// Finite[i] is whether every stored value element i is computed from
	// is finite: where it is and Want[i] (in a decoder's Output) is not,
	// the value overflowed, and a decoder may refuse the weight.
	Finite []bool
}

// Check compares got, a decoder's values of c in dtype out (widened to
// float32), with c.Want rounded to out, bit for bit (negative zero is not
// zero); a NaN matches any NaN. It reports up to five differences and
// how many there were.
func Check(t testing.TB, c Case, out safetensors.DType, got []float32) {
	t.Helper()
	if len(got) != len(c.Want) {
		t.Fatalf("%s: %d values, want %d", c.Name, len(got), len(c.Want))
	}
	bad := 0
	for i, w := range c.Want {
		w, err := roundTo(w, out)
		if err != nil {
			t.Fatal(err)
		}
		g := got[i]
		if math.IsNaN(float64(w)) && math.IsNaN(float64(g)) || math.Float32bits(g) == math.Float32bits(w) {
			continue
		}
		if bad++; bad <= 5 {
			t.Errorf("%s: [%d, %d] = %g (0x%08x), want %g (0x%08x)%s", c.Name, i/c.Weight.Cols, i%c.Weight.Cols,
				g, math.Float32bits(g), w, math.Float32bits(w), c.source(i))
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d values differ", c.Name, bad, len(c.Want))
	}
}

// Overflows reports whether some element of c, computed from finite
// stored values, is not finite in dtype out: a decoder writing out may
// refuse c.
func (c Case) Overflows(out safetensors.DType) bool {
	for i, w := range c.Want {
		if !c.Finite[i] {
			continue
		}
		if r, err := roundTo(w, out); err != nil || !finite(float64(r)) {
			return true
		}
	}
	return false
}

// source describes element i's stored bytes for a failure message.
func (c Case) source(i int) string {
	w := c.Weight
	e, b := w.Format.Packing()
	r, col := i/w.Cols, i%w.Cols
	unit := (w.Cols + int(e) - 1) / int(e) * int(b) // bytes a row
	off := r*unit + col/int(e)*int(b)
	if off+int(b) > len(w.Raw) {
		return ""
	}
	return fmt.Sprintf(" (stored bytes % x, element %d of them)", w.Raw[off:off+int(b)], col%int(e))
}

// Run runs each case against d as a subtest.
func Run(t *testing.T, d Decoder, cases []Case) {
	t.Helper()
	if len(cases) == 0 {
		t.Fatal("no cases")
	}
	out := d.Output()
	if _, err := roundTo(0, out); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			got, err := d.Decode(c.Weight)
			if err != nil {
				if c.Overflows(out) {
					t.Logf("refused a weight with a value past %s: %v", out, err)
					return
				}
				t.Fatal(err)
			}
			Check(t, c, out, got)
		})
	}
}

// TestPlain runs the unquantised formats' cases (BF16, F16, F32).
func TestPlain(t *testing.T, d Decoder) { Run(t, d, PlainCases()) }

// TestFP8Block runs FP8 E4M3 with a scale per block of rows x columns
// (weight_scale_inv F32, UE8M0 or not; DeepSeek-V4's E8M0 x.scale).
func TestFP8Block(t *testing.T, d Decoder) { Run(t, d, FP8BlockCases()) }

// TestFP8Scaled runs FP8 E4M3 with a scale per output row or one per
// weight, in each scale dtype.
func TestFP8Scaled(t *testing.T, d Decoder) { Run(t, d, FP8ScaledCases()) }

// TestInt4Pack runs compressed-tensors' pack-quantized INT4.
func TestInt4Pack(t *testing.T, d Decoder) { Run(t, d, Int4PackCases()) }

// TestMXFP4 runs MXFP4 as gpt-oss, compressed-tensors and DeepSeek-V4
// store it.
func TestMXFP4(t *testing.T, d Decoder) { Run(t, d, MXFP4Cases()) }

// TestMXFP8 runs MXFP8 as ModelOpt and MiniMax store it.
func TestMXFP8(t *testing.T, d Decoder) { Run(t, d, MXFP8Cases()) }

// TestNVFP4 runs NVFP4 as ModelOpt and compressed-tensors store it.
func TestNVFP4(t *testing.T, d Decoder) { Run(t, d, NVFP4Cases()) }

// TestAll runs every format's cases.
func TestAll(t *testing.T, d Decoder) {
	for _, s := range []struct {
		name string
		test func(*testing.T, Decoder)
	}{
		{"plain", TestPlain}, {"fp8-block", TestFP8Block}, {"fp8-scaled", TestFP8Scaled},
		{"int4-pack", TestInt4Pack}, {"mxfp4", TestMXFP4}, {"mxfp8", TestMXFP8}, {"nvfp4", TestNVFP4},
	} {
		t.Run(s.name, func(t *testing.T) { s.test(t, d) })
	}
}
