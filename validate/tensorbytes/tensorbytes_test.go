package tensorbytes

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
)

// TestFirstNonFinite: the scan finds the first NaN or Inf of each dtype and
// nothing in finite data, including the largest finite values.
func TestFirstNonFinite(t *testing.T) {
	inf, nan := float32(math.Inf(-1)), float32(math.NaN())
	for _, tc := range []struct {
		name string
		d    string
		raw  []byte
		want int
	}{
		{"bf16 finite max", "BF16", testkit.U16LE(0x7F7F, 0xFF7F, 0x0001, 0), -1},
		{"bf16 inf", "BF16", testkit.U16LE(0x3F80, 0x3F80, 0x7F80), 2},
		{"bf16 nan", "BF16", testkit.U16LE(0xFFC1), 0},
		{"f16 inf", "F16", testkit.U16LE(0x3C00, 0x7BFF, 0xFC00), 2},
		{"f32 finite", "F32", testkit.F32LE(math.MaxFloat32, -math.MaxFloat32, 1e-45), -1},
		{"f32 -inf", "F32", testkit.F32LE(1, 2, 3, inf), 3},
		{"f32 nan", "F32", testkit.F32LE(nan), 0},
		{"e4m3 max 448 is finite", "F8_E4M3", []byte{0x7E, 0xFE, 0x00}, -1},
		{"e4m3 nan", "F8_E4M3", []byte{0x01, 0xFF}, 1},
		{"e5m2 inf", "F8_E5M2", []byte{0x7B, 0x7C}, 1},
		{"e8m0 nan", "F8_E8M0", []byte{0x7F, 0xFF}, 1},
		{"int32 ignored", "I32", []byte{0xFF, 0xFF, 0xFF, 0xFF}, -1},
	} {
		d, err := parseDType(tc.d)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := FirstNonFinite(d, tc.raw); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

func parseDType(s string) (safetensors.DType, error) { return safetensors.ParseDType(s) }

// TestNonFiniteFastScanAgrees: the fast scan (32-byte rounds in Go, or in
// AVX2 where the CPU has it) and the element loop agree on random data
// with planted non-finite values, and one non-finite element planted at
// every place of a finite buffer is found there.
func TestNonFiniteFastScanAgrees(t *testing.T) {
	for _, avx := range []bool{false, true} {
		if avx && !useAVX2 {
			continue
		}
		func() {
			defer func(was bool) { useAVX2 = was }(useAVX2)
			useAVX2 = avx
			fastScanAgrees(t)
			plantedFound(t)
		}()
	}
}

// plantedFound plants one all-exponent element (NaN or Inf) at each place
// of a finite buffer of each dtype and wants it found there.
func plantedFound(t *testing.T) {
	for _, d := range []safetensors.DType{safetensors.BF16, safetensors.F32, safetensors.F8E4M3} {
		es := d.Size()
		raw := make([]byte, 100*es)
		for i := range raw {
			raw[i] = byte(i*37+11) &^ 0x40 // the exponent's top bit clear: finite
		}
		for p := range 100 {
			b := slices.Clone(raw)
			b[p*es+es-1] |= 0x7F // E4M3's NaN with its byte, or the top of the exponent
			if es > 1 {
				b[p*es+es-2] |= 0x80 // the rest of bf16's and f32's exponent
			}
			if got, _ := FirstNonFinite(d, b); got != p {
				t.Fatalf("avx2 %v, %s: planted at %d, found at %d", useAVX2, d, p, got)
			}
		}
		if got, _ := FirstNonFinite(d, raw); got != -1 {
			t.Fatalf("avx2 %v, %s: a finite buffer reports element %d", useAVX2, d, got)
		}
	}
}

func fastScanAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 33))
	for _, d := range []safetensors.DType{safetensors.BF16, safetensors.F32, safetensors.F8E4M3} {
		for n := range 2000 {
			es := d.Size()
			raw := make([]byte, es*(n%67))
			for i := range raw {
				raw[i] = byte(r.Uint32())
			}
			if len(raw) > 0 && n%3 != 0 { // mostly finite: clear the exponent's top bit
				for i := 0; i < len(raw); i += es {
					raw[i+es-1] &^= 0x40
				}
			}
			want, _ := firstNonFiniteSlow(d, raw)
			got, _ := FirstNonFinite(d, raw)
			if got != want {
				t.Fatalf("%s %x: fast %d, slow %d", d, raw, got, want)
			}
		}
	}
}
