package weightfmt

import (
	"container/list"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"

	"github.com/moeprep/moeprep/internal/cores"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
)

// Requantisation: a plain (BF16, F16 or F32) weight quantised into a
// format by that format's own producer's rules, once, from its stored
// values widened to float32. fuse-shared --requantize-shared does it to a
// shared expert stored unlike the routed experts (Kimi-K2-Thinking: INT4
// routed experts, a BF16 shared expert), so that the shared expert's fused
// slots are stored like the rest of the stack.
//
// The rules, per scale block (a group of a row, a 128x128 block, a row, the
// whole weight: the format's Scale().Block):
//
//   - amax is the largest |w| of the block, exact (every source value is
//     a float32);
//   - scale = amax / Divisor, divided in float32 and rounded once to the
//     scale's dtype (nearest, ties to even), then raised to MinScale
//     (float32's epsilon, 2^-23) where smaller, and for UE8M0 FP8 scales
//     rounded up to a power of two;
//   - each element's code is w / scale, divided in float32 by the STORED
//     scale, clamped to [Lo, Hi] and rounded to the nearest code, ties to
//     even: an integer for INT4, an E4M3 value for FP8.
//
// compressed-tensors (quantization/utils/helpers.py calculate_qparams and
// calculate_range; lifecycle/forward.py _quantize; quant_args.py
// round_to_quantized_type), which wrote Kimi's INT4 and llm-compressor's
// FP8 experts: symmetric scales are max(|min|, |max|) / (bit_range / 2)
// with bit_range = q_max - q_min, so 15 / 2 = 7.5 for INT4 ([-8, 7]) and
// 896 / 2 = 448 for FP8 E4M3 ([-448, 448]); computed in the weight's dtype
// (a bf16 scale is the float32 quotient rounded to bf16, as torch divides
// a bf16 tensor by a Python float), clamped to torch.finfo(float32).eps;
// the code is torch.round (half to even) of clamp(x / scale, q_min, q_max).
// One difference, on purpose: torch divides a bf16 x by the bf16 scale in
// bf16, rounding the quotient to 8 bits before torch.round, so a quotient
// within 2^-9 of a half-way point can round away from the nearest code;
// here the quotient stays float32 (single rounding), so every code is the
// nearest one to w / scale. DeepSeek's FP8 blocks (scale_inv = amax / 448,
// F32, and 2^ceil(log2) of it for UE8M0, as its inference kernels' act_quant
// computes) follow the same rule with F32 scales.
//
// The error this adds is at most half a step per element (scale / 2): for
// INT4, amax / 15 of each group; the INT4 maximum, clamped from 7.5 steps
// to 7 under a scale that rounding to bf16 may have lowered by 2^-8, by at
// most 0.53 step. For E4M3, 2^-4 of each element's magnitude down to the
// subnormal floor.

// RequantRule is how a plain weight is quantised into a format (see above).
type RequantRule struct {
	Name       string  // "absmax-int4", "absmax-e4m3"
	Divisor    float64 // scale = amax / Divisor: 7.5 (INT4), 448 (E4M3)
	Lo, Hi     float64 // the code range: [-8, 7], [-448, 448]
	MinScale   float64 // the smallest scale: 2^-23
	PowerOfTwo bool    // scales rounded up to a power of two (UE8M0)
	Rounding   string  // "nearest-even"
}

// MinRequantScale is compressed-tensors' floor on a scale,
// torch.finfo(torch.float32).eps: an all-zero block gets it, and its codes
// are all zero.
const MinRequantScale = 0x1p-23

// RoundingNearestEven is the only rounding requantisation uses.
const RoundingNearestEven = "nearest-even"

// Requantiser is a Format that a plain weight can be quantised into.
type Requantiser interface {
	Format
	RequantRule() RequantRule
	// encodeRow stores one row of values in dst (the row's bytes):
	// element c is scaled by scales[c/bc], stored scales decoded.
	encodeRow(vals, scales []float32, bc int, dst []byte)
}

// Requantisable is f as a Requantiser, or why a plain weight cannot be
// quantised into it.
func Requantisable(f Format) (Requantiser, error) {
	if r, ok := f.(Requantiser); ok {
		return r, nil
	}
	switch f.Quantization() {
	case QuantNone:
		return nil, fmt.Errorf("the routed experts are unquantised %s: there is no format to requantise into", f)
	case QuantNVFP4ModelOpt, QuantNVFP4CT:
		return nil, fmt.Errorf("requantising into %s is not built: its two-level scales (an E4M3 scale per 16 under a per-tensor F32 scale) need a calibrated global scale that moeprep does not choose", f)
	case QuantMXFP4:
		return nil, fmt.Errorf("requantising into %s is not built: its E8M0 scales per 32 round to powers of two by a rule (floor or ceil of log2 amax/6) its producers do not agree on", f)
	}
	return nil, fmt.Errorf("requantising into %s is not built", f)
}

// scaleOf is the stored scale of a block whose largest magnitude is amax,
// in dtype d, as a float32; an error when it is not finite in d.
func (r RequantRule) scaleOf(amax float32, d safetensors.DType) (float32, error) {
	s := roundTo(d, amax/float32(r.Divisor))
	if s < float32(r.MinScale) {
		s = float32(r.MinScale)
	}
	if r.PowerOfTwo {
		if frac, exp := math.Frexp(float64(s)); frac != 0.5 {
			s = float32(math.Ldexp(1, exp))
		}
	}
	if math.IsInf(float64(s), 0) || math.IsInf(float64(roundTo(d, s)), 0) {
		return 0, fmt.Errorf("largest magnitude %g / %g overflows a %s scale", amax, r.Divisor, d)
	}
	return s, nil
}

// roundTo rounds v once to dtype d (BF16, F16; F32 as it is).
func roundTo(d safetensors.DType, v float32) float32 {
	switch d {
	case safetensors.BF16:
		return numfmt.RoundBF16(v)
	case safetensors.F16:
		return numfmt.F16ToF32(numfmt.F32ToF16(v))
	}
	return v
}

// putValue stores v, exact in dtype d (BF16, F16 or F32; for E8M0, U8 or
// F8_E8M0, a power of two in [2^-127, 2^127], its biased exponent), at
// the start of b.
func putValue(d safetensors.DType, b []byte, v float32) {
	switch d {
	case safetensors.U8, safetensors.F8E8M0:
		_, e := math.Frexp(float64(v)) // v = 0.5 * 2^e = 2^(e-1)
		b[0] = byte(min(max(e-1+127, 0), 254))
	case safetensors.BF16:
		binary.LittleEndian.PutUint16(b, numfmt.F32ToBF16(v))
	case safetensors.F16:
		binary.LittleEndian.PutUint16(b, numfmt.F32ToF16(v))
	default:
		binary.LittleEndian.PutUint32(b, math.Float32bits(v))
	}
}

// clamp32 is v clamped to [lo, hi].
func clamp32(v, lo, hi float32) float32 { return min(max(v, lo), hi) }

// requantBand is how many weight rows one band of a Requant holds: whole
// grid rows of the scale (bo rows each; 1 for a per-tensor scale, which
// does not depend on the band), at least ~64k elements where rows are short.
func requantBand(bo, cols int64) int64 {
	b := max(bo, 1)
	return b * max(1, (1<<16)/max(b*cols, 1))
}

// Requant quantises a plain [rows, cols] weight into a format on demand,
// one band of rows at a time: Weight and Scale read the quantised tensors'
// bytes as if stored, for any byte range, from the plain weight's bytes in
// src. A per-tensor scale needs the whole weight's amax: one pass over src
// computes it, once. Bands computed are kept in one cache shared by every
// Requant, bounded (requantCacheBytes), so that the reads of one region
// that follow each other (a stack's R replicas of a shared slice, which
// the shard writer reads one after the other; a column block read row by
// row) quantise each band once. Memory is that cache plus the bands being
// computed (each its plain bytes and float32 values: 5.5 MiB for a 128-row
// FP8 band of 7168 columns): one, or, for a read that spans several, one a
// core at once (prefetch), whatever the weight's size and however many
// weights there are. Safe for concurrent use.
type Requant struct {
	f    Requantiser
	m    Matrix // the quantised weight: f, rows, cols
	name string // the plain weight's tensor, for errors
	src  io.ReaderAt
	sd   safetensors.DType
	band int64 // rows per band

	mu     sync.Mutex // one computation at a time; guards global
	global float32    // per-tensor scale, once computed
	haveG  bool
}

// NewRequant prepares the quantisation of the plain weight named name, of
// dtype sd ([rows, cols], row-major bytes in src), into format f.
func NewRequant(f Format, name string, src io.ReaderAt, sd safetensors.DType, rows, cols int64) (*Requant, error) {
	r, err := Requantisable(f)
	if err != nil {
		return nil, err
	}
	if !foldable(sd) {
		return nil, fmt.Errorf("%s: dtype %s: requantisation reads BF16, F16 or F32 weights", name, sd)
	}
	if rows <= 0 || cols <= 0 || product(rows, cols, 4) < 0 || product(rows, cols, int64(sd.Size())) < 0 {
		return nil, fmt.Errorf("%s: a %dx%d weight cannot be requantised", name, rows, cols)
	}
	m := Matrix{Format: r, Rows: rows, Cols: cols}
	sc, _ := r.Scale()
	if e, _ := r.Packing(); e > 1 || r.Quantization() == QuantMXFP8 {
		// Packed groups, and MXFP8's groups of 32, must be whole, as
		// Dequantise requires.
		if err := wholeGroups(r, int(cols), sc.Block[1]); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return &Requant{f: r, m: m, name: name, src: src, sd: sd, band: requantBand(sc.Block[0], cols)}, nil
}

// Matrix is the quantised weight: its format and [rows, cols].
func (q *Requant) Matrix() Matrix { return q.m }

// Weight reads the quantised weight tensor's bytes (Matrix.Bytes of them).
func (q *Requant) Weight() io.ReaderAt { return requantView{q, false} }

// Scale reads the quantised weight's scale tensor's bytes
// (Matrix.ScaleBytes of them).
func (q *Requant) Scale() io.ReaderAt { return requantView{q, true} }

// Bytes is the whole quantised weight and its scale grid.
func (q *Requant) Bytes() (weight, scale []byte, err error) {
	weight = make([]byte, q.m.Bytes())
	scale = make([]byte, q.m.ScaleBytes())
	if _, err := q.Weight().ReadAt(weight, 0); err != nil {
		return nil, nil, err
	}
	if _, err := q.Scale().ReadAt(scale, 0); err != nil {
		return nil, nil, err
	}
	return weight, scale, nil
}

type requantView struct {
	q     *Requant
	scale bool
}

// ReadAt reads the view's bytes [off, off+len(p)), band by band.
func (v requantView) ReadAt(p []byte, off int64) (int, error) {
	q := v.q
	size, per := q.m.Bytes(), q.band*q.m.RowBytes() // bytes a band holds
	sc, _ := q.f.Scale()
	if v.scale {
		size = q.m.ScaleBytes()
		_, gc := q.m.ScaleShape()
		per = q.band / max(sc.Block[0], 1) * gc * int64(sc.DType.Size())
		if sc.Block[0] == 0 { // per tensor: one entry, every band's
			per = size
		}
	}
	if off < 0 {
		return 0, fmt.Errorf("%s: requantised read at %d", q.name, off)
	}
	last := (min(off+int64(len(p)), size) - 1) / per   // the read's last band
	ahead := max(1, requantCacheBytes/2/q.bandBytes()) // bands computed together
	n := 0
	for n < len(p) && off < size {
		b := off / per
		if b < last && cachedBand(bandKey{q, b}) == nil {
			q.prefetch(b, min(last, b+ahead-1), !v.scale)
		}
		bd, err := q.get(b, !v.scale)
		if err != nil {
			return n, err
		}
		src := bd.w
		if v.scale {
			src = bd.s
		}
		c := copy(p[n:], src[off-b*per:])
		n, off = n+c, off+int64(c)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// requantCacheBytes bounds the bands every Requant keeps, together: well
// above one 4 MiB chunk of a shard (all a stack's replicas read before the
// next chunk), far below a model's shared experts. A variable for tests.
var requantCacheBytes int64 = 32 << 20

// RequantCacheBytes is what the bands of every Requant, cached together,
// hold at most.
func RequantCacheBytes() int64 { return requantCacheBytes }

// requantCache holds recently computed bands, least recently used evicted.
var requantCache = struct {
	sync.Mutex
	m     map[bandKey]*list.Element // of *bandData
	order list.List                 // most recent first
	bytes int64
}{m: map[bandKey]*list.Element{}}

type bandKey struct {
	q *Requant
	b int64
}

// bandData is one quantised band: its weight bytes (nil when only its
// scales were asked for) and its scale bytes. Never changed once cached.
type bandData struct {
	key  bandKey
	w, s []byte
}

// get is band b, with its weight bytes where codes.
func (q *Requant) get(b int64, codes bool) (*bandData, error) {
	k := bandKey{q, b}
	if bd := cachedBand(k); bd != nil && (bd.w != nil || !codes) {
		return bd, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if bd := cachedBand(k); bd != nil && (bd.w != nil || !codes) { // computed meanwhile
		return bd, nil
	}
	bd, err := q.compute(b, codes)
	if err != nil {
		return nil, err
	}
	cacheBand(bd)
	return bd, nil
}

// prefetch computes the bands of [b0, b1] not cached yet on every core at
// once and caches them: a read that spans them (a shard writer's chunk,
// the byte proof's prediction of a replica, a whole tensor read into
// memory) would otherwise compute them one after another. A band whose
// computation fails is left out: the read computes it again and fails
// where it would have. Each band's bytes are the same however computed.
func (q *Requant) prefetch(b0, b1 int64, codes bool) {
	var miss []int64
	for b := b0; b <= b1; b++ {
		if bd := cachedBand(bandKey{q, b}); bd == nil || (codes && bd.w == nil) {
			miss = append(miss, b)
		}
	}
	if len(miss) < 2 {
		return
	}
	q.mu.Lock() // compute's: the per-tensor scale, once, before the bands
	defer q.mu.Unlock()
	if sc, _ := q.f.Scale(); sc.Block[0] == 0 && q.perTensor() != nil {
		return
	}
	out := make([]*bandData, len(miss))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(cores.N(), len(miss)) {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(miss)); i = next.Add(1) - 1 {
				out[i], _ = q.compute(miss[i], codes)
			}
		})
	}
	wg.Wait()
	for _, bd := range out {
		if bd != nil {
			cacheBand(bd)
		}
	}
}

// bandBytes is what one band's weight and scale bytes take in the cache.
func (q *Requant) bandBytes() int64 {
	piece := Matrix{Format: q.f, Rows: min(q.band, q.m.Rows), Cols: q.m.Cols}
	return max(1, piece.Bytes()+piece.ScaleBytes())
}

// cacheBand puts bd in the cache as its most recent band, evicting the
// least recent past requantCacheBytes.
func cacheBand(bd *bandData) {
	k := bd.key
	requantCache.Lock()
	defer requantCache.Unlock()
	if e, ok := requantCache.m[k]; ok {
		old := e.Value.(*bandData)
		requantCache.bytes -= int64(len(old.w) + len(old.s))
		requantCache.order.Remove(e)
	}
	requantCache.m[k] = requantCache.order.PushFront(bd)
	requantCache.bytes += int64(len(bd.w) + len(bd.s))
	for requantCache.bytes > requantCacheBytes && requantCache.order.Len() > 1 {
		last := requantCache.order.Back()
		old := last.Value.(*bandData)
		requantCache.order.Remove(last)
		delete(requantCache.m, old.key)
		requantCache.bytes -= int64(len(old.w) + len(old.s))
	}
}

// cachedBand is the cached band k, made the most recent; nil when none.
func cachedBand(k bandKey) *bandData {
	requantCache.Lock()
	defer requantCache.Unlock()
	e, ok := requantCache.m[k]
	if !ok {
		return nil
	}
	requantCache.order.MoveToFront(e)
	return e.Value.(*bandData)
}

// readPlain reads rows [r0, r0+n) of the plain weight as float32,
// refusing a non-finite value (no scale can hold it).
func (q *Requant) readPlain(r0, n int64) ([]float32, error) {
	cols, es := q.m.Cols, int64(q.sd.Size())
	raw, vals := make([]byte, n*cols*es), make([]float32, n*cols)
	if got, err := q.src.ReadAt(raw, r0*cols*es); got != len(raw) {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("%s: reading rows %d..%d to requantise: %w", q.name, r0, r0+n, err)
	}
	if err := Decode(q.sd, raw, vals); err != nil {
		return nil, fmt.Errorf("%s: %w", q.name, err)
	}
	for i, v := range vals {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("%s: element %d is %v: a non-finite weight cannot be requantised", q.name, r0*cols+int64(i), v)
		}
	}
	return vals, nil
}

// perTensor computes the per-tensor scale from the whole weight, once
// (q.mu held).
func (q *Requant) perTensor() error {
	if q.haveG {
		return nil
	}
	var amax float32
	for r0 := int64(0); r0 < q.m.Rows; r0 += q.band {
		vals, err := q.readPlain(r0, min(q.band, q.m.Rows-r0))
		if err != nil {
			return err
		}
		for _, v := range vals {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
	}
	sc, _ := q.f.Scale()
	s, err := q.f.RequantRule().scaleOf(amax, sc.DType)
	if err != nil {
		return fmt.Errorf("%s: %w", q.name, err)
	}
	q.global, q.haveG = s, true
	return nil
}

// compute quantises band b: its scales, and its codes where codes (q.mu
// held).
func (q *Requant) compute(b int64, codes bool) (*bandData, error) {
	sc, _ := q.f.Scale()
	if sc.Block[0] == 0 {
		if err := q.perTensor(); err != nil {
			return nil, err
		}
	}
	r0 := b * q.band
	n := min(q.band, q.m.Rows-r0)
	vals, err := q.readPlain(r0, n)
	if err != nil {
		return nil, err
	}
	piece := Matrix{Format: q.f, Rows: n, Cols: q.m.Cols}
	bd := &bandData{key: bandKey{q, b}, s: make([]byte, piece.ScaleBytes())}
	if codes {
		bd.w = make([]byte, piece.Bytes())
	}
	if err := quantiseRows(q.f, vals, n, q.m.Cols, q.global, bd.w, bd.s); err != nil {
		return nil, fmt.Errorf("%s: rows %d..%d: %w", q.name, r0, r0+n, err)
	}
	return bd, nil
}

// quantiseRows quantises rows [n, cols] of values (a band starting on a
// grid row of the scale) into w (their stored bytes; nil: scales only) and
// s (their grid rows; for a per-tensor scale, global is the scale and s
// holds it).
func quantiseRows(f Requantiser, vals []float32, n, cols int64, global float32, w, s []byte) error {
	sc, _ := f.Scale()
	rule := f.RequantRule()
	bo, bc := sc.Block[0], sc.Block[1]
	if bc == 0 {
		bc = cols
	}
	gRows := bo
	if bo == 0 {
		gRows = n
	}
	gc := ceilDiv(cols, bc)
	es := int64(sc.DType.Size())
	rowBytes := Matrix{Format: f, Rows: 1, Cols: cols}.RowBytes()
	scales := make([]float32, gc)
	for g0, gr := int64(0), int64(0); g0 < n; g0, gr = g0+gRows, gr+1 {
		g1 := min(g0+gRows, n)
		for j := range gc {
			if bo == 0 {
				scales[j] = global
			} else {
				var amax float32
				c0, c1 := j*bc, min((j+1)*bc, cols)
				for r := g0; r < g1; r++ {
					for _, v := range vals[r*cols+c0 : r*cols+c1] {
						amax = max(amax, float32(math.Abs(float64(v))))
					}
				}
				var err error
				if scales[j], err = rule.scaleOf(amax, sc.DType); err != nil {
					return err
				}
			}
			if off := (gr*gc + j) * es; off+es <= int64(len(s)) {
				putValue(sc.DType, s[off:], scales[j])
			}
		}
		for r := g0; r < g1 && w != nil; r++ {
			f.encodeRow(vals[r*cols:(r+1)*cols], scales, int(bc), w[r*rowBytes:(r+1)*rowBytes])
		}
	}
	return nil
}

// Requantise quantises a whole plain weight, [rows, cols] float32 values,
// into f in memory: the stored weight and scale bytes (a per-tensor
// scale's one entry). The streamed Requant gives the same bytes.
func Requantise(f Format, vals []float32, rows, cols int64) (weight, scale []byte, err error) {
	if int64(len(vals)) != product(rows, cols) {
		return nil, nil, fmt.Errorf("requantise: %d values for a %dx%d weight", len(vals), rows, cols)
	}
	raw := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	q, err := NewRequant(f, "weight", bytesReader(raw), safetensors.F32, rows, cols)
	if err != nil {
		return nil, nil, err
	}
	return q.Bytes()
}

// bytesReader reads a byte slice.
type bytesReader []byte

func (b bytesReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
