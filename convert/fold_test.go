package convert

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"math/big"
	"math/rand"
	"testing"
	"testing/iotest"

	"github.com/moeprep/moeprep/safetensors"
)

// bigRound rounds x to p significant bits, nearest even (normal range only).
func bigRound(x float64, p uint) float64 {
	f, _ := new(big.Float).SetPrec(p).SetMode(big.ToNearestEven).SetFloat64(x).Float64()
	return f
}

func TestFoldRoundsOnceToNearestEven(t *testing.T) {
	rng := rand.New(rand.NewSource(9))
	factors := []float64{2.5, 16, 1.0 / 3, 0.7071067811865476, 2.827}
	for i := 0; i < 200000; i++ {
		f := factors[i%len(factors)]
		// bf16 inputs
		xb := float64(math.Float32frombits(uint32(BF16FromFloat32(float32(rng.NormFloat64()*math.Pow(2, float64(rng.Intn(40)-20))))) << 16))
		// bigRound knows no subnormals: compare in the normal range (subnormals below)
		if got, want := FoldValue(xb, f, safetensors.BF16), bigRound(xb*f, 8); got != want && math.Abs(want) >= 0x1p-126 {
			t.Fatalf("bf16 fold %v*%v = %v, want %v", xb, f, got, want)
		}
		xh := F16ToFloat64(F16FromFloat32(float32(rng.NormFloat64() * math.Pow(2, float64(rng.Intn(16)-8)))))
		if got, want := FoldValue(xh, f, safetensors.F16), bigRound(xh*f, 11); got != want && math.Abs(want) >= 0x1p-14 {
			t.Fatalf("f16 fold %v*%v = %v, want %v", xh, f, got, want)
		}
	}
	// ties: values whose product lies exactly half way between two bf16 numbers
	for _, tc := range []struct{ x, f, want float64 }{
		{1 + 1.0/128, 1.5, bigRound((1+1.0/128)*1.5, 8)},
		{257.0 / 256 * 2, 1, 2}, // not representable input rounds to even
	} {
		if got := FoldValue(tc.x, tc.f, safetensors.BF16); got != tc.want {
			t.Errorf("FoldValue(%v, %v) = %v, want %v", tc.x, tc.f, got, tc.want)
		}
	}
	// range ends
	if got := FoldValue(3e38, 2.5, safetensors.BF16); !math.IsInf(got, 1) {
		t.Errorf("bf16 overflow gave %v, want +Inf", got)
	}
	if got := FoldValue(60000, 2.5, safetensors.F16); !math.IsInf(got, 1) {
		t.Errorf("f16 overflow gave %v, want +Inf", got)
	}
	tiny := math.Ldexp(1, -24) // smallest f16 subnormal
	if got := FoldValue(tiny, 2.5, safetensors.F16); got != 2*tiny {
		t.Errorf("f16 subnormal 2^-24*2.5 = %v, want %v (tie to even)", got, 2*tiny)
	}
	if got := FoldValue(3*tiny, 2.5, safetensors.F16); got != 8*tiny {
		t.Errorf("f16 subnormal 3*2^-24*2.5 = %v, want %v (7.5 ties to 8)", got, 8*tiny)
	}
}

func TestF16Conversions(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		x := F16ToFloat64(uint16(h))
		if math.IsNaN(x) {
			continue
		}
		if back := F16FromFloat32(float32(x)); back != uint16(h) {
			t.Fatalf("f16 %#04x -> %v -> %#04x", h, x, back)
		}
	}
}

func TestFoldReaderAnyChunking(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	src := make([]byte, 4*1001)
	for i := 0; i < len(src); i += 4 {
		binary.LittleEndian.PutUint32(src[i:], math.Float32bits(float32(rng.Float64())))
	}
	want := append([]byte(nil), src...)
	foldInPlace(want, safetensors.F32, 2.5)
	for _, chunk := range []int{1, 3, 4, 7, 4096} {
		st := &foldStats{}
		fr, err := newFoldReader(iotest.HalfReader(bytes.NewReader(src)), safetensors.F32, 2.5, st)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		buf := make([]byte, chunk)
		for {
			n, err := fr.Read(buf)
			out.Write(buf[:n])
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(out.Bytes(), want) {
			t.Errorf("chunk %d: folded stream differs", chunk)
		}
	}
	// a stream that ends inside an element is an error, not a short tensor
	fr, _ := newFoldReader(bytes.NewReader(src[:6]), safetensors.F32, 2.5, &foldStats{})
	if _, err := io.ReadAll(fr); err == nil {
		t.Error("truncated element accepted")
	}
}

func TestStridedReaderColumns(t *testing.T) {
	// a 5x12-byte matrix; take byte columns 4..8 of each row
	m := make([]byte, 60)
	for i := range m {
		m[i] = byte(i)
	}
	r := region{src: bytes.NewReader(m), file: "f", tensor: "t", off: 4, rows: 5, rowLen: 4, stride: 12}
	for _, chunk := range []int{1, 3, 4, 100} {
		rd := r.open()
		var out bytes.Buffer
		buf := make([]byte, chunk)
		for {
			n, err := rd.Read(buf)
			out.Write(buf[:n])
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if want := colsOf(m, 5, 12, 4, 4); !bytes.Equal(out.Bytes(), want) {
			t.Errorf("chunk %d: got %v want %v", chunk, out.Bytes(), want)
		}
	}
	short := region{src: bytes.NewReader(m[:50]), file: "f", tensor: "t", off: 4, rows: 5, rowLen: 4, stride: 12}
	if _, err := io.ReadAll(short.open()); err == nil {
		t.Error("short source accepted")
	}
}
