package gpurun

import (
	"fmt"
	"math"
	"time"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/validate/tensorload"
	"github.com/moeprep/moeprep/weightfmt"
)

// DecodesOnDevice reports whether expert weights of format f reach the GPU
// kernels as bf16 decoded on the device: FP8 with one scale per output row
// or one per weight (kernels.DequantFP8Rows), MXFP8 (kernels.DequantMXFP8Rows),
// FP8 in blocks other than the FP8 GEMM's 128x128 (kernels.DequantFP8Blocks:
// DeepSeek-V4.1's 32x32), and the 4-bit formats kernels.Dequant4Rows
// decodes (pack-quantized INT4, MXFP4, NVFP4). The
// bf16 grouped GEMM then runs them, so only the bf16 precision compares
// them (the decode rounds each weight to bf16 once).
func DecodesOnDevice(f weightfmt.Format) bool {
	if f == nil {
		return false
	}
	if q := f.Quantization(); q == weightfmt.QuantFP8Channel || q == weightfmt.QuantFP8Tensor || q == weightfmt.QuantMXFP8 {
		return true
	}
	if sc, scaled := f.Scale(); scaled && f.Quantization() == weightfmt.QuantFP8Block {
		// 128x128 blocks run through the FP8 GEMM as stored (KernelsTake).
		return sc.Block != [2]int64{kernels.FP8ScaleBlock, kernels.FP8ScaleBlock}
	}
	_, err := kernels.Packed4Of(f)
	return err == nil
}

// dequantScratch is a stager's device room for weights decoded on the
// device: one staging chunk of packed weight rows, their scales (a whole
// weight's for FP8, whose scales are one a row or one a weight; the
// chunk's rows of the grid for the 4-bit formats) and a weight's global
// scales (NVFP4). Each grows to what is asked (codes at most
// StageChunkBytes) and lives until the stager is freed.
type dequantScratch struct {
	codes, scales, global *cuda.Buffer[uint8]
	// chunk, when > 0, is the bytes of packed rows one decode takes
	// instead of StageChunkBytes (tests: several chunks a weight).
	chunk int64
}

func (d *dequantScratch) free() {
	for _, b := range []**cuda.Buffer[uint8]{&d.codes, &d.scales, &d.global} {
		if *b != nil {
			(*b).Free()
			*b = nil
		}
	}
}

// ensure makes *b hold at least n bytes. A buffer too small is freed only
// after s's stream has drained, since queued decodes may still read it.
func (s *Stager) ensure(b **cuda.Buffer[uint8], n int) error {
	if *b != nil && (*b).Len() >= n {
		return nil
	}
	if *b != nil {
		if err := s.wait(); err != nil {
			return err
		}
		(*b).Free()
		*b = nil
	}
	buf, err := cuda.Alloc[uint8](s.dev, n)
	if err != nil {
		return fmt.Errorf("dequant scratch: %w", err)
	}
	*b = buf
	return nil
}

// uploadDecoded queues, for each part, its weight, scales and global
// scales and the weight's decode to bf16 on the device (wf is how they are
// stored: a format DecodesOnDevice takes).
func (b *Bank) uploadDecoded(s *Stager, src tensorload.TensorSource, parts []bankPart, wf weightfmt.Format) error {
	for _, p := range parts {
		m, err := b.decodedWeight(s, src, p, wf)
		if err != nil {
			return err
		}
		*p.mat = m
	}
	return nil
}

// decodedWeight allocates the bank's bf16 copy of p's weight (stored as
// wf) and queues on s's stream the uploads and decodes that fill it: per
// chunk of whole rows of at most StageChunkBytes of packed weight, the
// chunk's bytes into the code scratch, then its decode into the bank. FP8
// uploads its scale tensor (one a row, or one a weight) whole first; the
// 4-bit formats upload each chunk's rows of their scale grid with it (the
// grid has one row per weight row) and NVFP4 its global scales whole first
// (one per weight of the stack). Copies and decodes share one stream, so a
// chunk overwrites the scratch only after the decode before it has read
// it; device memory beyond the bank is one chunk, its scales and the
// global scales.
func (b *Bank) decodedWeight(s *Stager, src tensorload.TensorSource, p bankPart, wf weightfmt.Format) (kernels.Mat, error) {
	d, err := b.decodeSetup(s, src, p, wf, false)
	if err != nil {
		return kernels.Mat{}, err
	}
	if s.rec != nil {
		// The chunks' time is the weight's; a 4-bit grid's bytes come
		// with them.
		defer s.rec.add(d.t, false, d.t.NumElements()*int64(d.t.DType.Size()), time.Now())
		if !d.fp8 {
			defer s.rec.add(d.ts, false, d.ts.NumElements()*int64(d.ts.DType.Size()), time.Now())
		}
	}
	if err := d.decodeRows(s, 0, d.rows); err != nil {
		return kernels.Mat{}, err
	}
	return d.mat, nil
}

// decodedPart is a weight of a bank decoded on the device, set up: its
// bf16 bank copy allocated, its rows ready to decode a chunk at a time.
type decodedPart struct {
	t, ts                     *checkpoint.Tensor
	mat                       kernels.Mat
	rows, cols, stored, chunk int64
	fp8                       bool
	decode                    chunkDecode
	// perExpert are the tensors of whole-weight scales (FP8's scales,
	// NVFP4's global scales) and their device room, when the setup left
	// their upload to expertScales (ordered loading).
	perExpert []scaleUpload
}

// scaleUpload is a scale tensor whose entries go to dst, expert by expert.
type scaleUpload struct {
	t   *checkpoint.Tensor
	dst *cuda.Buffer[uint8]
}

// decodeSetup checks p's weight and scales, allocates its bf16 copy in
// the bank and returns its decoder. With own, the whole-weight scales get
// device room of their own, filled expert by expert (expertScales),
// instead of the stager's scratch filled now.
func (b *Bank) decodeSetup(s *Stager, src tensorload.TensorSource, p bankPart, wf weightfmt.Format, own bool) (*decodedPart, error) {
	t, err := tensorShaped(src, p.name, p.shape)
	if err != nil {
		return nil, err
	}
	if t.DType != wf.DType() {
		return nil, fmt.Errorf("%s: tensor %s is %s, the %s format stores %s", t.File, p.name, t.DType, wf, wf.DType())
	}
	if b.DType == 0 {
		b.DType = kernels.MatBF16
	} else if b.DType != kernels.MatBF16 {
		return nil, fmt.Errorf("%s: tensor %s is decoded to bf16, the bank's other weights are %v", t.File, p.name, b.DType)
	}
	sc, _ := wf.Scale()
	ts, err := tensorShaped(src, p.scaleName, p.scaleShape)
	if err != nil {
		return nil, err
	}
	if ts.DType != sc.DType {
		return nil, fmt.Errorf("%s: scale %s is %s, want %s", ts.File, p.scaleName, ts.DType, sc.DType)
	}
	es, ss := int64(t.DType.Size()), int64(sc.DType.Size())
	n, stored := t.NumElements(), int64(1)
	if len(p.shape) > 0 {
		stored = p.shape[len(p.shape)-1]
	}
	cols := p.cols
	if cols <= 0 || stored <= 0 || n <= 0 || n%stored != 0 || es <= 0 || ss <= 0 || n > math.MaxInt/8/es || stored*es > StageChunkBytes ||
		(weightfmt.Matrix{Format: wf, Rows: 1, Cols: cols}).RowBytes() != stored*es {
		return nil, fmt.Errorf("%s: tensor %s of shape %v (%d columns) cannot be decoded on the device", t.File, p.name, t.Shape, cols)
	}
	rows := n / stored
	if rows > math.MaxInt/2/cols {
		return nil, fmt.Errorf("%s: tensor %s of %d x %d is too large", t.File, p.name, rows, cols)
	}
	rowBytes := stored * es
	buf, err := cuda.Alloc[uint8](s.dev, int(2*rows*cols))
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", p.name, err)
	}
	b.bytes = append(b.bytes, buf)
	b.Size += 2 * rows * cols
	d := &decodedPart{t: t, ts: ts, rows: rows, cols: cols, stored: stored,
		mat: kernels.Mat{DType: kernels.MatBF16, Ptr: buf.Ptr(), Len: int(rows * cols)}}
	d.chunk = max(1, min(s.dq.chunkBytes(), StageChunkBytes)/rowBytes)
	if err := s.ensure(&s.dq.codes, int(min(rows, d.chunk)*rowBytes)); err != nil {
		return nil, err
	}
	// room gives a whole-weight scale tensor its device room: the
	// stager's scratch, filled now, or (own) the bank's, filled per expert.
	room := func(scratch **cuda.Buffer[uint8], st *checkpoint.Tensor) (cuda.DevicePtr, error) {
		size := int(st.NumElements()) * st.DType.Size()
		if !own {
			if err := s.ensure(scratch, size); err != nil {
				return 0, err
			}
			return (*scratch).Ptr(), s.copyTensor((*scratch).Ptr(), st, false)
		}
		x, err := cuda.Alloc[uint8](s.dev, size)
		if err != nil {
			return 0, fmt.Errorf("tensor %s: %w", st.Name, err)
		}
		b.bytes = append(b.bytes, x)
		d.perExpert = append(d.perExpert, scaleUpload{st, x})
		return x.Ptr(), nil
	}
	q := wf.Quantization()
	d.fp8 = q == weightfmt.QuantFP8Channel || q == weightfmt.QuantFP8Tensor || q == weightfmt.QuantFP8Block
	switch {
	case q == weightfmt.QuantFP8Block:
		d.decode, err = s.fp8BlockDecoder(p, wf, ts, rows, cols, room)
	case d.fp8:
		d.decode, err = s.fp8Decoder(ts, rows, cols, room)
	case wf.Quantization() == weightfmt.QuantMXFP8:
		d.decode, err = s.mxfp8Decoder(p, wf, ts, rows, cols, d.chunk)
	default:
		d.decode, err = s.packed4Decoder(src, p, wf, ts, rows, cols, d.chunk, room)
	}
	if err != nil {
		return nil, err
	}
	return d, nil
}

// decodeRows queues the upload and decode of rows [r0, r1) of d, a chunk
// at a time.
func (d *decodedPart) decodeRows(s *Stager, r0, r1 int64) error {
	for ; r0 < r1; r0 += d.chunk {
		nr := min(d.chunk, r1-r0)
		if err := s.copyElems(s.dq.codes.Ptr(), d.t, r0*d.stored, (r0+nr)*d.stored, false); err != nil {
			return err
		}
		if err := d.decode(r0, nr, s.dq.codes.Ptr(), d.mat.Ptr.Add(int(2*r0*d.cols))); err != nil {
			return fmt.Errorf("tensor %s: %w", d.t.Name, err)
		}
	}
	return nil
}

// expertScales queues the upload of expert x's entries (of e) of every
// whole-weight scale tensor d left to it.
func (d *decodedPart) expertScales(s *Stager, x, e int64) error {
	for _, u := range d.perExpert {
		n := u.t.NumElements()
		if n%e != 0 {
			return fmt.Errorf("%s: scale %s holds %d entries for %d experts", u.t.File, u.t.Name, n, e)
		}
		per := n / e
		if err := s.copyElems(u.dst.Ptr().Add(int(x*per)*u.t.DType.Size()), u.t, x*per, (x+1)*per, false); err != nil {
			return err
		}
	}
	return nil
}

func (d *dequantScratch) chunkBytes() int64 {
	if d.chunk > 0 {
		return d.chunk
	}
	return StageChunkBytes
}

// chunkDecode queues the decode of rows [r0, r0+nr) of a weight, whose
// packed bytes the caller has just queued into q, into out.
type chunkDecode func(r0, nr int64, q, out cuda.DevicePtr) error

// fp8Chunk is a chunk of n FP8 codes at q and the n bf16 values at out
// that they decode to: what every FP8 decoder hands its kernel.
func fp8Chunk(q, out cuda.DevicePtr, n int64) (codes, bf16 kernels.Mat) {
	return kernels.Mat{DType: kernels.MatFP8, Ptr: q, Len: int(n)}, kernels.Mat{DType: kernels.MatBF16, Ptr: out, Len: int(n)}
}

// fp8Decoder puts FP8 scale tensor ts (one scale per row, or per run of
// rows: per tensor) of a rows x cols weight where room says, and returns
// the decode of a chunk of its rows.
func (s *Stager) fp8Decoder(ts *checkpoint.Tensor, rows, cols int64, room func(**cuda.Buffer[uint8], *checkpoint.Tensor) (cuda.DevicePtr, error)) (chunkDecode, error) {
	ns := ts.NumElements()
	if ns <= 0 || rows%ns != 0 || rows/ns > math.MaxInt32 {
		return nil, fmt.Errorf("%s: %d rows, the scale %s %d entries", ts.File, rows, ts.Name, ns)
	}
	dsd, err := kernels.DequantScaleOf(ts.DType)
	if err != nil {
		return nil, err
	}
	scales, err := room(&s.dq.scales, ts)
	if err != nil {
		return nil, err
	}
	return func(r0, nr int64, q, out cuda.DevicePtr) error {
		qm, om := fp8Chunk(q, out, nr*cols)
		return kernels.DequantFP8Rows(s.dev, s.stream, qm, int(nr), int(cols), scales, int(ns), dsd, int(rows/ns), int(r0), om)
	}, nil
}

// fp8BlockDecoder puts the scale grids ts of p, a rows x cols stack of FP8
// block weights (wf) of p.shape's second last dimension rows each, where
// room says (whole: a grid is a small fraction of its weight), and returns
// the decode of a chunk of its rows (kernels.DequantFP8Blocks). Each
// weight has its grid, or each half of a fused gate-up weight has its own
// (as convert writes them: [E, 2 * ceil(I / b), ceil(H / b)], which is
// ceil(2I / b) rows only where I is whole blocks): ts's second last
// dimension says which.
func (s *Stager) fp8BlockDecoder(p bankPart, wf weightfmt.Format, ts *checkpoint.Tensor, rows, cols int64, room func(**cuda.Buffer[uint8], *checkpoint.Tensor) (cuda.DevicePtr, error)) (chunkDecode, error) {
	sc, _ := wf.Scale()
	sd, err := kernels.DequantBlockScaleOf(ts.DType)
	if err != nil {
		return nil, err
	}
	perWeight := rows // one weight, or a stack's of p.shape [..., R, cols]
	if len(p.shape) >= 2 {
		perWeight = p.shape[len(p.shape)-2]
	}
	bo, bi := sc.Block[0], sc.Block[1]
	if perWeight <= 0 || rows%perWeight != 0 || perWeight > math.MaxInt32 || bo <= 0 || bi <= 0 || bo > math.MaxInt32 || bi > math.MaxInt32 || len(ts.Shape) < 2 {
		return nil, fmt.Errorf("%s: %s of %d rows in weights of %d, blocks %s, scale shape %v: cannot be decoded on the device", ts.File, p.name, rows, perWeight, blockEdge(sc.Block), ts.Shape)
	}
	gridRows := ts.Shape[len(ts.Shape)-2]
	perGrid := int64(0)
	for _, k := range []int64{1, 2} {
		if perWeight%k == 0 && (perWeight/k+bo-1)/bo*k == gridRows {
			perGrid = perWeight / k
			break
		}
	}
	if want := rows / perWeight * gridRows * ((cols + bi - 1) / bi); perGrid == 0 || ts.NumElements() != want {
		return nil, fmt.Errorf("%s: scale %s of shape %v does not grid %d weights of %d x %d in %s blocks",
			ts.File, ts.Name, ts.Shape, rows/perWeight, perWeight, cols, blockEdge(sc.Block))
	}
	scales, err := room(&s.dq.scales, ts)
	if err != nil {
		return nil, err
	}
	return func(r0, nr int64, q, out cuda.DevicePtr) error {
		qm, om := fp8Chunk(q, out, nr*cols)
		return kernels.DequantFP8Blocks(s.dev, s.stream, qm, kernels.FP8Blocks{Rows: int(nr), Cols: int(cols),
			Scale: scales, ScaleLen: int(ts.NumElements()), ScaleDType: sd, BlockRows: int(bo), BlockCols: int(bi),
			RowsPerWeight: int(perGrid), Row0: int(r0)}, om)
	}, nil
}

// mxfp8Decoder returns the decode of a chunk of the rows of p, a rows x
// cols MXFP8 weight (wf) whose E8M0 grid is ts: it queues the chunk's rows
// of the grid into the scale scratch (room for chunk rows), then
// kernels.DequantMXFP8Rows, as packed4Decoder does for the 4-bit grids.
func (s *Stager) mxfp8Decoder(p bankPart, wf weightfmt.Format, ts *checkpoint.Tensor, rows, cols, chunk int64) (chunkDecode, error) {
	_, gc := weightfmt.Matrix{Format: wf, Rows: 1, Cols: cols}.ScaleShape()
	if cols%weightfmt.MXFP8Group != 0 || ts.DType.Size() != 1 || ts.NumElements() != rows*gc {
		return nil, fmt.Errorf("%s: scale %s holds %d %s entries, want %d rows of %d bytes", ts.File, p.scaleName, ts.NumElements(), ts.DType, rows, gc)
	}
	if err := s.ensure(&s.dq.scales, int(min(rows, chunk)*gc)); err != nil {
		return nil, err
	}
	return func(r0, nr int64, q, out cuda.DevicePtr) error {
		if err := s.copyElems(s.dq.scales.Ptr(), ts, r0*gc, (r0+nr)*gc, false); err != nil {
			return err
		}
		qm, om := fp8Chunk(q, out, nr*cols)
		// The scratch as it is now: a later weight's setup may have grown it.
		return kernels.DequantMXFP8Rows(s.dev, s.stream, qm, int(nr), int(cols), s.dq.scales.Ptr(), s.dq.scales.Len(), om)
	}, nil
}

// packed4Decoder puts the global scales of p (stored as wf, a format
// kernels.Packed4Of takes) where wf has them where room says, and returns
// the decode of a chunk of its rows x cols weight's rows, which first
// queues the chunk's rows of scale grid ts into the scale scratch (room
// for chunk rows).
func (s *Stager) packed4Decoder(src tensorload.TensorSource, p bankPart, wf weightfmt.Format, ts *checkpoint.Tensor, rows, cols, chunk int64, room func(**cuda.Buffer[uint8], *checkpoint.Tensor) (cuda.DevicePtr, error)) (chunkDecode, error) {
	pk, err := kernels.Packed4Of(wf)
	if err != nil {
		return nil, err
	}
	_, gc := weightfmt.Matrix{Format: wf, Rows: 1, Cols: cols}.ScaleShape()
	ss := int64(ts.DType.Size())
	if ts.NumElements() != rows*gc {
		return nil, fmt.Errorf("%s: scale %s holds %d entries, want %d rows of %d", ts.File, p.scaleName, ts.NumElements(), rows, gc)
	}
	if err := s.ensure(&s.dq.scales, int(min(rows, chunk)*gc*ss)); err != nil {
		return nil, err
	}
	if g, ok := weightfmt.GlobalOf(wf); ok {
		gt, err := globalTensor(src, p)
		if err != nil {
			return nil, err
		}
		if gt.DType != g.DType {
			return nil, fmt.Errorf("%s: global scale %s is %s, want %s", gt.File, p.global, gt.DType, g.DType)
		}
		ng := gt.NumElements()
		if ng <= 0 || rows%ng != 0 || rows/ng > math.MaxInt32 || ng > math.MaxInt32 {
			return nil, fmt.Errorf("%s: %d rows, the global scale %s %d entries", gt.File, rows, p.global, ng)
		}
		global, err := room(&s.dq.global, gt)
		if err != nil {
			return nil, err
		}
		pk.Global, pk.GlobalLen, pk.RowsPerGlobal = global, int(ng), int(rows/ng)
	}
	pk.Cols = int(cols)
	return func(r0, nr int64, q, out cuda.DevicePtr) error {
		if err := s.copyElems(s.dq.scales.Ptr(), ts, r0*gc, (r0+nr)*gc, false); err != nil {
			return err
		}
		c := pk
		// The scratch as it is now: a later weight's setup may have grown it.
		c.Rows, c.Q, c.QBytes, c.Scale, c.ScaleBytes = int(nr), q, s.dq.codes.Len(), s.dq.scales.Ptr(), s.dq.scales.Len()
		if c.Global != 0 {
			c.Row0 = int(r0)
		}
		return kernels.Dequant4Rows(s.dev, s.stream, c, kernels.Mat{DType: kernels.MatBF16, Ptr: out, Len: int(nr * cols)})
	}, nil
}

// globalTensor is p's global scale tensor: of shape p.globalShape, or of
// one element when that is nil (one weight's scalar).
func globalTensor(src tensorload.TensorSource, p bankPart) (*checkpoint.Tensor, error) {
	if p.globalShape != nil {
		return tensorShaped(src, p.global, p.globalShape)
	}
	t, ok := src.Tensor(p.global)
	if p.global == "" || !ok {
		return nil, fmt.Errorf("the global scale tensor %q of %s is missing", p.global, p.name)
	}
	if t.NumElements() != 1 {
		return nil, fmt.Errorf("%s: global scale %s has shape %v, want one element", t.File, p.global, t.Shape)
	}
	return t, nil
}
