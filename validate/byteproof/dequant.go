package byteproof

import (
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/quantweights"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/tensorbytes"
	"github.com/moeprep/moeprep/weightfmt"
)

// A dequantised DST (convert --dtype, the contract's dequantized): every
// quantised weight of SRC, the experts' in their stacks and every other
// under its plain name, must hold exactly the values that SRC's bytes give
// when dequantised to float32 by the format (weightfmt, as the CPU
// reference reads SRC) and rounded once to nearest even in the contract's
// dtype (numfmt's encoders; F32: the float32 values themselves). The
// prediction is computed here from SRC's weight, scale and global scale
// bytes, a group of rows at a time, and compared bit for bit: a value
// rounded twice, truncated, or dequantised without its scale differs in
// some bit of some element. The scales, global scales, weight_shape and
// input_scale tensors of those weights are not in DST.

// MismatchDequant is a dequantised value that is not the one rounding of
// SRC's exact dequantisation.
const MismatchDequant = "dequantised value off"

// dequantSeg is how a segment's bytes are predicted from a quantised SRC
// weight: m is the piece (a whole weight, or a shared expert's slice), its
// bytes the segment's src and ranges, its scale grid the bytes
// scaleRanges of scale, its global scale globalRanges of global (nil
// where the format has none).
type dequantSeg struct {
	m                         weightfmt.Matrix
	to                        safetensors.DType
	scale, global             *checkpoint.Tensor
	scaleRanges, globalRanges [][2]int64
}

// size is the predicted bytes: the piece's values in the target dtype.
func (d *dequantSeg) size() int64 { return d.m.Rows * d.m.Cols * int64(d.to.Size()) }

// srcBytes is the SRC bytes the prediction reads: the weight's (ranges),
// its scales' and its global scale's.
func (d *dequantSeg) srcBytes(ranges [][2]int64) int64 {
	var n int64
	for _, rs := range [][][2]int64{ranges, d.scaleRanges, d.globalRanges} {
		for _, r := range rs {
			n += r[1] - r[0]
		}
	}
	return n
}

// srcFormats is how SRC stores the routed experts and the shared expert
// that c stacks, DST storing them as of: of itself, or for a dequantised
// DST the source format the contract records for the experts (the contract
// proof holds it to SRC), with a shared expert that the plan says is plain
// (Kimi's BF16 beside INT4) read as plain.
func srcFormats(plan *family.Plan, c *layout.Contract, of weightfmt.Format) (routed, shared weightfmt.Format, err error) {
	if c.Dequantized == nil {
		return of, of, nil
	}
	if routed, err = expertsSource(c); err != nil {
		return nil, nil, err
	}
	shared = routed
	switch q := plan.SharedQuantization; {
	case q == family.QuantNone:
		shared = weightfmt.Plain(plan.SharedWeightDType)
	case q != "":
		// quantised unlike the routed experts (DeepSeek-V4's FP8 beside
		// FP4): dequantised by its own format
		if shared, err = plan.SharedFormat(); err != nil {
			return nil, nil, err
		}
	}
	return routed, shared, nil
}

// expertsSource is the source format a dequantised DST's contract records
// for its experts.
func expertsSource(c *layout.Contract) (weightfmt.Format, error) {
	g, ok := c.Dequantized.Group(layout.GroupExperts)
	if !ok {
		return nil, fmt.Errorf("the contract's dequantized record has no experts group")
	}
	return g.Format()
}

// predictOthers adds, for a dequantised DST, every quantised weight of SRC
// outside the stacked experts (consumed): DST holds it dequantised under
// its plain name, and none of its stored tensors.
func (p *prediction) predictOthers(src *checkpoint.Checkpoint, plan *family.Plan, c *layout.Contract, consumed map[string]bool) error {
	if c.Dequantized == nil {
		return nil
	}
	f, err := expertsSource(c)
	if err != nil {
		return fmt.Errorf("%s: %w", src.Dir, err)
	}
	qs, err := quantweights.FindMixed(src, f, plan.FP8Block, func(n string) bool { return consumed[n] })
	if err != nil {
		return fmt.Errorf("%s: %w", src.Dir, err)
	}
	to := safetensors.DType(c.Dequantized.DType)
	for _, q := range qs {
		w, _ := src.Tensor(q.Tensors.Weight)
		// each weight by the format SRC stores it in (a mixed-format
		// checkpoint's second format for its own weights)
		d := &dequantSeg{m: weightfmt.Matrix{Format: q.Format, Rows: q.Rows, Cols: q.Cols}, to: to}
		if t, ok := src.Tensor(q.Tensors.Scale); ok {
			d.scale, d.scaleRanges = t, [][2]int64{{0, t.NumBytes()}}
		}
		if t, ok := src.Tensor(q.Tensors.Global); ok {
			d.global, d.globalRanges = t, [][2]int64{{0, t.NumBytes()}}
		}
		if _, dup := p.meta[q.Name]; dup {
			return fmt.Errorf("%s: tensor %s would be both a stack and a dequantised weight", src.Dir, q.Name)
		}
		p.meta[q.Name] = tensorWant{dtype: to, shape: []int64{q.Rows, q.Cols}, layer: -1, expert: -1}
		p.tensors[q.Name] = []segment{{n: d.size(), src: w, ranges: [][2]int64{{0, w.NumBytes()}}, dq: d, layer: -1, expert: -1}}
		for _, n := range q.Dropped() {
			consumed[n] = true
		}
	}
	return nil
}

// readRanges fills b from byte off of the stream that ranges of t make.
func readRanges(t *checkpoint.Tensor, ranges [][2]int64, b []byte, off int64) error {
	for _, rg := range ranges {
		n := rg[1] - rg[0]
		if off >= n {
			off -= n
			continue
		}
		k := min(int64(len(b)), n-off)
		if err := tensorbytes.ReadAt(t, b[:k], rg[0]+off); err != nil {
			return err
		}
		b, off = b[k:], 0
		if len(b) == 0 {
			return nil
		}
	}
	if len(b) > 0 {
		return fmt.Errorf("%s: tensor %s: %d bytes past the end of its predicted piece", t.File, t.Name, len(b))
	}
	return nil
}

// dequantSource hands the Dequantiser a segment's SRC bytes.
type dequantSource struct{ sg *segment }

func (s dequantSource) ReadWeight(b []byte, off int64) error {
	return readRanges(s.sg.src, s.sg.ranges, b, off)
}

func (s dequantSource) ReadScale(b []byte, off int64) error {
	if s.sg.dq.scale == nil {
		return fmt.Errorf("tensor %s: its format has a scale, the prediction none", s.sg.src.Name)
	}
	return readRanges(s.sg.dq.scale, s.sg.dq.scaleRanges, b, off)
}

func (s dequantSource) ReadGlobal(b []byte) error {
	if s.sg.dq.global == nil {
		return fmt.Errorf("tensor %s: its format has a global scale, the prediction none", s.sg.src.Name)
	}
	return readRanges(s.sg.dq.global, s.sg.dq.globalRanges, b, 0)
}

// dequantRows is how many rows of a dequantised segment segReader
// predicts at a time: whole scale blocks of rows, about compareChunk bytes.
func dequantRows(d *dequantSeg) int64 {
	unit, rb := d.m.RowUnit(), d.m.Cols*int64(d.to.Size())
	if rb <= 0 {
		return max(unit, d.m.Rows)
	}
	return unit * max(1, compareChunk/(unit*rb))
}

// nextDequant fills r.dqBuf with the next rows of the dequantised segment
// sg; false when the segment is done.
func (r *segReader) nextDequant(sg *segment) (bool, error) {
	d := sg.dq
	if r.dqRow >= d.m.Rows {
		return false, nil
	}
	n := min(dequantRows(d), d.m.Rows-r.dqRow)
	size := n * d.m.Cols * int64(d.to.Size())
	if int64(cap(r.dqBuf)) < size {
		r.dqBuf = make([]byte, size)
	}
	r.dqBuf, r.dqOff = r.dqBuf[:size], 0
	r.dq.Reference = true // every value through the format's Dequantise: not convert's FP8 fast path
	if err := r.dq.DequantRows(d.m, dequantSource{sg}, r.dqRow, n, d.to, r.dqBuf); err != nil {
		return false, fmt.Errorf("%s: tensor %s: predicting its dequantised values: %w", sg.src.File, sg.src.Name, err)
	}
	r.dqRow += n
	return true, nil
}

// readDequant copies the next predicted bytes of the dequantised segment
// sg into p; 0 when the segment is done.
func (r *segReader) readDequant(sg *segment, p []byte) (int, error) {
	if r.dqOff >= len(r.dqBuf) {
		more, err := r.nextDequant(sg)
		if err != nil || !more {
			return 0, err
		}
	}
	n := copy(p, r.dqBuf[r.dqOff:])
	r.dqOff += n
	return n, nil
}

// compareDequant compares DST's dequantised bytes with their prediction,
// exactly: the first element that differs is the mismatch.
func compareDequant(mm func(kind string, off int64, detail string) *ByteMismatch, sg segment, d safetensors.DType, got, want []byte, at int64) *ByteMismatch {
	es := d.Size()
	for i := 0; i+es <= len(got); i += es {
		if string(got[i:i+es]) == string(want[i:i+es]) {
			continue
		}
		el := (at + int64(i)) / int64(es)
		return mm(MismatchDequant, at+int64(i), fmt.Sprintf("element %d is %s, the %s %s of SRC %s's exact dequantisation is %s",
			el, showValue(d, got[i:]), sg.dq.to, weightfmt.RoundingOf(sg.dq.to), sg.src.Name, showValue(d, want[i:])))
	}
	return nil
}

// showValue is one element of dtype d as its bits and its value.
func showValue(d safetensors.DType, b []byte) string {
	switch d {
	case safetensors.BF16:
		u := binary.LittleEndian.Uint16(b)
		return fmt.Sprintf("%#04x (%g)", u, numfmt.BF16ToF32(u))
	case safetensors.F16:
		u := binary.LittleEndian.Uint16(b)
		return fmt.Sprintf("%#04x (%g)", u, numfmt.F16ToF32(u))
	}
	u := binary.LittleEndian.Uint32(b)
	return fmt.Sprintf("%#08x (%g)", u, math.Float32frombits(u))
}

// copiedDequant reports whether a file of SRC is left out of a
// dequantised DST: ModelOpt's hf_quant_config.json, which describes the
// quantised weights DST no longer holds.
func copiedDequant(c *layout.Contract, rel string) bool {
	return c.Dequantized == nil || filepath.ToSlash(rel) != checkpoint.HFQuantConfigFileName
}

// checkDequantized derives a dequantised DST's record from SRC, as
// convert's --dtype makes it (convert/dequant.go), without its code: the
// experts' plain weights carry no block or scale dtype; the experts group
// counts the stacked experts' source weights (three per routed expert, and
// the shared expert's where fused and quantised), the other group every
// other quantised weight of SRC (quantweights.Find, as the tensor
// proof predicts them), both in the experts' source format, which the
// contract proof has held to SRC's; input_scales_dropped says whether any
// had an input_scale. --fold-scaling down is refused with --dtype, and a
// plain shared expert fuses only when it is of the dequantised dtype.
func checkDequantized(src *checkpoint.Checkpoint, plan *family.Plan, c *layout.Contract,
	bad func(string, any, any, string) *ByteMismatch, refuse func(string, any, string) *ByteMismatch) *ByteMismatch {
	d := c.Dequantized
	fused := c.NumFusedSharedExperts > 0
	switch {
	case len(c.WeightBlockSize) != 0:
		return bad("weight_block_size", c.WeightBlockSize, shown("absent"), "the dequantised experts' plain weights")
	case c.ScaleDType != "":
		return bad("scale_dtype", c.ScaleDType, shown("absent"), "the dequantised experts' plain weights")
	case c.FoldMode == layout.FoldDown:
		return refuse("fold_mode", c.FoldMode, "convert refuses --fold-scaling down with --dtype")
	case fused && plan.SharedQuantization == family.QuantNone && string(plan.SharedWeightDType) != d.DType:
		return refuse("num_fused_shared_experts", c.NumFusedSharedExperts, fmt.Sprintf("SRC's shared expert is %s and the experts are dequantised to %s, which convert refuses to fuse", plan.SharedWeightDType, d.DType))
	}
	g, _ := d.Group(layout.GroupExperts) // checkContract found it
	f, err := g.Format()
	if err != nil {
		return refuse("dequantized.groups", d.Groups, err.Error())
	}
	taken, n, nApart := map[string]bool{}, 0, 0
	apart := plan.SharedQuantization != "" && plan.SharedQuantization != family.QuantNone
	take := func(m family.MLP) {
		for _, x := range m.Names() {
			taken[checkpoint.BaseName(x)] = true
		}
	}
	for _, l := range plan.Layers {
		for _, e := range l.Experts {
			take(e)
			n += 3
		}
		if fused && l.Shared != nil {
			take(*l.Shared)
			if plan.SharedQuantization == "" {
				n += 3
			} else if apart {
				nApart += 3 // dequantised by its own format (DeepSeek-V4's FP8)
			}
		}
	}
	qs, err := quantweights.FindMixed(src, f, plan.FP8Block, func(x string) bool { return taken[x] })
	if err != nil {
		return refuse("dequantized", shown("present"), "SRC's quantised weights cannot be dequantised: "+err.Error())
	}
	want := &layout.Dequantized{DType: d.DType, Rounding: weightfmt.RoundingOf(safetensors.DType(d.DType)), InputScalesDropped: plan.NVFP4InputScale,
		Groups: []layout.DequantGroup{layout.NewDequantGroup(layout.GroupExperts, f, n)}}
	if nApart > 0 {
		sf, err := plan.SharedFormat()
		if err != nil {
			return refuse("dequantized.groups", d.Groups, err.Error())
		}
		want.Groups = append(want.Groups, layout.NewDequantGroup(layout.GroupExperts, sf, nApart))
	}
	// other: the experts' format's weights, then a mixed-format
	// checkpoint's second format's (quantweights.OtherFormat), each its group
	var nf, n2 int
	var f2 weightfmt.Format
	for _, q := range qs {
		if q.Format == f {
			nf++
		} else {
			n2, f2 = n2+1, q.Format
		}
	}
	if nf > 0 {
		want.Groups = append(want.Groups, layout.NewDequantGroup(layout.GroupOther, f, nf))
	}
	if n2 > 0 {
		want.Groups = append(want.Groups, layout.NewDequantGroup(layout.GroupOther, f2, n2))
	}
	for _, q := range qs {
		want.InputScalesDropped = want.InputScalesDropped || q.Input != ""
	}
	w, err1 := contractJSON(want)
	got, err2 := contractJSON(d)
	if err1 != nil || err2 != nil {
		return refuse("dequantized", shown("present"), "it cannot be encoded")
	}
	if df := firstJSONDiff(w, got, "dequantized", false); df != nil {
		gotV, wantV := any(shown("absent")), any(shown("absent"))
		if df.inB {
			gotV = df.b
		}
		if df.inA {
			wantV = df.a
		}
		return bad(df.path, gotV, wantV, "SRC's quantised weights")
	}
	return nil
}
