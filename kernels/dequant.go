package kernels

import (
	"fmt"
	"math"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/safetensors"
)

// DequantScale is the element type of the scales DequantFP8Rows reads
// (dequant.cu's scale_dtype).
type DequantScale int32

const (
	DequantScaleF32  DequantScale = 0
	DequantScaleBF16 DequantScale = 1
	DequantScaleF16  DequantScale = 2
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
	m, err := LoadCtx(c, "dequant")
	if err != nil {
		return err
	}
	return m.LaunchCtx(c, "moe_dequant_fp8_rows", Grid(blocks), Block(256), 0, st, q.Ptr, int32(rows), int32(cols), scalePtr, int32(sd), int32(rowsPerScale), int64(row0), out.Ptr)
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
	if err := q.need("dequant: q", rows*cols, MatFP8); err != nil {
		return 0, err
	}
	if err := out.need("dequant: out", rows*cols, MatBF16); err != nil {
		return 0, err
	}
	blocks := rows * CeilDiv(cols, dequantChunk)
	if !dimsOK(blocks) {
		return 0, fmt.Errorf("dequant: %d x %d is too large for one launch", rows, cols)
	}
	return blocks, nil
}
