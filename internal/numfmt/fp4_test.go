package numfmt

import (
	"math"
	"testing"
)

// Every E2M1 code against the OCP MX v1.0 table (also compressed-tensors'
// kE2M1ToFloat and transformers' FP4_VALUES, with the sign bit 8): 0, 0.5,
// 1, 1.5, 2, 3, 4, 6 and their negatives, -0 for code 8; the high bits of
// the byte are ignored, so a packed byte's high nibble must be shifted down.
func TestE2M1(t *testing.T) {
	want := [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6}
	for c := range 16 {
		got := E2M1ToF32(byte(c))
		if got != want[c] {
			t.Errorf("e2m1 %#x = %v, want %v", c, got, want[c])
		}
		if neg := c&8 != 0; math.Signbit(float64(got)) != neg {
			t.Errorf("e2m1 %#x = %v: sign bit %v, want %v", c, got, !neg, neg)
		}
		for hi := range 16 {
			if g := E2M1ToF32(byte(hi<<4 | c)); g != got || math.Signbit(float64(g)) != math.Signbit(float64(got)) {
				t.Fatalf("e2m1 of byte %#02x = %v, want the low nibble's %v", hi<<4|c, g, got)
			}
		}
	}
	// The codes are a monotone encoding of the magnitudes: E2M1 with an
	// exponent bias of 1 is 0.5 * 2^e * (1 + m/2) for e > 0.
	for c := 1; c < 8; c++ {
		if !(E2M1ToF32(byte(c)) > E2M1ToF32(byte(c-1))) {
			t.Errorf("e2m1 not increasing at %#x", c)
		}
	}
}

// An MXFP4 value is an E2M1 code times an E8M0 power of two; both
// decoders are exact, so the float32 product is the value itself, down to
// 0.5 * 2^-127 (a float32 subnormal) and up to 1.5 * 2^127; 2 * 2^127 and
// more are past float32's range: +Inf.
func TestE2M1TimesE8M0(t *testing.T) {
	for _, tc := range []struct {
		nib, e byte
		want   float64
	}{
		{0x1, 0, 0x1p-128},
		{0x7, 127, 6},
		{0xF, 128, -12},
		{0xA, 125, -0.25},
		{0x3, 254, 1.5 * 0x1p127},
		{0x4, 254, math.Inf(1)},
		{0xE, 200, -4 * 0x1p73},
	} {
		if got := E2M1ToF32(tc.nib) * E8M0ToF32(tc.e); float64(got) != tc.want {
			t.Errorf("e2m1 %#x * e8m0 %d = %v, want %v", tc.nib, tc.e, got, tc.want)
		}
	}
}
