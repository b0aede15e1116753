package kernels

import (
	"fmt"
	"math"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// DequantScale is the element type of the scales DequantFP8Rows and
// Dequant4Rows' INT4 read (dequant.cu's scale_dtype).
type DequantScale int32

const (
	DequantScaleF32  DequantScale = 0
	DequantScaleBF16 DequantScale = 1
	DequantScaleF16  DequantScale = 2
	// DequantScaleE8M0 is an E8M0 byte (2^(e-127)), which only
	// DequantFP8Blocks reads (DeepSeek's x.scale).
	DequantScaleE8M0 DequantScale = 3
)

// DequantScaleOf is the DequantScale of a safetensors scale dtype.
func DequantScaleOf(d safetensors.DType) (DequantScale, error) {
	switch d {
	case safetensors.F32:
		return DequantScaleF32, nil
	case safetensors.BF16:
		return DequantScaleBF16, nil
	case safetensors.F16:
		return DequantScaleF16, nil
	}
	return 0, fmt.Errorf("dequant: scale dtype %s (want F32, BF16 or F16)", d)
}

// dequantChunk is DQ_CHUNK in dequant.cu: the columns of one block.
const dequantChunk = 256 * 8

// DequantFP8Rows queues moe_dequant_fp8_rows (dequant.cu) on stream st:
// every element of the e4m3 matrix q [rows, cols] becomes bf16 in out
// [rows, cols] as bf16_rne(f32(q[r, c]) * scale[(row0 + r) / rowsPerScale]), one
// f32 multiply rounded to nearest: bit for bit the FP8 per-channel and
// per-tensor formats' Dequantise followed by numfmt.F32ToBF16 (NaN codes
// give NaN). scale holds rows / rowsPerScale values of type sd at scalePtr
// (rowsPerScale 1: one scale a row; a weight's row count: one a weight);
// q and out may be rows [row0, row0 + rows) of a larger matrix.
func DequantFP8Rows(dev *cuda.Device, st cuda.Stream, q Mat, rows, cols int, scalePtr cuda.DevicePtr, scaleLen int, sd DequantScale, rowsPerScale, row0 int, out Mat) error {
	if _, err := dequantBlocks(q, rows, cols, scalePtr, scaleLen, sd, rowsPerScale, row0, out); err != nil {
		return err
	}
	return dev.Do(func(c *cuda.Ctx) error {
		return DequantFP8RowsCtx(c, st, q, rows, cols, scalePtr, scaleLen, sd, rowsPerScale, row0, out)
	})
}

// DequantFP8RowsCtx is DequantFP8Rows on the device's goroutine (inside
// Device.Do, as the timing loops call it).
func DequantFP8RowsCtx(c *cuda.Ctx, st cuda.Stream, q Mat, rows, cols int, scalePtr cuda.DevicePtr, scaleLen int, sd DequantScale, rowsPerScale, row0 int, out Mat) error {
	blocks, err := dequantBlocks(q, rows, cols, scalePtr, scaleLen, sd, rowsPerScale, row0, out)
	if err != nil {
		return err
	}
	return launchDequant(c, st, "moe_dequant_fp8_rows", blocks, q.Ptr, int32(rows), int32(cols), scalePtr, int32(sd), int32(rowsPerScale), int64(row0), out.Ptr)
}

// launchDequant queues dequant.cu's kernel fn, 256 threads a block, on
// blocks blocks.
func launchDequant(c *cuda.Ctx, st cuda.Stream, fn string, blocks int, args ...any) error {
	m, err := LoadCtx(c, "dequant")
	if err != nil {
		return err
	}
	return m.LaunchCtx(c, fn, Grid(blocks), Block(256), 0, st, args...)
}

// dequantBlocks checks DequantFP8Rows' arguments and returns its grid.
func dequantBlocks(q Mat, rows, cols int, scalePtr cuda.DevicePtr, scaleLen int, sd DequantScale, rowsPerScale, row0 int, out Mat) (int, error) {
	switch {
	case !dimsOK(rows, cols, rowsPerScale) || rows > (1<<62)/cols:
		return 0, fmt.Errorf("dequant: bad dimensions %d x %d, %d rows a scale", rows, cols, rowsPerScale)
	case row0 < 0 || row0 > math.MaxInt32*rowsPerScale:
		return 0, fmt.Errorf("dequant: first row %d", row0)
	case sd != DequantScaleF32 && sd != DequantScaleBF16 && sd != DequantScaleF16:
		return 0, fmt.Errorf("dequant: unknown scale type %d", sd)
	case scalePtr == 0:
		return 0, fmt.Errorf("dequant: scale is a null device pointer")
	case int64(scaleLen)*int64(rowsPerScale) < int64(row0)+int64(rows):
		return 0, fmt.Errorf("dequant: %d scales of %d rows each do not reach row %d", scaleLen, rowsPerScale, row0+rows)
	}
	return fp8ToBF16Grid("dequant", q, out, rows, cols)
}

// FP8Blocks is a launch of moe_dequant_fp8_blocks (dequant.cu): Rows x
// Cols E4M3 codes, rows [Row0, Row0 + Rows) of a stack of weights of
// RowsPerWeight rows each, scaled per BlockRows x BlockCols block by the
// entries of their weight's grid [ceil(RowsPerWeight / BlockRows),
// ceil(Cols / BlockCols)]; the stack's grids lie one after the other at
// Scale (ScaleLen entries of type ScaleDType from the stack's first
// weight).
type FP8Blocks struct {
	Rows, Cols           int
	Scale                cuda.DevicePtr
	ScaleLen             int
	ScaleDType           DequantScale
	BlockRows, BlockCols int
	RowsPerWeight, Row0  int
}

// DequantBlockScaleOf is the DequantScale of an FP8 block scale dtype:
// DequantScaleOf's, and E8M0 (F8_E8M0, or its U8 bytes).
func DequantBlockScaleOf(d safetensors.DType) (DequantScale, error) {
	if d == safetensors.F8E8M0 || d == safetensors.U8 {
		return DequantScaleE8M0, nil
	}
	return DequantScaleOf(d)
}

// DequantFP8Blocks queues moe_dequant_fp8_blocks on stream st: every code
// of q becomes bf16 in out as bf16_rne(f32(e4m3) * scale), one f32
// multiply rounded to nearest by its block's scale widened exactly: bit
// for bit the FP8 block format's Dequantise (weightfmt.DequantE4M3)
// followed by numfmt.F32ToBF16, for blocks of any size.
func DequantFP8Blocks(dev *cuda.Device, st cuda.Stream, q Mat, p FP8Blocks, out Mat) error {
	if _, err := fp8BlocksGrid(q, p, out); err != nil {
		return err
	}
	return dev.Do(func(c *cuda.Ctx) error { return DequantFP8BlocksCtx(c, st, q, p, out) })
}

// DequantFP8BlocksCtx is DequantFP8Blocks on the device's goroutine.
func DequantFP8BlocksCtx(c *cuda.Ctx, st cuda.Stream, q Mat, p FP8Blocks, out Mat) error {
	blocks, err := fp8BlocksGrid(q, p, out)
	if err != nil {
		return err
	}
	return launchDequant(c, st, "moe_dequant_fp8_blocks", blocks, q.Ptr, int32(p.Rows), int32(p.Cols), p.Scale, int32(p.ScaleDType),
		int32(p.BlockRows), int32(p.BlockCols), int32(p.RowsPerWeight), int64(p.Row0), out.Ptr)
}

// fp8BlocksGrid checks DequantFP8Blocks' arguments (the scale entries the
// launch's last row reads must lie within ScaleLen) and returns its grid.
func fp8BlocksGrid(q Mat, p FP8Blocks, out Mat) (int, error) {
	switch {
	case !dimsOK(p.Rows, p.Cols, p.BlockRows, p.BlockCols, p.RowsPerWeight) || p.Rows > (1<<62)/p.Cols:
		return 0, fmt.Errorf("dequant fp8 blocks: bad dimensions %d x %d, blocks %d x %d, %d rows a weight", p.Rows, p.Cols, p.BlockRows, p.BlockCols, p.RowsPerWeight)
	case p.Row0 < 0 || p.Row0 > math.MaxInt64/2-p.Rows:
		return 0, fmt.Errorf("dequant fp8 blocks: first row %d", p.Row0)
	case p.ScaleDType < DequantScaleF32 || p.ScaleDType > DequantScaleE8M0:
		return 0, fmt.Errorf("dequant fp8 blocks: unknown scale type %d", p.ScaleDType)
	case p.Scale == 0:
		return 0, fmt.Errorf("dequant fp8 blocks: scale is a null device pointer")
	}
	// The entry of the last row's last block, in int64 (each factor is at
	// most MaxInt32, the grid of one weight below 2^62).
	gr, gc := int64(CeilDiv(p.RowsPerWeight, p.BlockRows)), int64(CeilDiv(p.Cols, p.BlockCols))
	last := int64(p.Row0) + int64(p.Rows) - 1
	w, rr := last/int64(p.RowsPerWeight), last%int64(p.RowsPerWeight)
	if w > math.MaxInt64/4/(gr*gc) {
		return 0, fmt.Errorf("dequant fp8 blocks: row %d is beyond any scale grid", last)
	}
	if need := (w*gr + rr/int64(p.BlockRows) + 1) * gc; int64(p.ScaleLen) < need {
		return 0, fmt.Errorf("dequant fp8 blocks: %d scales do not reach row %d (%d needed)", p.ScaleLen, last, need)
	}
	return fp8ToBF16Grid("dequant fp8 blocks", q, out, p.Rows, p.Cols)
}

// DequantMXFP8Rows queues moe_dequant_mxfp8_rows (dequant.cu) on stream
// st: every element of the e4m3 matrix q [rows, cols] becomes bf16 in out
// [rows, cols] as bf16_rne(f32(q[r, c]) * 2^(e - 127)), e the E8M0 byte
// scale[r * cols/32 + c/32] of the rows' scale grid at scalePtr
// (scaleBytes long): bit for bit weightfmt's MXFP8 Dequantise followed by
// numfmt.F32ToBF16 (NaN codes and the 0xff scale give NaN). cols must be
// a multiple of 32; q and out are the rows a loader's chunk holds, the
// grid their rows of it.
func DequantMXFP8Rows(dev *cuda.Device, st cuda.Stream, q Mat, rows, cols int, scalePtr cuda.DevicePtr, scaleBytes int, out Mat) error {
	if _, err := dequantMXFP8Blocks(q, rows, cols, scalePtr, scaleBytes, out); err != nil {
		return err
	}
	return dev.Do(func(c *cuda.Ctx) error { return DequantMXFP8RowsCtx(c, st, q, rows, cols, scalePtr, scaleBytes, out) })
}

// DequantMXFP8RowsCtx is DequantMXFP8Rows on the device's goroutine.
func DequantMXFP8RowsCtx(c *cuda.Ctx, st cuda.Stream, q Mat, rows, cols int, scalePtr cuda.DevicePtr, scaleBytes int, out Mat) error {
	blocks, err := dequantMXFP8Blocks(q, rows, cols, scalePtr, scaleBytes, out)
	if err != nil {
		return err
	}
	return launchDequant(c, st, "moe_dequant_mxfp8_rows", blocks, q.Ptr, int32(rows), int32(cols), scalePtr, out.Ptr)
}

// dequantMXFP8Blocks checks DequantMXFP8Rows' arguments and returns its
// grid: the kernel loads 8 codes and stores 8 bf16 values at once, so q
// must be 8-byte and out 16-byte aligned (whole rows of a multiple of 32
// columns keep them so).
func dequantMXFP8Blocks(q Mat, rows, cols int, scalePtr cuda.DevicePtr, scaleBytes int, out Mat) (int, error) {
	g := weightfmt.MXFP8Group
	switch {
	case !dimsOK(rows, cols) || rows > (1<<62)/cols:
		return 0, fmt.Errorf("dequant mxfp8: bad dimensions %d x %d", rows, cols)
	case cols%g != 0:
		return 0, fmt.Errorf("dequant mxfp8: %d columns are not whole groups of %d", cols, g)
	case scalePtr == 0:
		return 0, fmt.Errorf("dequant mxfp8: scale is a null device pointer")
	case scaleBytes < 0 || scaleBytes/(cols/g) < rows:
		return 0, fmt.Errorf("dequant mxfp8: %d scale bytes hold fewer than %d rows of %d scales", scaleBytes, rows, cols/g)
	case q.Ptr%8 != 0 || out.Ptr%16 != 0:
		return 0, fmt.Errorf("dequant mxfp8: q at %#x, out at %#x: want 8- and 16-byte aligned device pointers", q.Ptr, out.Ptr)
	}
	return fp8ToBF16Grid("dequant mxfp8", q, out, rows, cols)
}

// Packed4Kind is a 4-bit weight format Dequant4Rows decodes.
type Packed4Kind int32

const (
	// Packed4Int4 is compressed-tensors' symmetric pack-quantized INT4
	// (weightfmt.QuantInt4Pack): (u - 8) * scale, scales F32, BF16 or F16.
	Packed4Int4 Packed4Kind = iota + 1
	// Packed4MXFP4 is MXFP4 (weightfmt.QuantMXFP4): E2M1 times an E8M0
	// scale per 32 columns.
	Packed4MXFP4
	// Packed4NVFP4 is NVFP4 (weightfmt.QuantNVFP4ModelOpt, QuantNVFP4CT):
	// E2M1 times (an E4M3 scale per 16 columns times, or over, the
	// weight's F32 global scale).
	Packed4NVFP4
)

// packed4Names are the kinds' names, as dequant.cu's entry points
// moe_dequant_<name>_rows say them.
var packed4Names = [...]string{Packed4Int4: "int4", Packed4MXFP4: "mxfp4", Packed4NVFP4: "nvfp4"}

func (k Packed4Kind) String() string {
	if k > 0 && int(k) < len(packed4Names) {
		return packed4Names[k]
	}
	return fmt.Sprintf("packed4(%d)", int32(k))
}

// Packed4 is a 4-bit weight on the device for Dequant4Rows: Rows x Cols
// elements packed eight to a little-endian 32-bit word along each row
// (element 8j+k in bits 4k..4k+3 of word j: compressed-tensors' INT4 words
// and the FP4 bytes of MXFP4 and NVFP4, even element in the low nibble,
// are the same bits), CeilDiv(Cols, 8) words a row, and its scale grid of
// Rows x Cols/Group entries. Packed4Of fills the format's fields; the
// caller sets the rest.
type Packed4 struct {
	Kind Packed4Kind
	// Group is the columns one scale covers: INT4's group size (0: one
	// scale a row), 32 for MXFP4, 16 for NVFP4.
	Group int
	// ScaleType is INT4's scale dtype (MXFP4's E8M0 and NVFP4's E4M3
	// scales are one byte each).
	ScaleType DequantScale
	// GlobalDivides: the global scale divides (compressed-tensors' NVFP4
	// weight_global_scale), not multiplies (ModelOpt's weight_scale_2).
	GlobalDivides bool

	Rows, Cols int
	Q          cuda.DevicePtr // the packed rows, 4-byte aligned
	QBytes     int
	Scale      cuda.DevicePtr // the scale grid, aligned to its element
	ScaleBytes int
	// NVFP4 only: Global holds GlobalLen F32 per-tensor scales, one per
	// RowsPerGlobal rows, and the weight's rows are [Row0, Row0 + Rows) of
	// the stack they index (a loader's chunk of rows).
	Global                   cuda.DevicePtr
	GlobalLen, RowsPerGlobal int
	Row0                     int
}

// Packed4Of is how Dequant4Rows decodes weights stored as f (Kind, Group,
// ScaleType, GlobalDivides set); an error for a format it does not decode.
func Packed4Of(f weightfmt.Format) (Packed4, error) {
	if f == nil {
		return Packed4{}, fmt.Errorf("dequant: no weight format")
	}
	sc, scaled := f.Scale()
	elems, bytes := f.Packing()
	if !scaled || sc.Block[0] != 1 || elems != 2*bytes {
		return Packed4{}, fmt.Errorf("dequant: %s weights are not 4-bit with one scale row per weight row", f)
	}
	p := Packed4{Group: int(sc.Block[1])}
	g, global := weightfmt.GlobalOf(f)
	switch q := f.Quantization(); {
	case q == weightfmt.QuantInt4Pack && !global:
		st, err := DequantScaleOf(sc.DType)
		if err != nil {
			return Packed4{}, err
		}
		p.Kind, p.ScaleType = Packed4Int4, st
	case q == weightfmt.QuantMXFP4 && !global && p.Group == weightfmt.MXFP4Group && sc.DType.Size() == 1:
		p.Kind = Packed4MXFP4
	case (q == weightfmt.QuantNVFP4ModelOpt || q == weightfmt.QuantNVFP4CT) && global && g.DType == safetensors.F32 &&
		p.Group == weightfmt.NVFP4Group && sc.DType == safetensors.F8E4M3:
		p.Kind, p.GlobalDivides = Packed4NVFP4, g.Divides
	default:
		return Packed4{}, fmt.Errorf("dequant: %s weights (quantization %s, %s scales) have no device decode", f, q, sc.DType)
	}
	return p, nil
}

// Dequant4Rows queues the decode of p to bf16 in out [Rows, Cols] on
// stream st (dequant.cu's moe_dequant_{int4,mxfp4,nvfp4}_rows): bit for bit
// the format's Dequantise (or DequantiseGlobal) followed by
// numfmt.F32ToBF16 (NaN stays NaN). Every size, pointer and index is
// checked before the launch.
func Dequant4Rows(dev *cuda.Device, st cuda.Stream, p Packed4, out Mat) error {
	if _, err := dequant4Blocks(p, out); err != nil {
		return err
	}
	return dev.Do(func(c *cuda.Ctx) error { return Dequant4RowsCtx(c, st, p, out) })
}

// Dequant4RowsCtx is Dequant4Rows on the device's goroutine (inside
// Device.Do, as the timing loops call it).
func Dequant4RowsCtx(c *cuda.Ctx, st cuda.Stream, p Packed4, out Mat) error {
	blocks, err := dequant4Blocks(p, out)
	if err != nil {
		return err
	}
	args := []any{p.Q, int32(p.Rows), int32(p.Cols)}
	switch p.Kind {
	case Packed4Int4:
		args = append(args, int32(p.group()), p.Scale, int32(p.ScaleType))
	case Packed4MXFP4:
		args = append(args, p.Scale)
	case Packed4NVFP4:
		div := int32(0)
		if p.GlobalDivides {
			div = 1
		}
		args = append(args, p.Scale, p.Global, int32(p.RowsPerGlobal), int64(p.Row0), div)
	}
	return launchDequant(c, st, "moe_dequant_"+p.Kind.String()+"_rows", blocks, append(args, out.Ptr)...)
}

// group is the columns one scale covers (INT4's 0: the whole row).
func (p Packed4) group() int {
	if p.Group == 0 && p.Kind == Packed4Int4 {
		return p.Cols
	}
	return p.Group
}

// dequant4Blocks checks Dequant4Rows' arguments and returns its grid.
func dequant4Blocks(p Packed4, out Mat) (int, error) {
	ss := 1
	switch p.Kind {
	case Packed4Int4:
		switch p.ScaleType {
		case DequantScaleF32:
			ss = 4
		case DequantScaleBF16, DequantScaleF16:
			ss = 2
		default:
			return 0, fmt.Errorf("dequant int4: unknown scale type %d", p.ScaleType)
		}
	case Packed4MXFP4, Packed4NVFP4:
		want := weightfmt.MXFP4Group
		if p.Kind == Packed4NVFP4 {
			want = weightfmt.NVFP4Group
		}
		if p.Group != want {
			return 0, fmt.Errorf("dequant %s: groups of %d columns, want %d", p.Kind, p.Group, want)
		}
	default:
		return 0, fmt.Errorf("dequant: unknown 4-bit format %d", p.Kind)
	}
	g := p.group()
	words := CeilDiv(p.Cols, 8)
	switch {
	case !dimsOK(p.Rows, p.Cols) || p.Rows > (1<<60)/p.Cols:
		return 0, fmt.Errorf("dequant %s: bad dimensions %d x %d", p.Kind, p.Rows, p.Cols)
	case g <= 0 || p.Cols%g != 0:
		return 0, fmt.Errorf("dequant %s: %d columns are not whole groups of %d", p.Kind, p.Cols, p.Group)
	case p.Q == 0 || p.Q%4 != 0:
		return 0, fmt.Errorf("dequant %s: packed weight at %#x: want a 4-byte aligned device pointer", p.Kind, p.Q)
	case p.QBytes < 0 || p.QBytes/4/words < p.Rows:
		return 0, fmt.Errorf("dequant %s: %d packed bytes hold fewer than %d rows of %d words", p.Kind, p.QBytes, p.Rows, words)
	case p.Scale == 0 || int(p.Scale)%ss != 0:
		return 0, fmt.Errorf("dequant %s: scale at %#x: want a device pointer aligned to %d bytes", p.Kind, p.Scale, ss)
	case p.ScaleBytes < 0 || p.ScaleBytes/ss/(p.Cols/g) < p.Rows:
		return 0, fmt.Errorf("dequant %s: %d scale bytes hold fewer than %d rows of %d scales", p.Kind, p.ScaleBytes, p.Rows, p.Cols/g)
	case out.Ptr%2 != 0:
		return 0, fmt.Errorf("dequant %s: out at %#x is not 2-byte aligned", p.Kind, out.Ptr)
	}
	if p.Kind == Packed4NVFP4 {
		switch {
		case p.Global == 0 || p.Global%4 != 0:
			return 0, fmt.Errorf("dequant nvfp4: global scales at %#x: want a 4-byte aligned device pointer", p.Global)
		case !dimsOK(p.RowsPerGlobal, p.GlobalLen):
			return 0, fmt.Errorf("dequant nvfp4: %d global scales of %d rows each", p.GlobalLen, p.RowsPerGlobal)
		case p.Row0 < 0 || p.Row0 > math.MaxInt32*p.RowsPerGlobal:
			return 0, fmt.Errorf("dequant nvfp4: first row %d", p.Row0)
		case int64(p.GlobalLen)*int64(p.RowsPerGlobal) < int64(p.Row0)+int64(p.Rows):
			return 0, fmt.Errorf("dequant nvfp4: %d global scales of %d rows each do not reach row %d", p.GlobalLen, p.RowsPerGlobal, p.Row0+p.Rows)
		}
	} else if p.Global != 0 || p.GlobalDivides {
		return 0, fmt.Errorf("dequant %s: a global scale for a format that has none", p.Kind)
	}
	if err := out.need("dequant "+p.Kind.String()+": out", p.Rows*p.Cols, MatBF16); err != nil {
		return 0, err
	}
	blocks := p.Rows * CeilDiv(words, dequantChunk/8)
	if !dimsOK(blocks) {
		return 0, fmt.Errorf("dequant %s: %d x %d is too large for one launch", p.Kind, p.Rows, p.Cols)
	}
	return blocks, nil
}

// fp8ToBF16Grid checks that q holds rows x cols FP8 codes and out as many
// bf16 values, and returns the dequant kernels' grid: a block for each
// dequantChunk columns of a row. what names the kernel in an error.
func fp8ToBF16Grid(what string, q, out Mat, rows, cols int) (int, error) {
	if err := q.need(what+": q", rows*cols, MatFP8); err != nil {
		return 0, err
	}
	if err := out.need(what+": out", rows*cols, MatBF16); err != nil {
		return 0, err
	}
	blocks := rows * CeilDiv(cols, dequantChunk)
	if !dimsOK(blocks) {
		return 0, fmt.Errorf("%s: %d x %d is too large for one launch", what, rows, cols)
	}
	return blocks, nil
}
