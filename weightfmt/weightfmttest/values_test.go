package weightfmttest

import (
	"math"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
)

// The suite's code tables, checked against values written out by hand
// from the formats' documents.
func TestCodeValues(t *testing.T) {
	same := func(what string, got, want float64) {
		t.Helper()
		if math.IsNaN(want) != math.IsNaN(got) || !math.IsNaN(want) && (got != want || math.Signbit(got) != math.Signbit(want)) {
			t.Errorf("%s = %g, want %g", what, got, want)
		}
	}
	for code, want := range map[byte]float64{
		0x00: 0, 0x80: math.Copysign(0, -1), 0x01: 0x1p-9, 0x07: 7 * 0x1p-9, 0x08: 0x1p-6, 0x38: 1, 0x39: 1.125,
		0x7e: 448, 0xfe: -448, 0x7f: math.NaN(), 0xff: math.NaN(), 0x40: 2, 0xb8: -1, 0x77: 240,
	} {
		same("e4m3", e4m3(code), want)
	}
	for code, want := range map[byte]float64{0: 0x1p-127, 1: 0x1p-126, 126: 0.5, 127: 1, 128: 2, 254: 0x1p127, 255: math.NaN()} {
		same("e8m0", e8m0(code), want)
	}
	for code, want := range map[uint16]float64{
		0x0000: 0, 0x8000: math.Copysign(0, -1), 0x0001: 0x1p-24, 0x03ff: 1023 * 0x1p-24, 0x0400: 0x1p-14, 0x3c00: 1,
		0x3c01: 1 + 0x1p-10, 0x7bff: 65504, 0xc000: -2, 0x7c00: math.Inf(1), 0xfc00: math.Inf(-1), 0x7e00: math.NaN(), 0x7c01: math.NaN(),
	} {
		same("f16", f16(code), want)
	}
	for code, want := range map[uint16]float64{0x3f80: 1, 0x0001: 0x1p-133, 0x7f7f: 0x1.fep127, 0x7f80: math.Inf(1), 0xc040: -3, 0x7fc0: math.NaN()} {
		same("bf16", bf16(code), want)
	}
	if e2m1Values[7] != 6 || e2m1Values[1] != 0.5 || e2m1Values[9] != -0.5 || !math.Signbit(e2m1Values[8]) {
		t.Errorf("e2m1 table %v", e2m1Values)
	}
	// A byte 0x71 holds E2M1 code 1 (0.5) as its even element and code 7
	// (6) as its odd one.
	if fp4Code([]byte{0x71}, 0) != 1 || fp4Code([]byte{0x71}, 1) != 7 {
		t.Error("fp4Code: the even element is not the low nibble")
	}
}

// The suite's rounding, against results worked by hand.
func TestRound(t *testing.T) {
	for _, c := range []struct {
		x    float64
		to   safetensors.DType
		want float64
	}{
		{1 + 0x1p-8, safetensors.BF16, 1},                    // a tie, to even
		{1 + 3*0x1p-8, safetensors.BF16, 1 + 0x1p-6},         // a tie, to even (up)
		{1 + 0x1p-8 + 0x1p-20, safetensors.BF16, 1 + 0x1p-7}, // past the tie
		{65520, safetensors.F16, math.Inf(1)},                // half a step past 65504
		{65519, safetensors.F16, 65504},
		{0x1p-25, safetensors.F16, 0},           // half the smallest subnormal: to even (zero)
		{3 * 0x1p-26, safetensors.F16, 0x1p-24}, // past half
		{-0x1p-26, safetensors.F16, math.Copysign(0, -1)},
		{0x1.fefp127, safetensors.BF16, 0x1.fep127}, // below bf16's halfway to infinity
		{0x1.ff0p127, safetensors.BF16, math.Inf(1)},
		{0x1p-134, safetensors.BF16, 0},
		{3 * 0x1p-135, safetensors.BF16, 0x1p-133},
	} {
		got, err := roundTo(float32(c.x), c.to)
		if err != nil || float64(got) != c.want || math.Signbit(float64(got)) != math.Signbit(c.want) {
			t.Errorf("roundTo(%g, %s) = %g, %v; want %g", c.x, c.to, got, err, c.want)
		}
	}
	for _, c := range [][2]float64{{0x1p-150, 0}, {3 * 0x1p-151, 0x1p-149}, {0x1.ffffffp127, math.Inf(1)}, {1 + 0x1p-24, 1}, {1 + 3*0x1p-24, 1 + 0x1p-22}} {
		if got := f32(c[0]); float64(got) != c[1] {
			t.Errorf("f32(%g) = %g, want %g", c[0], got, c[1])
		}
	}
}

// Every case is well formed: its sizes agree with its format, and it has
// values of every kind it claims (some NaN, some non-finite from finite
// values in float32 where the format can overflow).
func TestCasesWellFormed(t *testing.T) {
	for _, c := range AllCases() {
		w := c.Weight
		e, b := w.Format.Packing()
		if want := w.Rows * ((w.Cols + int(e) - 1) / int(e)) * int(b); len(w.Raw) != want {
			t.Errorf("%s: %d weight bytes, want %d", c.Name, len(w.Raw), want)
		}
		if len(c.Want) != w.Rows*w.Cols || len(c.Finite) != len(c.Want) {
			t.Errorf("%s: %d values, %d flags for %dx%d", c.Name, len(c.Want), len(c.Finite), w.Rows, w.Cols)
		}
	}
}
