package validate

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moeprep/moeprep/safetensors"
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
	// Every e4m3 byte but the two NaNs is finite and within +-448, and the
	// positive half is strictly increasing (the encoding is monotone).
	for b := 1; b < 0x7F; b++ {
		if !(E4M3ToF32(byte(b)) > E4M3ToF32(byte(b-1))) {
			t.Fatalf("e4m3 not increasing at 0x%02x", b)
		}
	}
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
}

func TestF32ToBF16(t *testing.T) {
	p2 := func(e int) float32 { return float32(math.Ldexp(1, e)) }
	tests := []struct {
		name string
		in   float32
		want uint16
	}{
		{"exact", 1, 0x3F80},
		{"tie to even down", 1 + p2(-8), 0x3F80},            // halfway between 1 and 1+2^-7
		{"tie to even up", 1 + 3*p2(-8), 0x3F82},            // halfway between 1+2^-7 and 1+2^-6
		{"above tie", 1 + p2(-8) + p2(-20), 0x3F81},         // just past halfway
		{"below tie", 1 + p2(-8) - p2(-20), 0x3F80},         // just before halfway
		{"negative tie", -(1 + 3*p2(-8)), 0xBF82},           // sign symmetric
		{"overflow to inf", math.MaxFloat32, 0x7F80},        // RNE carries into the exponent
		{"subnormal", float32(math.Ldexp(1, -140)), 0x0000}, // 2^-140 rounds to 0 (bf16 min sub 2^-133)
	}
	for _, tt := range tests {
		if got := F32ToBF16(tt.in); got != tt.want {
			t.Errorf("%s: F32ToBF16(%v) = 0x%04x, want 0x%04x", tt.name, tt.in, got, tt.want)
		}
	}
	if got := F32ToBF16(float32(math.NaN())); got&0x7F80 != 0x7F80 || got&0x7F == 0 {
		t.Errorf("NaN -> 0x%04x, not a bf16 NaN", got)
	}
	// Round trip: every bf16 pattern that is not NaN survives widening and rounding.
	for u := 0; u < 1<<16; u++ {
		f := BF16ToF32(uint16(u))
		if isNaN32(f) {
			continue
		}
		if got := F32ToBF16(f); got != uint16(u) {
			t.Fatalf("0x%04x -> %v -> 0x%04x", u, f, got)
		}
	}
	// Random values land on the nearer neighbour.
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		f := float32(r.NormFloat64() * 10)
		b := RoundBF16(f)
		u := F32ToBF16(f)
		lo, hi := BF16ToF32(u-1), BF16ToF32(u+1)
		if math.Abs(float64(b-f)) > math.Abs(float64(lo-f)) || math.Abs(float64(b-f)) > math.Abs(float64(hi-f)) {
			t.Fatalf("RoundBF16(%v) = %v is not the nearest (neighbours %v, %v)", f, b, lo, hi)
		}
	}
}

func TestDecode(t *testing.T) {
	le16 := func(v ...uint16) []byte {
		b := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(b[2*i:], x)
		}
		return b
	}
	f32 := make([]byte, 8)
	binary.LittleEndian.PutUint32(f32, math.Float32bits(1.25))
	binary.LittleEndian.PutUint32(f32[4:], math.Float32bits(-3))
	f64 := make([]byte, 8)
	binary.LittleEndian.PutUint64(f64, math.Float64bits(0.5))
	tests := []struct {
		dt   safetensors.DType
		in   []byte
		want []float32
	}{
		{safetensors.BF16, le16(0x3F80, 0xC000), []float32{1, -2}},
		{safetensors.F16, le16(0x3C00, 0x3800), []float32{1, 0.5}},
		{safetensors.F32, f32, []float32{1.25, -3}},
		{safetensors.F64, f64, []float32{0.5}},
		{safetensors.F8E4M3, []byte{0x38, 0x7E, 0x01}, []float32{1, 448, float32(math.Ldexp(1, -9))}},
		{safetensors.F8E5M2, []byte{0x3C, 0xC0}, []float32{1, -2}},
		{safetensors.F8E8M0, []byte{127, 130}, []float32{1, 8}},
	}
	for _, tt := range tests {
		got := make([]float32, len(tt.want))
		if err := Decode(tt.dt, tt.in, got); err != nil {
			t.Fatalf("%s: %v", tt.dt, err)
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%s[%d] = %v, want %v", tt.dt, i, got[i], tt.want[i])
			}
		}
	}
	if err := Decode(safetensors.BF16, []byte{1, 2, 3}, make([]float32, 2)); err == nil {
		t.Error("a short buffer decoded")
	}
	if err := Decode(safetensors.I32, make([]byte, 4), make([]float32, 1)); err == nil {
		t.Error("I32 decoded as a float")
	}
}

func TestDequantFP8(t *testing.T) {
	// 130 x 260 with 128x128 blocks: a 2x3 scale grid with ragged edges.
	const rows, cols, blk = 130, 260, 128
	r := rand.New(rand.NewPCG(3, 4))
	src := make([]byte, rows*cols)
	for i := range src {
		src[i] = byte(r.IntN(256))
		if src[i]&0x7F == 0x7F { // keep NaNs out of the arithmetic check
			src[i] = 0x38
		}
	}
	sr, sc := ScaleDims(rows, cols, blk, blk)
	if sr != 2 || sc != 3 {
		t.Fatalf("ScaleDims = %d,%d, want 2,3", sr, sc)
	}
	scale := []float32{0.5, 2, 3, 0.25, 1e-3, 7}
	dst := make([]float32, rows*cols)
	if err := DequantFP8(src, rows, cols, scale, blk, blk, dst); err != nil {
		t.Fatal(err)
	}
	for _, rc := range [][2]int{{0, 0}, {127, 127}, {127, 128}, {128, 127}, {129, 259}, {64, 200}, {129, 0}} {
		i := rc[0]*cols + rc[1]
		want := E4M3ToF32(src[i]) * scale[(rc[0]/blk)*sc+rc[1]/blk]
		if dst[i] != want {
			t.Errorf("(%d,%d) = %v, want %v", rc[0], rc[1], dst[i], want)
		}
	}
	for i := range dst {
		want := E4M3ToF32(src[i]) * scale[(i/cols/blk)*sc+(i%cols)/blk]
		if dst[i] != want {
			t.Fatalf("element %d = %v, want %v", i, dst[i], want)
		}
	}
	// Non-square blocks (bo 64, bi 128).
	sr, sc = ScaleDims(rows, cols, 64, 128)
	scale2 := make([]float32, sr*sc)
	for i := range scale2 {
		scale2[i] = float32(i + 1)
	}
	if err := DequantFP8(src, rows, cols, scale2, 64, 128, dst); err != nil {
		t.Fatal(err)
	}
	if i := 70*cols + 200; dst[i] != E4M3ToF32(src[i])*scale2[1*sc+1] {
		t.Errorf("64x128 block (70,200) = %v", dst[i])
	}
	if err := DequantFP8(src, rows, cols, scale[:5], blk, blk, dst); err == nil {
		t.Error("a short scale grid was accepted")
	}
}
