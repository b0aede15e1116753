package numfmt

import (
	"math"
	"testing"
)

func isNaN32(f float32) bool { return f != f }

func TestFP8Decoders(t *testing.T) {
	p2 := func(e int) float32 { return float32(math.Ldexp(1, e)) }
	tests := []struct {
		name string
		fn   func(byte) float32
		b    byte
		want float32 // NaN means "must be NaN"
	}{
		{"e4m3 zero", E4M3ToF32, 0x00, 0},
		{"e4m3 smallest subnormal", E4M3ToF32, 0x01, p2(-9)},
		{"e4m3 largest subnormal", E4M3ToF32, 0x07, 7 * p2(-9)},
		{"e4m3 smallest normal", E4M3ToF32, 0x08, p2(-6)},
		{"e4m3 one", E4M3ToF32, 0x38, 1},
		{"e4m3 1.125", E4M3ToF32, 0x39, 1.125},
		{"e4m3 -2", E4M3ToF32, 0xC0, -2},
		{"e4m3 max 448", E4M3ToF32, 0x7E, 448},
		{"e4m3 -448", E4M3ToF32, 0xFE, -448},
		{"e4m3 256 (S.1111.000 is finite)", E4M3ToF32, 0x78, 256},
		{"e4m3 NaN", E4M3ToF32, 0x7F, float32(math.NaN())},
		{"e4m3 -NaN", E4M3ToF32, 0xFF, float32(math.NaN())},
		{"e5m2 one", E5M2ToF32, 0x3C, 1},
		{"e5m2 smallest subnormal", E5M2ToF32, 0x01, p2(-16)},
		{"e5m2 max 57344", E5M2ToF32, 0x7B, 57344},
		{"e5m2 inf", E5M2ToF32, 0x7C, float32(math.Inf(1))},
		{"e5m2 -inf", E5M2ToF32, 0xFC, float32(math.Inf(-1))},
		{"e5m2 NaN", E5M2ToF32, 0x7E, float32(math.NaN())},
		{"e8m0 one", E8M0ToF32, 127, 1},
		{"e8m0 two", E8M0ToF32, 128, 2},
		{"e8m0 smallest", E8M0ToF32, 0, p2(-127)},
		{"e8m0 largest", E8M0ToF32, 0xFE, p2(127)},
		{"e8m0 NaN", E8M0ToF32, 0xFF, float32(math.NaN())},
	}
	for _, tt := range tests {
		got := tt.fn(tt.b)
		if isNaN32(tt.want) {
			if !isNaN32(got) {
				t.Errorf("%s: 0x%02x = %v, want NaN", tt.name, tt.b, got)
			}
			continue
		}
		if got != tt.want || math.Signbit(float64(got)) != math.Signbit(float64(tt.want)) {
			t.Errorf("%s: 0x%02x = %v, want %v", tt.name, tt.b, got, tt.want)
		}
	}
	if v := E4M3ToF32(0x80); v != 0 || !math.Signbit(float64(v)) {
		t.Errorf("e4m3 0x80 = %v, want -0", v)
	}
	// Every e4m3 byte but the two NaNs is finite and within +-448, the
	// positive half is strictly increasing (the encoding is monotone), and the
	// negative half mirrors it.
	for b := 1; b < 0x7F; b++ {
		if !(E4M3ToF32(byte(b)) > E4M3ToF32(byte(b-1))) {
			t.Fatalf("e4m3 not increasing at 0x%02x", b)
		}
	}
	for b := 0; b < 0x7F; b++ {
		if E4M3ToF32(byte(b)|0x80) != -E4M3ToF32(byte(b)) {
			t.Fatalf("e4m3 0x%02x is not the negation of 0x%02x", b|0x80, b)
		}
	}
	// e5m2 is the top byte of an IEEE half, and e8m0 the exponent field of a
	// float32: both decoders agree with those exhaustively.
	for b := range 256 {
		want := F16ToF32(uint16(b) << 8)
		if got := E5M2ToF32(byte(b)); got != want && !(isNaN32(got) && isNaN32(want)) {
			t.Errorf("e5m2 0x%02x = %v, f16 0x%02x00 = %v", b, got, b, want)
		}
		if b == 0 || b == 0xFF {
			continue
		}
		if got, want := E8M0ToF32(byte(b)), math.Float32frombits(uint32(b)<<23); got != want {
			t.Errorf("e8m0 0x%02x = %v, want %v", b, got, want)
		}
	}
}

// f16Value decodes a half by its definition, independently of F16ToF32.
func f16Value(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e := int(h>>10) & 0x1f
	m := float64(h & 0x3ff)
	switch e {
	case 0:
		return sign * m * math.Ldexp(1, -24)
	case 0x1f:
		if m != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * (1 + m/1024) * math.Ldexp(1, e-15)
}

func TestHalfDecoders(t *testing.T) {
	tests := []struct {
		name string
		fn   func(uint16) float32
		u    uint16
		want float32
	}{
		{"bf16 one", BF16ToF32, 0x3F80, 1},
		{"bf16 -1.5", BF16ToF32, 0xBFC0, -1.5},
		{"bf16 smallest subnormal", BF16ToF32, 0x0001, float32(math.Ldexp(1, -133))},
		{"f16 one", F16ToF32, 0x3C00, 1},
		{"f16 max", F16ToF32, 0x7BFF, 65504},
		{"f16 -max", F16ToF32, 0xFBFF, -65504},
		{"f16 smallest subnormal", F16ToF32, 0x0001, float32(math.Ldexp(1, -24))},
		{"f16 largest subnormal", F16ToF32, 0x03FF, float32(1023 * math.Ldexp(1, -24))},
		{"f16 inf", F16ToF32, 0x7C00, float32(math.Inf(1))},
		{"f16 -subnormal", F16ToF32, 0x8002, float32(-2 * math.Ldexp(1, -24))},
	}
	for _, tt := range tests {
		if got := tt.fn(tt.u); got != tt.want {
			t.Errorf("%s: 0x%04x = %v, want %v", tt.name, tt.u, got, tt.want)
		}
	}
	if !isNaN32(F16ToF32(0x7E00)) {
		t.Error("f16 0x7E00 is not NaN")
	}
	if v := F16ToF32(0x8000); v != 0 || !math.Signbit(float64(v)) {
		t.Errorf("f16 0x8000 = %v, want -0", v)
	}
	for h := range 1 << 16 {
		got, want := float64(F16ToF32(uint16(h))), f16Value(uint16(h))
		if got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("f16 %#04x = %v, want %v", h, got, want)
		}
	}
}

// Every non-NaN code survives decode+encode unchanged: the encoders are exact
// on representable values, through float32 and through float64.
func TestRoundTripEveryCode(t *testing.T) {
	for c := range 256 {
		if c&0x7f == 0x7f {
			continue
		}
		if got := F32ToE4M3(E4M3ToF32(uint8(c))); got != uint8(c) {
			t.Errorf("e4m3 code %#02x -> %g -> %#02x", c, E4M3ToF32(uint8(c)), got)
		}
	}
	for h := range 1 << 16 {
		if v := BF16ToF32(uint16(h)); v == v {
			if got := F32ToBF16(v); got != uint16(h) {
				t.Fatalf("bf16 %#04x -> %g -> %#04x", h, v, got)
			}
			if got := F64ToBF16(float64(v)); got != uint16(h) {
				t.Fatalf("bf16 %#04x -> %g -> F64ToBF16 %#04x", h, v, got)
			}
			if RoundBF16(v) != v {
				t.Fatalf("RoundBF16 moved the bf16 value %g", v)
			}
		}
		if v := F16ToF32(uint16(h)); v == v {
			if got := F32ToF16(v); got != uint16(h) {
				t.Fatalf("f16 %#04x -> %g -> %#04x", h, v, got)
			}
			if got := F64ToF16(float64(v)); got != uint16(h) {
				t.Fatalf("f16 %#04x -> %g -> F64ToF16 %#04x", h, v, got)
			}
		}
	}
}
