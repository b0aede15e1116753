package moe

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
)

// TestQuantizeActGroups checks codes and scales against values worked by
// hand: exact codes, ties to even, saturation, short last groups, zeros,
// subnormals and NaN.
func TestQuantizeActGroups(t *testing.T) {
	nan := float32(math.NaN())
	cases := []struct {
		name       string
		x          []float32
		group      int
		wantQ      []byte
		wantScales []float32
	}{
		// amax 2: scale 2/448; x/scale = 224, -112, 56, 448 (1.75 x 2^7, 2^6, 2^5, 2^8).
		{"exact codes", []float32{1, -0.5, 0.25, 2}, 4, []byte{0x76, 0xee, 0x66, 0x7e}, []float32{float32(2) / 448}},
		// amax 448: scale 1. 17 lies halfway between 16 (0x58) and 18 (0x59): even is 16;
		// 19 between 18 and 20 (0x5a): even is 20; -8.5 between 8 (0x50) and 9: even is 8.
		{"ties to even", []float32{448, 17, 19, -8.5}, 4, []byte{0x7e, 0x58, 0x5a, 0xd0}, []float32{1}},
		// 2^-9 is the smallest subnormal (0x01); 2^-10 is halfway to zero: even is 0.
		{"subnormals", []float32{448, 0.001953125, 0.0009765625, -0.0029296875}, 4, []byte{0x7e, 0x01, 0x00, 0x82}, []float32{1}},
		// Two groups of a 6-wide row: the second has 2 columns and its own scale
		// (-1 / (4/448) = -112; 1 / (2/448) = 224).
		{"short last group", []float32{4, 0, 0, -1, 1, -2}, 4, []byte{0x7e, 0, 0, 0xee, 0x76, 0xfe}, []float32{float32(4) / 448, float32(2) / 448}},
		{"zeros", []float32{0, 0, 0}, 4, []byte{0, 0, 0}, []float32{float32(actQuantEps) / 448}},
		// The second group: 3 / (4/448) = 336, halfway between 320 (0x7a) and 352: even is 320.
		{"NaN poisons its group's scale", []float32{1, nan, 3, 4}, 2, []byte{0x7f, 0x7f, 0x7a, 0x7e}, []float32{nan, float32(4) / 448}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ng := (len(c.x) + c.group - 1) / c.group
			q := make([]byte, len(c.x))
			s := make([]float32, ng)
			QuantizeActGroups(c.x, 1, len(c.x), c.group, q, s)
			if !slices.Equal(q, c.wantQ) {
				t.Errorf("codes % x, want % x", q, c.wantQ)
			}
			for i := range s {
				if !(s[i] == c.wantScales[i] || s[i] != s[i] && c.wantScales[i] != c.wantScales[i]) {
					t.Errorf("scale %d = %g, want %g", i, s[i], c.wantScales[i])
				}
			}
		})
	}
}

// TestRoundTripActGroupsBound checks on random data of wide dynamic range
// that every value comes back within half an e4m3 step: 2^-4 of itself in
// the normal range, half the subnormal step (2^-10 x scale) below it.
func TestRoundTripActGroupsBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const rows, cols = 16, 300 // 3 groups a row, the last 44 wide
	x := make([]float32, rows*cols)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * math.Exp2(float64(rng.IntN(24)-12)))
	}
	y := slices.Clone(x)
	RoundTripActGroups(y, rows, cols, ActGroup)
	changed := 0
	for r := range rows {
		for g := 0; g*ActGroup < cols; g++ {
			lo, hi := g*ActGroup, min((g+1)*ActGroup, cols)
			amax := 0.0
			for _, v := range x[r*cols+lo : r*cols+hi] {
				amax = max(amax, math.Abs(float64(v)))
			}
			scale := amax / numfmt.E4M3Max
			for c := lo; c < hi; c++ {
				v, w := float64(x[r*cols+c]), float64(y[r*cols+c])
				bound := max(math.Abs(v)*0x1p-4, scale*0x1p-10) * (1 + 1e-6)
				if math.Abs(w-v) > bound {
					t.Fatalf("row %d col %d: %g came back as %g (bound %g)", r, c, v, w, bound)
				}
				if w != v {
					changed++
				}
			}
		}
	}
	if changed < len(x)/2 {
		t.Errorf("only %d of %d values changed: random data should almost never be e4m3 already", changed, len(x))
	}
}

// TestGroupedGEMMW8A8 runs the CPU twin in both numerics on random data
// and checks how far the w8a8 mode lands from the precise one. Each of the
// two quantisations (token rows, intermediate) rounds every value to 3
// mantissa bits: a relative error of at most 2^-4, about 2^-4/sqrt(3) ~
// 0.036 RMS for values spread evenly over a binade, less on average since
// values near the top of a binade err less. Independent errors add in
// quadrature through the sums, so the output's relative L2 should sit near
// 0.03-0.05 (0.044 here); the test allows 0.01-0.08, which no quantisation
// at all (0) or a wrong scale (far more) leaves.
func TestGroupedGEMMW8A8(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const T, H, I, E, K = 24, 256, 192, 4, 2
	randn := func(n int, s float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * s)
		}
		return v
	}
	mats := make([]ExpertMats, E)
	for e := range mats {
		mats[e] = ExpertMats{Gate: randn(I*H, 0.06), Up: randn(I*H, 0.06), Down: randn(H*I, 0.07)}
	}
	load := func(_ context.Context, e int) (*ExpertMats, error) { return &mats[e], nil }
	x := randn(T*H, 1)
	ids := make([]int32, T*K)
	for i := range ids {
		ids[i] = int32(rng.IntN(E))
	}
	al, err := AlignBlockSize(ids, E, 16)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	precise, err := GroupedGEMM(ctx, x, T, H, I, K, al, load, GEMMOptions{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	w8a8, err := GroupedGEMM(ctx, x, T, H, I, K, al, load, GEMMOptions{Workers: 2, W8A8: true})
	if err != nil {
		t.Fatal(err)
	}
	d, cos := relL2(w8a8, precise), cosine(w8a8, precise)
	if !(d >= 0.01 && d <= 0.08) || !(cos >= 0.996) {
		t.Errorf("w8a8 against precise: rel_l2 %.4f, cos %.6f; want rel_l2 in [0.01, 0.08] and cos >= 0.996", d, cos)
	}
	// Quantising only the token rows (the first GEMM's input) must land
	// measurably closer (here 0.037 against 0.044): the w8a8 mode quantises
	// the intermediate too.
	xq := slices.Clone(x)
	RoundTripActGroups(xq, T, H, ActGroup)
	half, err := GroupedGEMM(ctx, xq, T, H, I, K, al, load, GEMMOptions{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if h := relL2(half, precise); !(h < d*0.95 && h >= d*0.5) {
		t.Errorf("quantising the token rows alone: rel_l2 %.4f, w8a8 %.4f: want between 0.5 and 0.95 of it", h, d)
	}
	t.Logf("w8a8 against precise: rel_l2 %.4f cos %.6f; token rows alone %.4f", d, cos, relL2(half, precise))
}

// relL2 is ||got-want|| / ||want|| in float64 (NaN when want is all zeros).
func relL2(got, want []float32) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - float64(w)
		num += d * d
		den += float64(w) * float64(w)
	}
	return math.Sqrt(num / den)
}

// cosine is the cosine of the angle between a and b, in float64.
func cosine(a, b []float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += float64(a[i]) * float64(b[i])
		aa += float64(a[i]) * float64(a[i])
		bb += float64(b[i]) * float64(b[i])
	}
	return ab / math.Sqrt(aa*bb)
}
