package kernels_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// dequantTwin is DequantFP8Rows on the CPU: the FP8 per-channel (or, per
// run of rowsPerScale rows, per-tensor) format's Dequantise, then
// numfmt.F32ToBF16.
func dequantTwin(t *testing.T, q []byte, rows, cols int, scale []byte, sd safetensors.DType, rowsPerScale int) []uint16 {
	t.Helper()
	f := make([]float32, rows*cols)
	if rowsPerScale == 1 {
		if err := weightfmt.FP8Channel(sd).Dequantise(q, rows, cols, scale, f); err != nil {
			t.Fatal(err)
		}
	} else {
		ss, n := sd.Size(), rowsPerScale*cols
		for g := range rows / rowsPerScale {
			if err := weightfmt.FP8Tensor(sd).Dequantise(q[g*n:(g+1)*n], rowsPerScale, cols, scale[g*ss:(g+1)*ss], f[g*n:(g+1)*n]); err != nil {
				t.Fatal(err)
			}
		}
	}
	out := make([]uint16, len(f))
	for i, v := range f {
		out[i] = numfmt.F32ToBF16(v)
	}
	return out
}

// dequantScales encodes f32 scale values as sd (f32 values chosen to be
// exact in bf16 and f16 where the test needs it; others round).
func dequantScales(v []float32, sd safetensors.DType) []byte {
	b := make([]byte, len(v)*sd.Size())
	for i, x := range v {
		switch sd {
		case safetensors.F32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		case safetensors.BF16:
			binary.LittleEndian.PutUint16(b[2*i:], numfmt.F32ToBF16(x))
		case safetensors.F16:
			binary.LittleEndian.PutUint16(b[2*i:], f32ToF16(x))
		}
	}
	return b
}

// f32ToF16 truncates to f16 (the test only needs some f16 values,
// subnormal and normal, not a rounding rule).
func f32ToF16(x float32) uint16 {
	u := math.Float32bits(x)
	sign := uint16(u>>16) & 0x8000
	e := int(u>>23&0xff) - 127
	switch {
	case x != x:
		return sign | 0x7e00
	case e > 15:
		return sign | 0x7c00
	case e < -24:
		return sign
	case e < -14:
		return sign | uint16(((u&0x7fffff)|0x800000)>>uint(-e-14+13))
	}
	return sign | uint16(e+15)<<10 | uint16(u>>13&0x3ff)
}

// TestDequantFP8Rows checks moe_dequant_fp8_rows against its CPU twin bit
// for bit: every e4m3 code (zeros, -0, subnormals, +-448, the NaN codes
// 0x7f and 0xff, which must come out NaN) times scales of every dtype
// that give bf16 ties, subnormal and overflowing products, on whole
// (cols % 8 == 0, several blocks a row) and ragged rows, per channel, per
// tensor and per half of a fused gate-up stack, whole and from a first
// row in the middle of a run.
func TestDequantFP8Rows(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(29, 30))
	cases := []struct{ rows, cols, rowsPerScale int }{
		{37, 1000, 1}, {12, 4104, 1}, {5, 7, 1}, {9, 2053, 1}, // per channel
		{6, 96, 6}, {3, 13, 3}, // per tensor
		{8, 64, 4}, {12, 2056, 3}, // per tensor, gate-up stacks [E, 2, 1]
	}
	for _, sd := range []safetensors.DType{safetensors.F32, safetensors.BF16, safetensors.F16} {
		dsd, err := kernels.DequantScaleOf(sd)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/%dx%d/%d", sd, c.rows, c.cols, c.rowsPerScale), func(t *testing.T) {
				rows, cols := c.rows, c.cols
				q := make([]byte, rows*cols)
				for i := range q {
					q[i] = byte(r.IntN(256))
				}
				for i := range min(cols, 256) {
					q[i] = byte(i) // row 0: every code
				}
				q[cols-1], q[len(q)-1] = 0x7f, 0xff
				ns := rows / c.rowsPerScale
				sv := make([]float32, ns)
				special := []float32{
					1 + 1.0/256,                 // a tie: 1.0 * s lies halfway between two bf16 values
					1 + 3.0/256,                 // a tie the other way
					float32(math.Ldexp(1, -14)), // with f32 scales: subnormal f32 products (e4m3 2^-9 * 2^-14 is normal; F16 subnormal scales below)
					float32(math.Ldexp(1, -20)),
					-0.0,
					0,
					65504,      // f16 max: 448 * 65504 is finite in bf16
					1.5e36,     // f32 and bf16: the products overflow bf16 to inf
					-3.0 / 128, // negative
				}
				for i := range sv {
					sv[i] = float32(math.Ldexp(r.Float64()+0.5, r.IntN(20)-14))
					if i < len(special) {
						sv[i] = special[i]
					}
				}
				if sd == safetensors.F32 && ns > 2 {
					sv[2] = float32(math.Ldexp(1.375, -135)) // f32 subnormal products
				}
				if sd == safetensors.F32 && ns > 3 {
					sv[3] = math.Float32frombits(0x3f808000) // 1 + 2^-8 exactly, ties at every code
				}
				sb := dequantScales(sv, sd)
				want := dequantTwin(t, q, rows, cols, sb, sd, c.rowsPerScale)

				dq := toDevice(t, dev, q)
				ds := toDevice(t, dev, sb)
				out := toDevice(t, dev, make([]uint16, rows*cols))
				if err := kernels.DequantFP8Rows(dev, 0, kernels.FP8Mat(dq), rows, cols, ds.Ptr(), ns, dsd, c.rowsPerScale, 0, kernels.BF16Mat(out)); err != nil {
					t.Fatal(err)
				}
				// The loader decodes in row chunks: rows [split, rows) again,
				// from a first row that need not start a run of a scale.
				if split := rows/2 + 1; split < rows {
					n := (rows - split) * cols
					part := toDevice(t, dev, make([]uint16, n))
					qm := kernels.Mat{DType: kernels.MatFP8, Ptr: dq.Ptr().Add(split * cols), Len: n}
					if err := kernels.DequantFP8Rows(dev, 0, qm, rows-split, cols, ds.Ptr(), ns, dsd, c.rowsPerScale, split, kernels.BF16Mat(part)); err != nil {
						t.Fatal(err)
					}
					for i, v := range fromDevice(t, part) {
						w := want[split*cols+i]
						if v != w && !(numfmt.BF16ToF32(v) != numfmt.BF16ToF32(v) && numfmt.BF16ToF32(w) != numfmt.BF16ToF32(w)) {
							t.Fatalf("from row %d: [%d] got 0x%04x, want 0x%04x", split, split*cols+i, v, w)
						}
					}
				}
				got := fromDevice(t, out)
				bad, nans := 0, 0
				for i := range want {
					gw, gg := numfmt.BF16ToF32(want[i]), numfmt.BF16ToF32(got[i])
					if gw != gw || gg != gg {
						if gw != gw && gg != gg {
							nans++
							continue
						}
					} else if want[i] == got[i] {
						continue
					}
					if bad++; bad <= 5 {
						t.Errorf("[%d, %d] code 0x%02x scale %g: got 0x%04x, want 0x%04x", i/cols, i%cols, q[i], sv[i/cols/c.rowsPerScale], got[i], want[i])
					}
				}
				if bad > 0 {
					t.Fatalf("%d of %d values differ", bad, len(want))
				}
				if nans < 2 {
					t.Fatalf("only %d NaN outputs, want at least the two NaN codes planted", nans)
				}
			})
		}
	}
}

// TestDequantFP8RowsRefuses: shape and argument errors come back before
// any launch (no GPU needed).
func TestDequantFP8RowsRefuses(t *testing.T) {
	q := kernels.Mat{DType: kernels.MatFP8, Ptr: 0x1000, Len: 64}
	out := kernels.Mat{DType: kernels.MatBF16, Ptr: 0x2000, Len: 64}
	cases := []struct {
		name            string
		q, out          kernels.Mat
		rows, cols, rps int
		scale           cuda.DevicePtr
		scaleLen        int
		sd              kernels.DequantScale
		row0            int
		want            string
	}{
		{"zero rows", q, out, 0, 8, 1, 0x3000, 8, kernels.DequantScaleF32, 0, "bad dimensions"},
		{"negative first row", q, out, 8, 8, 1, 0x3000, 8, kernels.DequantScaleF32, -1, "first row"},
		{"too few scales", q, out, 8, 8, 1, 0x3000, 7, kernels.DequantScaleBF16, 0, "7 scales"},
		{"too few scales past row0", q, out, 4, 8, 2, 0x3000, 3, kernels.DequantScaleBF16, 4, "do not reach row 8"},
		{"null scale", q, out, 8, 8, 1, 0, 8, kernels.DequantScaleF16, 0, "null"},
		{"unknown scale type", q, out, 8, 8, 1, 0x3000, 8, 3, 0, "unknown scale type"},
		{"q too short", q, out, 8, 9, 1, 0x3000, 8, kernels.DequantScaleF32, 0, "dequant: q holds 64"},
		{"q not fp8", out, out, 8, 8, 1, 0x3000, 8, kernels.DequantScaleF32, 0, "dequant: q is"},
		{"out not bf16", q, q, 8, 8, 1, 0x3000, 8, kernels.DequantScaleF32, 0, "dequant: out is"},
	}
	for _, c := range cases {
		err := kernels.DequantFP8Rows(nil, 0, c.q, c.rows, c.cols, c.scale, c.scaleLen, c.sd, c.rps, c.row0, c.out)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
	if _, err := kernels.DequantScaleOf(safetensors.F8E4M3); err == nil {
		t.Error("DequantScaleOf(F8_E4M3) gave no error")
	}
}

// TestDequantFP8RowsTiming (MOEPREP_BENCH_DEQUANT=1) times the decode of
// 64 MiB of e4m3 (32768 x 2048, BF16 scales per row) to 128 MiB of bf16
// against device-to-device copies of the fp8 input's and the bf16
// output's bytes.
func TestDequantFP8RowsTiming(t *testing.T) {
	dev := benchDevice(t, "MOEPREP_BENCH_DEQUANT", "the FP8 decode")
	const rows, cols = 32768, 2048
	q, err := cuda.Alloc[uint8](dev, rows*cols)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Free()
	out, err := cuda.Alloc[uint16](dev, rows*cols)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Free()
	out2, err := cuda.Alloc[uint16](dev, rows*cols)
	if err != nil {
		t.Fatal(err)
	}
	defer out2.Free()
	sc := toDevice(t, dev, dequantScales(make([]float32, rows), safetensors.BF16))
	dq := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error {
		return kernels.DequantFP8RowsCtx(c, 0, kernels.FP8Mat(q), rows, cols, sc.Ptr(), rows, kernels.DequantScaleBF16, 1, 0, kernels.BF16Mat(out))
	})
	cp8 := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error { return c.CopyDtoD(out2.Ptr(), q.Ptr(), rows*cols) })
	cp16 := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error { return c.CopyDtoD(out2.Ptr(), out.Ptr(), 2*rows*cols) })
	gbs := func(bytes float64, us float64) float64 { return bytes / us / 1e3 }
	t.Logf("bench dequant %dx%d e4m3->bf16: %.1f us (%.0f GB/s read+write); DtoD copy of the fp8 bytes (64 MiB) %.1f us (%.0f GB/s), of the bf16 bytes (128 MiB) %.1f us (%.0f GB/s)",
		rows, cols, dq, gbs(3*rows*cols, dq), cp8, gbs(2*rows*cols, cp8), cp16, gbs(4*rows*cols, cp16))
}
