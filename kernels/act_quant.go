package kernels

import (
	"errors"
	"fmt"

	"github.com/moeprep/moeprep/internal/cuda"
)

// ActQuantGroup is the width of an activation quantisation group of the
// w8a8 mode (moe.ActGroup): 128 consecutive channels of one row share
// one f32 scale, the K extent of the weights' scale blocks.
const ActQuantGroup = 128

// actQuantThreads is AQ_THREADS in act_quant.cu: 8 warps a block, one warp
// per (row, group).
const actQuantThreads = 256

// QuantScratch is the w8a8 mode's device room for a quantised activation:
// Codes [rows, cols] e4m3 and Scales [rows, ceil(cols/128)] f32. One
// scratch serves both stages of a layer (stage 1 quantises x [T, H],
// stage 2 the intermediate [T*K, I], one after the other on one stream).
type QuantScratch struct {
	Codes  *cuda.Buffer[uint8]
	Scales *cuda.Buffer[float32]
}

// quantScratchLens are the codes and scales a layer's scratch holds: the
// larger of stage 1's input x [t, h] and stage 2's [t*topk, i].
func quantScratchLens(t, topk, h, i int) (codes, scales int) {
	return max(t*h, t*topk*i), max(t*CeilDiv(h, ActQuantGroup), t*topk*CeilDiv(i, ActQuantGroup))
}

// QuantScratchBytes is the device memory NewQuantScratch takes.
func QuantScratchBytes(t, topk, h, i int) int64 {
	codes, scales := quantScratchLens(t, topk, h, i)
	return int64(codes) + 4*int64(scales)
}

// NewQuantScratch allocates room for both stages of a layer of t tokens,
// topk slots a token, hidden size h and expert intermediate size i.
func NewQuantScratch(dev *cuda.Device, t, topk, h, i int) (*QuantScratch, error) {
	if !dimsOK(t, topk, h, i) {
		return nil, fmt.Errorf("quant scratch: bad dimensions %d x %d, %d, %d", t, topk, h, i)
	}
	codes, scales := quantScratchLens(t, topk, h, i)
	q := &QuantScratch{}
	var err error
	if q.Codes, err = cuda.Alloc[uint8](dev, codes); err != nil {
		return nil, fmt.Errorf("quant scratch: %w", err)
	}
	if q.Scales, err = cuda.Alloc[float32](dev, scales); err != nil {
		q.Free()
		return nil, fmt.Errorf("quant scratch: %w", err)
	}
	return q, nil
}

// Free releases the two buffers.
func (q *QuantScratch) Free() error {
	if q == nil {
		return nil
	}
	var errs []error
	if q.Codes != nil {
		errs = append(errs, q.Codes.Free())
	}
	if q.Scales != nil {
		errs = append(errs, q.Scales.Free())
	}
	return errors.Join(errs...)
}

// fits reports an error unless q holds a [rows, cols] quantised matrix.
func (q *QuantScratch) fits(rows, cols int) error {
	switch {
	case q == nil || q.Codes == nil || q.Scales == nil:
		return fmt.Errorf("w8a8: no quantisation scratch (GEMMOptions.Quant)")
	case q.Codes.Len() < rows*cols || q.Scales.Len() < rows*CeilDiv(cols, ActQuantGroup):
		return fmt.Errorf("w8a8: quantisation scratch of %d codes and %d scales is smaller than %d x %d", q.Codes.Len(), q.Scales.Len(), rows, cols)
	}
	return nil
}

// ActQuantE4M3 queues moe_act_quant_e4m3 (act_quant.cu) on stream st:
// every row of the bf16 matrix x [rows, cols] is cut into groups of 128
// columns (the last may be shorter); each group gets the scale
// max(amax, 1e-10) / 448 in q.Scales [rows, ceil(cols/128)] and its e4m3
// codes x / scale (round to nearest even, saturating; NaN -> 0x7f) in
// q.Codes [rows, cols], bit for bit moe.QuantizeActGroups. A NaN in a
// group makes its scale NaN.
func ActQuantE4M3(dev *cuda.Device, st cuda.Stream, x Mat, rows, cols int, q *QuantScratch) error {
	if !dimsOK(rows, cols) {
		return fmt.Errorf("act quant: bad dimensions %d x %d", rows, cols)
	}
	if err := x.need("act quant: x", rows*cols, MatBF16); err != nil {
		return err
	}
	if err := q.fits(rows, cols); err != nil {
		return err
	}
	warps := rows * CeilDiv(cols, ActQuantGroup)
	blocks := CeilDiv(warps, actQuantThreads/32)
	if !dimsOK(blocks) {
		return fmt.Errorf("act quant: %d x %d is too large for one launch", rows, cols)
	}
	m, err := Load(dev, "act_quant")
	if err != nil {
		return err
	}
	return m.Launch("moe_act_quant_e4m3", Grid(blocks), Block(actQuantThreads), 0, st, x.Ptr, int32(rows), int32(cols), q.Codes, q.Scales)
}
