package kernels_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
	"github.com/moeprep/moeprep/weightfmt/weightfmttest"
)

// gpuDecode decodes on the device rows [from, rows) of a stack of weights
// of format f, each runRows rows with its own per-tensor scale (FP8 per
// tensor) or global scale (NVFP4), to bf16: raw, scale and global are the
// whole stack's bytes, uploaded whole, and the launch takes pointers into
// them and a first row into the scale runs, as the loader's row chunks
// do. The output is poisoned first, so that an element left unwritten
// fails. It returns errors rather than failing a test, since the suite's
// Decoder runs it inside the suite's subtests.
func gpuDecode(dev *cuda.Device, f weightfmt.Format, rows, cols, runRows, from int, raw, scale, global []byte) ([]uint16, error) {
	n := rows - from
	poison := make([]uint16, n*cols)
	for i := range poison {
		poison[i] = 0x1234
	}
	var bufs []interface{ Free() error }
	defer func() {
		for _, b := range bufs {
			b.Free()
		}
	}()
	up := func(b []byte) (cuda.DevicePtr, error) {
		d, err := cuda.FromHost(dev, b)
		if err != nil {
			return 0, err
		}
		bufs = append(bufs, d)
		return d.Ptr(), nil
	}
	out, err := cuda.FromHost(dev, poison)
	if err != nil {
		return nil, err
	}
	bufs = append(bufs, out)
	dq, err := up(raw)
	if err != nil {
		return nil, err
	}
	ds, err := up(scale)
	if err != nil {
		return nil, err
	}
	rb, sb := len(raw)/rows, len(scale)/rows // bytes a row (per-tensor scales: unused)
	sc, _ := f.Scale()
	switch q := f.Quantization(); q {
	case weightfmt.QuantFP8Channel, weightfmt.QuantFP8Tensor:
		sd, err := kernels.DequantScaleOf(sc.DType)
		if err != nil {
			return nil, err
		}
		rowsPerScale := 1
		if q == weightfmt.QuantFP8Tensor {
			rowsPerScale = runRows
		}
		qm := kernels.Mat{DType: kernels.MatFP8, Ptr: dq.Add(from * rb), Len: n * cols}
		if err := kernels.DequantFP8Rows(dev, 0, qm, n, cols, ds, rows/rowsPerScale, sd, rowsPerScale, from, kernels.BF16Mat(out)); err != nil {
			return nil, err
		}
	case weightfmt.QuantFP8Block:
		// The whole stack's grids, each weight's runRows rows, as the
		// loader uploads a weight's scale tensor whole.
		sd, err := kernels.DequantBlockScaleOf(sc.DType)
		if err != nil {
			return nil, err
		}
		qm := kernels.Mat{DType: kernels.MatFP8, Ptr: dq.Add(from * rb), Len: n * cols}
		p := kernels.FP8Blocks{Rows: n, Cols: cols, Scale: ds, ScaleLen: len(scale) / sc.DType.Size(), ScaleDType: sd,
			BlockRows: int(sc.Block[0]), BlockCols: int(sc.Block[1]), RowsPerWeight: runRows, Row0: from}
		if err := kernels.DequantFP8Blocks(dev, 0, qm, p, kernels.BF16Mat(out)); err != nil {
			return nil, err
		}
	case weightfmt.QuantMXFP8:
		// The rows from `from` and their rows of the grid, as the loader's
		// chunks hand them over.
		qm := kernels.Mat{DType: kernels.MatFP8, Ptr: dq.Add(from * rb), Len: n * cols}
		if err := kernels.DequantMXFP8Rows(dev, 0, qm, n, cols, ds.Add(from*sb), n*sb, kernels.BF16Mat(out)); err != nil {
			return nil, err
		}
	default:
		p, err := kernels.Packed4Of(f)
		if err != nil {
			return nil, err
		}
		p.Rows, p.Cols = n, cols
		p.Q, p.QBytes = dq.Add(from*rb), n*rb
		p.Scale, p.ScaleBytes = ds.Add(from*sb), n*sb
		if global != nil {
			dg, err := up(global)
			if err != nil {
				return nil, err
			}
			p.Global, p.GlobalLen, p.RowsPerGlobal, p.Row0 = dg, len(global)/4, runRows, from
		}
		if err := kernels.Dequant4Rows(dev, 0, p, kernels.BF16Mat(out)); err != nil {
			return nil, err
		}
	}
	return out.ToHost(-1)
}

// gpuDecoder is the device decoders (DequantFP8Rows, Dequant4Rows) under
// the weight-decode conformance suite. Each weight is decoded whole, and
// again from a row in the middle, which must give the same bits: a
// difference is kept in chunks, which the test reports (the suite's
// Decoder has no test to fail).
type gpuDecoder struct {
	dev    *cuda.Device
	chunks *[]string
}

func (gpuDecoder) Output() safetensors.DType { return safetensors.BF16 }

func (d gpuDecoder) Decode(w weightfmttest.Weight) ([]float32, error) {
	whole, err := gpuDecode(d.dev, w.Format, w.Rows, w.Cols, w.Rows, 0, w.Raw, w.Scale, w.Global)
	if err != nil {
		return nil, err
	}
	if split := w.Rows/2 + 1; split < w.Rows {
		part, err := gpuDecode(d.dev, w.Format, w.Rows, w.Cols, w.Rows, split, w.Raw, w.Scale, w.Global)
		if err != nil {
			return nil, err
		}
		if i := diffBF16(part, whole[split*w.Cols:]); i >= 0 {
			*d.chunks = append(*d.chunks, fmt.Sprintf("%s %dx%d from row %d: [%d] is 0x%04x, decoded whole 0x%04x",
				w.Format, w.Rows, w.Cols, split, split*w.Cols+i, part[i], whole[split*w.Cols+i]))
		}
	}
	return widenBF16(whole), nil
}

// TestDequantConformance runs the weight-decode conformance suite on the
// device decoders: FP8 per channel and per tensor (DequantFP8Rows), FP8 in
// blocks of any size, F32 and E8M0 scales (DequantFP8Blocks), MXFP8
// (DequantMXFP8Rows), INT4, MXFP4 and NVFP4 (Dequant4Rows).
func TestDequantConformance(t *testing.T) {
	dev := testDevice(t)
	var chunks []string
	d := gpuDecoder{dev, &chunks}
	t.Run("fp8-scaled", func(t *testing.T) { weightfmttest.TestFP8Scaled(t, d) })
	t.Run("fp8-block", func(t *testing.T) { weightfmttest.TestFP8Block(t, d) })
	t.Run("int4-pack", func(t *testing.T) { weightfmttest.TestInt4Pack(t, d) })
	t.Run("mxfp4", func(t *testing.T) { weightfmttest.TestMXFP4(t, d) })
	t.Run("mxfp8", func(t *testing.T) { weightfmttest.TestMXFP8(t, d) })
	t.Run("nvfp4", func(t *testing.T) { weightfmttest.TestNVFP4(t, d) })
	for _, c := range chunks {
		t.Error("decoded from a middle row: " + c)
	}
}

// TestDequantStacksConformance: a loader decodes a stack of weights (the
// experts of a bank, or the two halves of a gate-up stack), each with its
// own per-tensor scale, in one launch. The suite's FP8 per-tensor, FP8
// block (each weight its own grid) and NVFP4 weights of one format and shape are stacked three at a time and
// decoded in one launch, and again from a row inside the second, to each
// weight's values.
func TestDequantStacksConformance(t *testing.T) {
	dev := testDevice(t)
	groups := map[string][]weightfmttest.Case{}
	var keys []string
	for _, c := range slices.Concat(weightfmttest.FP8ScaledCases(), weightfmttest.NVFP4Cases(), weightfmttest.FP8BlockCases()) {
		w := c.Weight
		q := w.Format.Quantization()
		if _, global := weightfmt.GlobalOf(w.Format); !global && q != weightfmt.QuantFP8Tensor && q != weightfmt.QuantFP8Block {
			continue
		}
		sc, _ := w.Format.Scale()
		key := fmt.Sprintf("%s/%s/%v/%dx%d", w.Format, sc.DType, sc.Block, w.Rows, w.Cols)
		if groups[key] == nil {
			keys = append(keys, key)
		}
		groups[key] = append(groups[key], c)
	}
	stacks := 0
	for _, key := range keys {
		cs := groups[key]
		for len(cs) >= 2 {
			stacks++
			stack := cs[:min(3, len(cs))]
			cs = cs[len(stack):]
			w0 := stack[0].Weight
			var raw, scale, global []byte
			for _, c := range stack {
				raw, scale, global = append(raw, c.Weight.Raw...), append(scale, c.Weight.Scale...), append(global, c.Weight.Global...)
			}
			if w0.Global == nil {
				global = nil
			}
			rows, n := len(stack)*w0.Rows, w0.Rows*w0.Cols
			t.Run(fmt.Sprintf("%s/%d", key, len(stack)), func(t *testing.T) {
				got, err := gpuDecode(dev, w0.Format, rows, w0.Cols, w0.Rows, 0, raw, scale, global)
				if err != nil {
					t.Fatal(err)
				}
				for k, c := range stack {
					weightfmttest.Check(t, c, safetensors.BF16, widenBF16(got[k*n:(k+1)*n]))
				}
				from := w0.Rows + w0.Rows/2
				part, err := gpuDecode(dev, w0.Format, rows, w0.Cols, w0.Rows, from, raw, scale, global)
				if err != nil {
					t.Fatal(err)
				}
				if i := diffBF16(part, got[from*w0.Cols:]); i >= 0 {
					t.Errorf("from row %d: [%d] is 0x%04x, decoded whole 0x%04x", from, from*w0.Cols+i, part[i], got[from*w0.Cols+i])
				}
			})
		}
	}
	if stacks == 0 {
		t.Fatal("the suite has no per-tensor weights of one shape to stack")
	}
}

// widenBF16 is bf16 values as float32.
func widenBF16(h []uint16) []float32 {
	v := make([]float32, len(h))
	for i, x := range h {
		v[i] = math.Float32frombits(uint32(x) << 16)
	}
	return v
}

// diffBF16 is the index of the first value of got that is not want bit
// for bit, a NaN matching any NaN (the device's payloads differ from
// Go's); -1 when none differs.
func diffBF16(got, want []uint16) int {
	isNaN := func(v uint16) bool { return v&0x7fff > 0x7f80 }
	if len(got) != len(want) {
		return min(len(got), len(want))
	}
	for i, w := range want {
		if g := got[i]; g != w && !(isNaN(w) && isNaN(g)) {
			return i
		}
	}
	return -1
}

// bf16Bytes encodes values as bf16 scales.
func bf16Bytes(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], numfmt.F32ToBF16(x))
	}
	return b
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
		testkit.ErrorContains(t, err, c.want, c.name)
	}
	if _, err := kernels.DequantScaleOf(safetensors.F8E4M3); err == nil {
		t.Error("DequantScaleOf(F8_E4M3) gave no error")
	}
}

// TestDequantFP8BlocksRefuses: shape, pointer and argument errors come
// back before any launch (no GPU needed); the scales needed are counted
// to the launch's last row's block. A stack of two weights of 40 x 64 in
// 32x32 blocks holds 2 * 2 * 2 scales.
func TestDequantFP8BlocksRefuses(t *testing.T) {
	q := kernels.Mat{DType: kernels.MatFP8, Ptr: 0x1000, Len: 80 * 64}
	out := kernels.Mat{DType: kernels.MatBF16, Ptr: 0x2000, Len: 80 * 64}
	ok := kernels.FP8Blocks{Rows: 80, Cols: 64, Scale: 0x3000, ScaleLen: 8, ScaleDType: kernels.DequantScaleE8M0,
		BlockRows: 32, BlockCols: 32, RowsPerWeight: 40}
	with := func(edit func(p *kernels.FP8Blocks)) kernels.FP8Blocks { p := ok; edit(&p); return p }
	cases := []struct {
		name   string
		q, out kernels.Mat
		p      kernels.FP8Blocks
		want   string
	}{
		{"zero block", q, out, with(func(p *kernels.FP8Blocks) { p.BlockCols = 0 }), "bad dimensions"},
		{"zero rows a weight", q, out, with(func(p *kernels.FP8Blocks) { p.RowsPerWeight = 0 }), "bad dimensions"},
		{"negative first row", q, out, with(func(p *kernels.FP8Blocks) { p.Row0 = -1 }), "first row"},
		{"one scale short", q, out, with(func(p *kernels.FP8Blocks) { p.ScaleLen = 7 }), "7 scales do not reach row 79 (8 needed)"},
		{"past the stack", q, out, with(func(p *kernels.FP8Blocks) { p.Rows, p.Row0 = 41, 40 }), "do not reach row 80 (10 needed)"},
		{"a second block row", q, out, with(func(p *kernels.FP8Blocks) { p.Rows, p.ScaleLen = 33, 3 }), "do not reach row 32 (4 needed)"},
		{"null scale", q, out, with(func(p *kernels.FP8Blocks) { p.Scale = 0 }), "null"},
		{"unknown scale type", q, out, with(func(p *kernels.FP8Blocks) { p.ScaleDType = 4 }), "unknown scale type"},
		{"q too short", q, out, with(func(p *kernels.FP8Blocks) { p.Cols, p.ScaleLen = 65, 12 }), "q holds"},
		{"out not bf16", q, q, ok, "out is"},
	}
	for _, c := range cases {
		err := kernels.DequantFP8Blocks(nil, 0, c.q, c.p, c.out)
		testkit.ErrorContains(t, err, c.want, c.name)
	}
	for _, d := range []safetensors.DType{safetensors.F8E8M0, safetensors.U8} {
		if sd, err := kernels.DequantBlockScaleOf(d); err != nil || sd != kernels.DequantScaleE8M0 {
			t.Errorf("DequantBlockScaleOf(%s) = %d, %v, want E8M0", d, sd, err)
		}
	}
	if _, err := kernels.DequantBlockScaleOf(safetensors.F8E4M3); err == nil {
		t.Error("DequantBlockScaleOf(F8_E4M3) gave no error")
	}
}

// TestDequantMXFP8RowsRefuses: shape, pointer and argument errors come
// back before any launch (no GPU needed).
func TestDequantMXFP8RowsRefuses(t *testing.T) {
	q := kernels.Mat{DType: kernels.MatFP8, Ptr: 0x1000, Len: 4 * 64}
	out := kernels.Mat{DType: kernels.MatBF16, Ptr: 0x2000, Len: 4 * 64}
	cases := []struct {
		name       string
		q, out     kernels.Mat
		rows, cols int
		scale      cuda.DevicePtr
		scaleBytes int
		want       string
	}{
		{"zero rows", q, out, 0, 64, 0x3000, 8, "bad dimensions"},
		{"partial group", q, out, 4, 48, 0x3000, 8, "not whole groups of 32"},
		{"null scale", q, out, 4, 64, 0, 8, "null"},
		{"too few scales", q, out, 4, 64, 0x3000, 7, "7 scale bytes hold fewer than 4 rows of 2"},
		{"q misaligned", kernels.Mat{DType: kernels.MatFP8, Ptr: 0x1004, Len: 256}, out, 4, 64, 0x3000, 8, "aligned"},
		{"out misaligned", q, kernels.Mat{DType: kernels.MatBF16, Ptr: 0x2008, Len: 256}, 4, 64, 0x3000, 8, "aligned"},
		{"q too short", q, out, 5, 64, 0x3000, 10, "dequant mxfp8: q holds 256"},
		{"q not fp8", out, out, 4, 64, 0x3000, 8, "dequant mxfp8: q is"},
		{"out not bf16", q, q, 4, 64, 0x3000, 8, "dequant mxfp8: out is"},
	}
	for _, c := range cases {
		err := kernels.DequantMXFP8Rows(nil, 0, c.q, c.rows, c.cols, c.scale, c.scaleBytes, c.out)
		testkit.ErrorContains(t, err, c.want, c.name)
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
	sc := toDevice(t, dev, bf16Bytes(make([]float32, rows)))
	dq := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error {
		return kernels.DequantFP8RowsCtx(c, 0, kernels.FP8Mat(q), rows, cols, sc.Ptr(), rows, kernels.DequantScaleBF16, 1, 0, kernels.BF16Mat(out))
	})
	cp8 := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error { return c.CopyDtoD(out2.Ptr(), q.Ptr(), rows*cols) })
	cp16 := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error { return c.CopyDtoD(out2.Ptr(), out.Ptr(), 2*rows*cols) })
	t.Logf("bench dequant %dx%d e4m3->bf16: %.1f us (%.0f GB/s read+write); DtoD copy of the fp8 bytes (64 MiB) %.1f us (%.0f GB/s), of the bf16 bytes (128 MiB) %.1f us (%.0f GB/s)",
		rows, cols, dq, gbs(3*rows*cols, dq), cp8, gbs(2*rows*cols, cp8), cp16, gbs(4*rows*cols, cp16))
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
		testkit.ErrorContains(t, err, c.want, c.name)
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
			sb = bf16Bytes(randn(r, rows*cols/32, 0.01))
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
