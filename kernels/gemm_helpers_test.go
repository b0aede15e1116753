package kernels_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/numfmt"
)

// Every kernels test shares one device, opened on first use; without a
// driver or a GPU they skip.
var (
	testDevOnce sync.Once
	testDev     *cuda.Device
	testDevErr  error
)

func testDevice(t *testing.T) *cuda.Device {
	t.Helper()
	testDevOnce.Do(func() {
		testDev, testDevErr = cuda.Open(0)
		if testDevErr == nil {
			t.Logf("device: %s", testDev)
		}
	})
	if errors.Is(testDevErr, cuda.ErrNoDriver) || errors.Is(testDevErr, cuda.ErrNoDevice) {
		t.Skipf("no GPU: %v", testDevErr)
	}
	if testDevErr != nil {
		t.Fatalf("opening GPU 0: %v", testDevErr)
	}
	return testDev
}

// benchDevice is testDevice for a measurement, which runs only when the
// environment variable env is 1.
func benchDevice(t *testing.T, env, what string) *cuda.Device {
	t.Helper()
	if os.Getenv(env) != "1" {
		t.Skipf("set %s=1 to time %s", env, what)
	}
	return testDevice(t)
}

// toDevice uploads host values, failing the test on error.
func toDevice[T cuda.Elem](t *testing.T, d *cuda.Device, v []T) *cuda.Buffer[T] {
	t.Helper()
	b, err := cuda.FromHost(d, v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}

func fromDevice[T cuda.Elem](t *testing.T, b *cuda.Buffer[T]) []T {
	t.Helper()
	v, err := b.ToHost(-1)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// poisoned returns a device buffer of n float32 NaNs, so an element the
// kernel forgot to write fails the comparison.
func poisoned(t *testing.T, d *cuda.Device, n int) *cuda.Buffer[float32] {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.NaN())
	}
	return toDevice(t, d, v)
}

func randn(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

func toBF16(v []float32) []uint16 {
	out := make([]uint16, len(v))
	for i, f := range v {
		out[i] = numfmt.F32ToBF16(f)
	}
	return out
}

func fromBF16(v []uint16) []float32 {
	out := make([]float32, len(v))
	for i, u := range v {
		out[i] = numfmt.BF16ToF32(u)
	}
	return out
}

// randFP8 draws E4M3 bytes of magnitude 2^-4 .. 2^2.9 with random sign and
// mantissa: real, varied values, no NaN.
func randFP8(r *rand.Rand, n int) []uint8 {
	v := make([]uint8, n)
	for i := range v {
		exp := uint8(3 + r.IntN(7))
		v[i] = uint8(r.IntN(2))<<7 | exp<<3 | uint8(r.IntN(8))
	}
	return v
}

// relL2 is ||got-want|| / ||want||; NaN in got gives +Inf.
func relL2(got, want []float32) float64 {
	var num, den float64
	for i := range want {
		g := float64(got[i])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			return math.Inf(1)
		}
		d := g - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// scaleDims is the shape of the block scales of a rows x cols weight
// quantised in blocks of bo x bi.
func scaleDims(rows, cols, bo, bi int) (int, int) {
	return (rows + bo - 1) / bo, (cols + bi - 1) / bi
}

// dequantFP8 decodes an e4m3 rows x cols weight whose element (r,c) is
// scaled by scale[r/bo][c/bi]: the fp8 value times its block's scale,
// rounded once to float32 (weight.float() * scale).
func dequantFP8(src []byte, rows, cols int, scale []float32, bo, bi int, dst []float32) {
	_, sc := scaleDims(rows, cols, bo, bi)
	for r := range rows {
		for c := range cols {
			dst[r*cols+c] = numfmt.E4M3ToF32(src[r*cols+c]) * scale[(r/bo)*sc+c/bi]
		}
	}
}
