package numfmt

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// codec is one encoder seen through magnitudes: enc of a positive x gives a
// code in 0..top, and dec gives the value of every such code. For formats
// that overflow, top is the infinity code and dec gives it the first value
// past the range (2^128, 2^16), which makes IEEE overflow plain rounding.
type codec struct {
	name   string
	enc    func(x float64) uint32
	dec    func(c uint32) float64
	top    uint32
	sign   uint32
	lo, hi int  // exponent range of the random inputs
	f32    bool // the encoder takes float32: feed it float32 values
}

func codecs() []codec {
	bf16 := func(c uint32) float64 {
		if c == 0x7f80 {
			return 0x1p128
		}
		return float64(BF16ToF32(uint16(c)))
	}
	f16 := func(c uint32) float64 {
		if c == 0x7c00 {
			return 0x1p16
		}
		return float64(F16ToF32(uint16(c)))
	}
	e4m3 := func(c uint32) float64 { return float64(E4M3ToF32(uint8(c))) }
	return []codec{
		{"F32ToBF16", func(x float64) uint32 { return uint32(F32ToBF16(float32(x))) }, bf16, 0x7f80, 0x8000, -149, 128, true},
		{"F64ToBF16", func(x float64) uint32 { return uint32(F64ToBF16(x)) }, bf16, 0x7f80, 0x8000, -160, 130, false},
		{"F32ToF16", func(x float64) uint32 { return uint32(F32ToF16(float32(x))) }, f16, 0x7c00, 0x8000, -27, 17, true},
		{"F64ToF16", func(x float64) uint32 { return uint32(F64ToF16(x)) }, f16, 0x7c00, 0x8000, -27, 17, false},
		{"F32ToE4M3", func(x float64) uint32 { return uint32(F32ToE4M3(float32(x))) }, e4m3, 0x7e, 0x80, -12, 10, true},
	}
}

// nearestEven reports why code c is not x (> 0) rounded to nearest even, or "".
func (k codec) nearestEven(x float64, c uint32) string {
	if c > k.top {
		return "beyond the largest code"
	}
	v := k.dec(c)
	for _, n := range []uint32{c - 1, c + 1} {
		if n > k.top { // c-1 wraps around for c == 0
			continue // no neighbour on that side
		}
		vn := k.dec(n)
		mid := (v + vn) / 2 // exact: both values have few significant bits
		switch {
		case x == mid && c&1 != 0:
			return "a tie rounded to odd"
		case vn > v && x > mid, vn < v && x < mid:
			return "a neighbour is nearer"
		}
	}
	return ""
}

// Random magnitudes over each format's whole range (subnormals, overflow),
// exact midpoints between neighbouring codes, and the float64 values just
// beside them all round to the nearest code, ties to even, sign symmetric.
// Inputs beside a midpoint are where rounding through float32 first would
// round twice: the F64 encoders must not.
func TestEncodersRoundToNearestEven(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, k := range codecs() {
		var xs []float64
		for range 20000 {
			xs = append(xs, math.Ldexp(1+r.Float64(), k.lo+r.IntN(k.hi-k.lo+1)))
			c := uint32(r.IntN(int(k.top)))
			mid := (k.dec(c) + k.dec(c+1)) / 2
			xs = append(xs, mid, math.Nextafter(mid, 0), math.Nextafter(mid, math.Inf(1)))
			if k.f32 {
				m32 := float32(mid)
				xs = append(xs, float64(math.Nextafter32(m32, 0)), float64(math.Nextafter32(m32, 1e30)))
			}
		}
		bad := 0
		for _, x := range xs {
			if k.f32 {
				x = float64(float32(x))
			}
			if x == 0 {
				continue
			}
			c := k.enc(x)
			why := k.nearestEven(x, c)
			if neg := k.enc(-x); neg != c|k.sign && why == "" {
				why = "the negative gives another code"
			}
			if why != "" {
				if bad++; bad <= 5 {
					t.Errorf("%s(%v) = %#x: %s", k.name, x, c, why)
				}
			}
		}
	}
}

// A known double-rounding trap: 1 + 2^-8 + 2^-30 rounds to the float32 tie
// 1 + 2^-8, which bf16 rounds to even 1.0; the correct bf16 is 1 + 2^-7.
func TestF64EncodersRoundOnce(t *testing.T) {
	for _, c := range []struct {
		x    float64
		bf16 uint16
		f16  uint16
	}{
		{1 + 0x1p-8 + 0x1p-30, 0x3f81, 0x3c04},
		{-(1 + 0x1p-8 + 0x1p-30), 0xbf81, 0xbc04},
		{1 + 0x1p-11 + 0x1p-40, 0x3f80, 0x3c01}, // the f16 trap
		{1 + 0x1p-11 - 0x1p-40, 0x3f80, 0x3c00},
		{65520 - 0x1p-20, 0x4780, 0x7bff},   // just below the f16 overflow tie
		{0x1p128 - 0x1p100, 0x7f80, 0x7c00}, // past bf16's overflow tie, inside float32
		{1e300, 0x7f80, 0x7c00},
		{0x1p-200, 0, 0},
		{-0x1p-200, 0x8000, 0x8000},
		{0x1p-134 + 0x1p-170, 0x0001, 0}, // just above half bf16's smallest subnormal
		{0x1p-25 + 0x1p-60, 0x3300, 1},   // just above half f16's smallest subnormal
	} {
		if got := F64ToBF16(c.x); got != c.bf16 {
			t.Errorf("F64ToBF16(%v) = %#04x, want %#04x", c.x, got, c.bf16)
		}
		if got := F64ToF16(c.x); got != c.f16 {
			t.Errorf("F64ToF16(%v) = %#04x, want %#04x", c.x, got, c.f16)
		}
	}
}

// bigRound rounds x to p significant bits, nearest even (normal range only).
func bigRound(x float64, p uint) float64 {
	f, _ := new(big.Float).SetPrec(p).SetMode(big.ToNearestEven).SetFloat64(x).Float64()
	return f
}

// Exact products of bf16/f16 values and routed_scaling_factor-like factors
// (what convert folds) round once, as math/big rounds them.
func TestF64EncodersMatchBigFloat(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	factors := []float64{2.5, 16, 1.0 / 3, 0.7071067811865476, 2.827}
	for i := range 200000 {
		f := factors[i%len(factors)]
		xb := float64(RoundBF16(float32(r.NormFloat64() * math.Ldexp(1, r.IntN(40)-20))))
		// bigRound knows no subnormals: compare in the normal range
		if got, want := float64(BF16ToF32(F64ToBF16(xb*f))), bigRound(xb*f, 8); got != want && math.Abs(want) >= 0x1p-126 {
			t.Fatalf("bf16 %v*%v = %v, want %v", xb, f, got, want)
		}
		xh := float64(F16ToF32(F32ToF16(float32(r.NormFloat64() * math.Ldexp(1, r.IntN(16)-8)))))
		if got, want := float64(F16ToF32(F64ToF16(xh*f))), bigRound(xh*f, 11); got != want && math.Abs(want) >= 0x1p-14 {
			t.Fatalf("f16 %v*%v = %v, want %v", xh, f, got, want)
		}
	}
}

func TestRoundBF16IsNearest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		f := float32(r.NormFloat64() * 10)
		b := RoundBF16(f)
		u := F32ToBF16(f)
		lo, hi := BF16ToF32(u-1), BF16ToF32(u+1)
		if b != BF16ToF32(u) || math.Abs(float64(b-f)) > math.Abs(float64(lo-f)) || math.Abs(float64(b-f)) > math.Abs(float64(hi-f)) {
			t.Fatalf("RoundBF16(%v) = %v is not the nearest (neighbours %v, %v)", f, b, lo, hi)
		}
	}
}
