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

// sameBF16 fails t unless got is want bit for bit, a NaN matching any
// NaN (the device's payloads differ from Go's); what names element i. It
// returns how many NaNs matched.
func sameBF16(t *testing.T, got, want []uint16, what func(i int) string) int {
	t.Helper()
	isNaN := func(v uint16) bool { return v&0x7fff > 0x7f80 }
	if len(got) < len(want) {
		t.Fatalf("%d values, want %d", len(got), len(want))
	}
	bad, nans := 0, 0
	for i, w := range want {
		switch g := got[i]; {
		case isNaN(w) && isNaN(g):
			nans++
		case g != w:
			if bad++; bad <= 5 {
				t.Errorf("%s: got 0x%04x, want 0x%04x", what(i), g, w)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d values differ", bad, len(want))
	}
	return nans
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
					sameBF16(t, fromDevice(t, part), want[split*cols:], func(i int) string { return fmt.Sprintf("from row %d: [%d]", split, split*cols+i) })
				}
				nans := sameBF16(t, fromDevice(t, out), want, func(i int) string {
					return fmt.Sprintf("[%d, %d] code 0x%02x scale %g", i/cols, i%cols, q[i], sv[i/cols/c.rowsPerScale])
				})
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
	q, out, out2 := scratch[uint8](t, dev, rows*cols), scratch[uint16](t, dev, rows*cols), scratch[uint16](t, dev, rows*cols)
	sc := toDevice(t, dev, dequantScales(make([]float32, rows), safetensors.BF16))
	dq := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error {
		return kernels.DequantFP8RowsCtx(c, 0, kernels.FP8Mat(q), rows, cols, sc.Ptr(), rows, kernels.DequantScaleBF16, 1, 0, kernels.BF16Mat(out))
	})
	cp8 := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error { return c.CopyDtoD(out2.Ptr(), q.Ptr(), rows*cols) })
	cp16 := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error { return c.CopyDtoD(out2.Ptr(), out.Ptr(), 2*rows*cols) })
	t.Logf("bench dequant %dx%d e4m3->bf16: %.1f us (%.0f GB/s read+write); DtoD copy of the fp8 bytes (64 MiB) %.1f us (%.0f GB/s), of the bf16 bytes (128 MiB) %.1f us (%.0f GB/s)",
		rows, cols, dq, gbs(3*rows*cols, dq), cp8, gbs(2*rows*cols, cp8), cp16, gbs(4*rows*cols, cp16))
}

// dequant4Case is one 4-bit weight of TestDequant4Rows: format f, rows x
// cols, and for NVFP4 one global scale per rowsPerGlobal rows (a stack of
// experts, or of gate-up halves).
type dequant4Case struct {
	f             weightfmt.Format
	rows, cols    int
	rowsPerGlobal int
}

// dequant4Twin is Dequant4Rows on the CPU: the format's Dequantise (or
// DequantiseGlobal, per run of rowsPerGlobal rows with its global scale)
// over raw packed rows and their scale grid, then numfmt.F32ToBF16.
func dequant4Twin(t *testing.T, c dequant4Case, q, scale, global []byte) []uint16 {
	t.Helper()
	f := make([]float32, c.rows*c.cols)
	rb, sb := len(q)/c.rows, len(scale)/c.rows // bytes a row
	run := c.rows
	if global != nil {
		run = c.rowsPerGlobal
	}
	for r0 := 0; r0 < c.rows; r0 += run {
		var g []byte
		if global != nil {
			g = global[4*(r0/run) : 4*(r0/run)+4]
		}
		if err := weightfmt.DequantiseWeight(c.f, q[r0*rb:(r0+run)*rb], run, c.cols, scale[r0*sb:(r0+run)*sb], g, f[r0*c.cols:(r0+run)*c.cols]); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]uint16, len(f))
	for i, v := range f {
		out[i] = numfmt.F32ToBF16(v)
	}
	return out
}

// dequant4Cases: INT4 with every scale dtype, groups that hold whole words,
// one that splits them (12), one scale a row (group 0, ragged rows with a
// partial last word); MXFP4; NVFP4 of both producers, one global per
// weight, per expert of a stack and per half of a gate-up stack.
func dequant4Cases() []dequant4Case {
	var cs []dequant4Case
	for _, sd := range []safetensors.DType{safetensors.F32, safetensors.BF16, safetensors.F16} {
		for _, c := range []struct{ rows, cols, group int }{
			{37, 1024, 32}, {12, 4104, 8}, {8, 4224, 128}, {6, 96, 12}, {3, 40, 40}, {5, 7, 0}, {9, 2053, 0},
		} {
			cs = append(cs, dequant4Case{weightfmt.Int4Pack(int64(c.group), sd), c.rows, c.cols, 0})
		}
	}
	mx := weightfmt.MXFP4(weightfmt.NamingGptOss, safetensors.U8, safetensors.U8)
	for _, c := range [][2]int{{37, 1024}, {3, 32}, {9, 2080}} {
		cs = append(cs, dequant4Case{mx, c[0], c[1], 0})
	}
	for _, f := range []weightfmt.Format{weightfmt.NVFP4ModelOpt(), weightfmt.NVFP4CT()} {
		for _, c := range [][3]int{{37, 1024, 37}, {12, 2064, 4}, {8, 16, 2}} {
			cs = append(cs, dequant4Case{f, c[0], c[1], c[2]})
		}
	}
	return cs
}

// dequant4Inputs draws a case's packed rows (row 0: the bytes 0, 1, 2, ...,
// every nibble pair), its scale grid and its global scales (nil: none):
// INT4 scales of every dtype at ties, subnormal, zero, -0, Inf, huge and
// random magnitudes; every E8M0 and E4M3 scale code in order (0xff and
// 0x7f NaN; E8M0 0 the subnormal 2^-127); globals of 1, 1 + 2^-8 (ties),
// 2^-130 (subnormal block scales), 3e35 (products overflow) and random.
// The last scale is always a NaN, so every case checks NaN propagation.
func dequant4Inputs(r *rand.Rand, c dequant4Case, p kernels.Packed4) (q, scale, global []byte) {
	rb := 4 * kernels.CeilDiv(c.cols, 8)
	q = make([]byte, c.rows*rb)
	for i := range q {
		q[i] = byte(r.IntN(256))
	}
	for i := range min(rb, 256) {
		q[i] = byte(i)
	}
	g := p.Group
	if g == 0 {
		g = c.cols
	}
	n := c.rows * (c.cols / g)
	if p.Kind == kernels.Packed4Int4 {
		sd, _ := c.f.Scale()
		sv := make([]float32, n)
		special := []float32{1 + 1.0/256, 1 + 3.0/256, float32(math.Ldexp(1, -140)), 0, float32(math.Copysign(0, -1)),
			float32(math.Inf(1)), 1e38, -3.0 / 128, 65504}
		for i := range sv {
			sv[i] = float32(math.Ldexp(r.Float64()+0.5, r.IntN(24)-16))
			if i < len(special) {
				sv[i] = special[i]
			}
		}
		sv[n-1] = float32(math.NaN())
		return q, dequantScales(sv, sd.DType), nil
	}
	scale = make([]byte, n)
	for i := range scale {
		scale[i] = byte(i)
		if i >= 256 {
			scale[i] = byte(100 + r.IntN(50))
		}
	}
	if p.Kind == kernels.Packed4MXFP4 {
		scale[n-1] = 0xff
		return q, scale, nil
	}
	scale[n-1] = 0x7f
	gv := []float32{1, math.Float32frombits(0x3f808000), float32(math.Ldexp(1, -130)), 3e35}
	global = make([]byte, 4*(c.rows/c.rowsPerGlobal))
	for i := range len(global) / 4 {
		v := float32(math.Ldexp(r.Float64()+0.5, r.IntN(16)-8))
		if i < len(gv) {
			v = gv[i]
		}
		binary.LittleEndian.PutUint32(global[4*i:], math.Float32bits(v))
	}
	return q, scale, global
}

// TestDequant4Rows checks moe_dequant_{int4,mxfp4,nvfp4}_rows against
// their CPU twin bit for bit on dequant4Cases, whole and again from a first
// row in the middle (the loader's chunks: pointers into the packed rows
// and the scale grid, Row0 into the global scales), with the output
// poisoned so that an element left unwritten fails.
func TestDequant4Rows(t *testing.T) {
	dev := testDevice(t)
	r := rand.New(rand.NewPCG(29, 31))
	for _, c := range dequant4Cases() {
		sc, _ := c.f.Scale()
		t.Run(fmt.Sprintf("%s/%s/%dx%d/g%d", c.f.Quantization(), sc.DType, c.rows, c.cols, sc.Block[1]), func(t *testing.T) {
			p, err := kernels.Packed4Of(c.f)
			if err != nil {
				t.Fatal(err)
			}
			q, scale, global := dequant4Inputs(r, c, p)
			want := dequant4Twin(t, c, q, scale, global)
			dq, ds := toDevice(t, dev, q), toDevice(t, dev, scale)
			p.Rows, p.Cols, p.Q, p.QBytes, p.Scale, p.ScaleBytes = c.rows, c.cols, dq.Ptr(), len(q), ds.Ptr(), len(scale)
			if global != nil {
				dg := toDevice(t, dev, global)
				p.Global, p.GlobalLen, p.RowsPerGlobal = dg.Ptr(), len(global)/4, c.rowsPerGlobal
			}
			poison := make([]uint16, c.rows*c.cols)
			for i := range poison {
				poison[i] = 0x1234
			}
			out := toDevice(t, dev, poison)
			if err := kernels.Dequant4Rows(dev, 0, p, kernels.BF16Mat(out)); err != nil {
				t.Fatal(err)
			}
			nans := sameBF16(t, fromDevice(t, out), want, func(i int) string {
				row, col := i/c.cols, i%c.cols
				return fmt.Sprintf("[%d, %d] nibble %d", row, col, q[row*len(q)/c.rows+col/2]>>(4*(col%2))&15)
			})
			if nans == 0 {
				t.Fatal("no NaN output, want the planted NaN scale's")
			}
			split := c.rows/2 + 1
			rb, sb := len(q)/c.rows, len(scale)/c.rows
			part := toDevice(t, dev, poison[:(c.rows-split)*c.cols])
			pp := p
			pp.Rows, pp.Row0 = c.rows-split, split
			pp.Q, pp.QBytes = dq.Ptr().Add(split*rb), (c.rows-split)*rb
			pp.Scale, pp.ScaleBytes = ds.Ptr().Add(split*sb), (c.rows-split)*sb
			if global == nil {
				pp.Row0 = 0
			}
			if err := kernels.Dequant4Rows(dev, 0, pp, kernels.BF16Mat(part)); err != nil {
				t.Fatal(err)
			}
			sameBF16(t, fromDevice(t, part), want[split*c.cols:], func(i int) string { return fmt.Sprintf("from row %d: [%d]", split, split*c.cols+i) })
		})
	}
}

// TestPacked4Of: each 4-bit format maps to its decoder, group and scale
// type; other formats have none.
func TestPacked4Of(t *testing.T) {
	for _, c := range []struct {
		f    weightfmt.Format
		want kernels.Packed4
	}{
		{weightfmt.Int4Pack(32, safetensors.BF16), kernels.Packed4{Kind: kernels.Packed4Int4, Group: 32, ScaleType: kernels.DequantScaleBF16}},
		{weightfmt.Int4Pack(0, safetensors.F32), kernels.Packed4{Kind: kernels.Packed4Int4, ScaleType: kernels.DequantScaleF32}},
		{weightfmt.MXFP4(weightfmt.NamingGptOss, safetensors.U8, safetensors.U8), kernels.Packed4{Kind: kernels.Packed4MXFP4, Group: 32}},
		{weightfmt.MXFP4(weightfmt.NamingDeepSeek, safetensors.I8, safetensors.F8E8M0), kernels.Packed4{Kind: kernels.Packed4MXFP4, Group: 32}},
		{weightfmt.NVFP4ModelOpt(), kernels.Packed4{Kind: kernels.Packed4NVFP4, Group: 16}},
		{weightfmt.NVFP4CT(), kernels.Packed4{Kind: kernels.Packed4NVFP4, Group: 16, GlobalDivides: true}},
	} {
		if got, err := kernels.Packed4Of(c.f); err != nil || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v", c.f, got, err, c.want)
		}
	}
	for _, f := range []weightfmt.Format{weightfmt.FP8Channel(safetensors.BF16), weightfmt.FP8Tensor(safetensors.F32), weightfmt.Plain(safetensors.BF16), nil} {
		if _, err := kernels.Packed4Of(f); err == nil {
			t.Errorf("%v: no error", f)
		}
	}
}

// TestDequant4RowsRefuses: shape, pointer and argument errors come back
// before any launch (no GPU needed).
func TestDequant4RowsRefuses(t *testing.T) {
	base := kernels.Packed4{Kind: kernels.Packed4Int4, Group: 32, ScaleType: kernels.DequantScaleBF16,
		Rows: 8, Cols: 64, Q: 0x1000, QBytes: 8 * 8 * 4, Scale: 0x2000, ScaleBytes: 8 * 2 * 2}
	nv := kernels.Packed4{Kind: kernels.Packed4NVFP4, Group: 16, Rows: 8, Cols: 64, Q: 0x1000, QBytes: 8 * 8 * 4,
		Scale: 0x2000, ScaleBytes: 8 * 4, Global: 0x3000, GlobalLen: 2, RowsPerGlobal: 4}
	out := kernels.Mat{DType: kernels.MatBF16, Ptr: 0x4000, Len: 8 * 64}
	edit := func(p kernels.Packed4, f func(p *kernels.Packed4)) kernels.Packed4 { f(&p); return p }
	cases := []struct {
		name string
		p    kernels.Packed4
		out  kernels.Mat
		want string
	}{
		{"zero rows", edit(base, func(p *kernels.Packed4) { p.Rows = 0 }), out, "bad dimensions"},
		{"partial group", edit(base, func(p *kernels.Packed4) { p.Cols = 60 }), out, "not whole groups of 32"},
		{"unaligned q", edit(base, func(p *kernels.Packed4) { p.Q = 0x1002 }), out, "4-byte aligned"},
		{"q too short", edit(base, func(p *kernels.Packed4) { p.QBytes-- }), out, "fewer than 8 rows of 8 words"},
		{"null scale", edit(base, func(p *kernels.Packed4) { p.Scale = 0 }), out, "scale at 0x0"},
		{"unaligned f32 scale", edit(base, func(p *kernels.Packed4) { p.ScaleType, p.Scale, p.ScaleBytes = kernels.DequantScaleF32, 0x2002, 64 }), out, "aligned to 4"},
		{"scales too short", edit(base, func(p *kernels.Packed4) { p.ScaleBytes-- }), out, "fewer than 8 rows of 2 scales"},
		{"unknown scale type", edit(base, func(p *kernels.Packed4) { p.ScaleType = 3 }), out, "unknown scale type"},
		{"unknown format", edit(base, func(p *kernels.Packed4) { p.Kind = 0 }), out, "unknown 4-bit format"},
		{"int4 with a global scale", edit(base, func(p *kernels.Packed4) { p.Global = 0x3000 }), out, "a global scale for a format that has none"},
		{"mxfp4 groups of 16", edit(base, func(p *kernels.Packed4) { p.Kind, p.Group = kernels.Packed4MXFP4, 16 }), out, "groups of 16 columns, want 32"},
		{"nvfp4 without global scales", edit(nv, func(p *kernels.Packed4) { p.Global = 0 }), out, "global scales at 0x0"},
		{"nvfp4 globals short", edit(nv, func(p *kernels.Packed4) { p.Row0 = 1 }), out, "do not reach row 9"},
		{"nvfp4 negative first row", edit(nv, func(p *kernels.Packed4) { p.Row0 = -1 }), out, "first row -1"},
		{"nvfp4 zero rows a global", edit(nv, func(p *kernels.Packed4) { p.RowsPerGlobal = 0 }), out, "global scales of 0 rows"},
		{"out too short", base, kernels.Mat{DType: kernels.MatBF16, Ptr: 0x4000, Len: 8*64 - 1}, "holds 511 elements"},
		{"out not bf16", base, kernels.Mat{DType: kernels.MatF32, Ptr: 0x4000, Len: 8 * 64}, "out is"},
		{"out unaligned", base, kernels.Mat{DType: kernels.MatBF16, Ptr: 0x4001, Len: 8 * 64}, "not 2-byte aligned"},
	}
	for _, c := range cases {
		err := kernels.Dequant4Rows(nil, 0, c.p, c.out)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
}

// TestDequant4RowsTiming (MOEPREP_BENCH_DEQUANT=1) times the decode of
// 64 MiB of packed 4-bit weights (16384 x 8192, random bytes and finite
// random scales) to 256 MiB of bf16 in each format, against
// device-to-device copies of the packed input's and the bf16 output's
// bytes.
func TestDequant4RowsTiming(t *testing.T) {
	dev := benchDevice(t, "MOEPREP_BENCH_DEQUANT", "the 4-bit decodes")
	const rows, cols = 16384, 8192
	r := rand.New(rand.NewPCG(4, 8))
	rnd := func(n int, lo, span int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(lo + r.IntN(span))
		}
		return b
	}
	q := toDevice(t, dev, rnd(rows*cols/2, 0, 256))
	out, out2 := scratch[uint16](t, dev, rows*cols), scratch[uint16](t, dev, rows*cols)
	cpQ := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error { return c.CopyDtoD(out2.Ptr(), q.Ptr(), rows*cols/2) })
	cpOut := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error { return c.CopyDtoD(out2.Ptr(), out.Ptr(), 2*rows*cols) })
	t.Logf("bench dequant4 DtoD copy of the packed bytes (64 MiB) %.1f us (%.0f GB/s read+write), of the bf16 bytes (256 MiB) %.1f us (%.0f GB/s)",
		cpQ, gbs(rows*cols, cpQ), cpOut, gbs(4*rows*cols, cpOut))
	for _, f := range []weightfmt.Format{weightfmt.Int4Pack(32, safetensors.BF16), weightfmt.MXFP4(weightfmt.NamingGptOss, safetensors.U8, safetensors.U8), weightfmt.NVFP4ModelOpt()} {
		p, err := kernels.Packed4Of(f)
		if err != nil {
			t.Fatal(err)
		}
		var sb []byte
		switch p.Kind {
		case kernels.Packed4Int4:
			sb = dequantScales(randn(r, rows*cols/32, 0.01), safetensors.BF16)
		case kernels.Packed4MXFP4:
			sb = rnd(rows*cols/32, 110, 30)
		default:
			sb = rnd(rows*cols/16, 0x20, 0x50)
			g := toDevice(t, dev, []float32{0.003})
			p.Global, p.GlobalLen, p.RowsPerGlobal = g.Ptr(), 1, rows
		}
		s := toDevice(t, dev, sb)
		p.Rows, p.Cols, p.Q, p.QBytes, p.Scale, p.ScaleBytes = rows, cols, q.Ptr(), rows*cols/2, s.Ptr(), len(sb)
		us := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error { return kernels.Dequant4RowsCtx(c, 0, p, kernels.BF16Mat(out)) })
		moved := float64(rows*cols/2 + len(sb) + 2*rows*cols)
		t.Logf("bench dequant4 %s %dx%d (64 MiB packed + %d MiB scales -> 256 MiB bf16): %.1f us, packed input %.0f GB/s, %.0f GB/s read+write",
			p.Kind, rows, cols, len(sb)>>20, us, gbs(rows*cols/2, us), gbs(moved, us))
	}
}

// scratch is n elements of device memory (contents undefined), freed when
// the test ends.
func scratch[T cuda.Elem](t *testing.T, d *cuda.Device, n int) *cuda.Buffer[T] {
	t.Helper()
	b, err := cuda.Alloc[T](d, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}

// gbs is a rate in GB/s: bytes moved in us microseconds.
func gbs(bytes, us float64) float64 { return bytes / us / 1e3 }
