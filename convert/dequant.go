package convert

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/cores"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/quantweights"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// Dequantising (--dtype bf16, f16 or f32): every quantised weight of the
// source, the experts' and every other (DeepSeek's FP8 attention and dense
// MLPs, an unfused shared expert), is written as its exact float32
// dequantisation (weightfmt's Dequantise, the format's own arithmetic)
// rounded ONCE to nearest even in the target dtype (F32: not rounded), under
// the plain name an unquantised checkpoint of the family gives it; its scale
// tensors, global scale, weight_shape and input_scale are dropped. Every
// other tensor is copied byte for byte as before: --dtype names the dtype
// the dequantised weights get, nothing else changes dtype.
//
// A dequantised part is read in chunks of whole rows that start on the
// format's scale blocks (128 rows for FP8 blocks, single rows for the
// per-row formats), about chunkSize of output each: the chunk's weight rows
// and the scale rows that cover them are read, dequantised a group of rows
// at a time (weightfmt.Dequantiser: at most 1 MiB of float32 or one scale
// block of rows) and rounded into the chunk's output bytes. Memory does not
// grow with the tensor; what one chunk needs is bounded by maxDequantRowBytes.

// maxDequantRowBytes bounds one scale block of rows as float32, the least
// a dequantised chunk holds (128 rows of FP8 blocks): DeepSeek-V3's widest
// weight (a dense down projection, 18432 columns) needs 9.4 MB; a weight
// that needs more than 256 MiB is refused rather than given the memory.
const maxDequantRowBytes = 256 << 20

// dequant is how a dequantised part's output is made: m is the source
// piece (a whole weight, or a shared expert's slice of one) in its format,
// the part's region its weight bytes as a row-major stream, scale its
// scale grid's bytes likewise, global its global scale (zero regions where
// the format has none).
type dequant struct {
	m             weightfmt.Matrix
	scale, global region
	to            safetensors.DType
}

// rowBytes is the output bytes of one row.
func (d *dequant) rowBytes() int64 { return d.m.Cols * int64(d.to.Size()) }

// size is the output bytes of the whole piece.
func (d *dequant) size() int64 { return d.m.Rows * d.rowBytes() }

// chunkRows is how many rows a chunk holds: whole scale blocks of rows,
// about chunkSize of output.
func (d *dequant) chunkRows() int64 {
	unit := d.m.RowUnit()
	if rb := d.rowBytes(); rb > 0 {
		return unit * max(1, chunkSize/(unit*rb))
	}
	return unit
}

// dequantCounts is what a --dtype run dequantised, for the contract.
type dequantCounts struct {
	experts, other int  // source weights: the stacked experts', every other in their format
	inputs         bool // input_scale tensors were dropped
	// second counts the other weights of a mixed-format checkpoint's
	// second format (quantweights.OtherFormat), secondF; 0 and nil otherwise.
	second  int
	secondF weightfmt.Format
	// sharedApart counts the fused shared expert's weights dequantised
	// from their own format (sharedF), not the routed experts'.
	sharedApart int
	sharedF     weightfmt.Format
}

// outFormat is how the stacks store expert weights: as the source does,
// or with --dtype as the plain dtype they are dequantised into (refused
// where nothing is quantised).
func (p *planner) outFormat() (weightfmt.Format, error) {
	if p.o.DType == "" {
		return p.wf, nil
	}
	if _, scaled := p.wf.Scale(); !scaled {
		return nil, fmt.Errorf("%s: --dtype %s: the experts are %s, not quantised, so there is nothing to dequantise (--dtype names the dtype dequantised weights get; moeprep does not cast plain weights)",
			p.ck.Dir, strings.ToLower(string(p.o.DType)), p.wf)
	}
	return weightfmt.Plain(p.o.DType), nil
}

// sharedFormat is how the shared expert is stored: like the routed
// experts, or plain where the plan says so (Kimi's BF16 beside INT4).
func (p *planner) sharedFormat() weightfmt.Format {
	switch q := p.fp.SharedQuantization; {
	case q == family.QuantNone && !p.requant: // requantised: stored as wf
		return weightfmt.Plain(p.fp.SharedWeightDType)
	case q != "" && q != family.QuantNone:
		// another quantised format (DeepSeek-V4's FP8 beside FP4): fused
		// only with --dtype, dequantised by its own format
		if f, err := p.fp.SharedFormat(); err == nil {
			return f
		}
	}
	return p.wf
}

// sharedDequantMatches reports whether a shared expert stored apart from
// the routed experts is, after --dtype, stored like them: plain, in the
// dtype they are dequantised into (Kimi's BF16 with --dtype bf16).
func (p *planner) sharedDequantMatches() bool {
	return p.o.DType != "" && p.fp.SharedQuantization == family.QuantNone && p.fp.SharedWeightDType == p.o.DType
}

// sharedDequantised reports whether an unfused shared expert quantised
// unlike the routed experts (DeepSeek-V4's FP8 beside FP4) is dequantised
// by --dtype, by its own format, among the other weights: then stored
// like the dequantised routed experts.
func (p *planner) sharedDequantised() bool {
	q := p.fp.SharedQuantization
	return p.o.DType != "" && !p.o.FuseShared && q != "" && q != family.QuantNone
}

// dequantMLP turns an expert's parts in format f (whole weights, or a
// shared expert's slices, each I x H or H x I) into dequantised parts, with
// --dtype and a quantised f; otherwise it returns them as they are. The
// biases stay as stored; scales, global and input scales are dropped.
func (p *planner) dequantMLP(mp mlpParts, f weightfmt.Format, I, H int64, what string) (mlpParts, error) {
	if _, scaled := f.Scale(); p.o.DType == "" || !scaled {
		return mp, nil
	}
	var out mlpParts
	for _, pj := range layout.MLPProjs {
		out[pj][layout.RoleBias] = mp[pj][layout.RoleBias]
	}
	for _, pj := range layout.MLPProjs {
		rows, cols := I, H
		if pj == layout.ProjDown {
			rows, cols = H, I
		}
		w := mp[pj]
		var err error
		if out[pj][layout.RoleWeight], err = p.dequantPart(w[layout.RoleWeight], w[layout.RoleScale], w[layout.RoleGlobal], weightfmt.Matrix{Format: f, Rows: rows, Cols: cols}, what+" "+pj.String()); err != nil {
			return mlpParts{}, err
		}
	}
	if mp[layout.ProjGate][layout.RoleInput].size() > 0 {
		p.dq.inputs = true
	}
	return out, nil
}

// dequantPart is the part that dequantises weight (its scale sc and global
// scale gl) of the source piece m: every size checked against m's.
func (p *planner) dequantPart(weight, sc, gl part, m weightfmt.Matrix, what string) (part, error) {
	switch {
	case weight.size() != m.Bytes() || sc.size() != m.ScaleBytes() || gl.size() != m.GlobalBytes():
		return part{}, fmt.Errorf("%s: %s: %s holds %d bytes, its scales %d and %d, a %dx%d %s weight has %d, %d and %d",
			weight.file, what, weight.tensor, weight.size(), sc.size(), gl.size(), m.Rows, m.Cols, m.Format, m.Bytes(), m.ScaleBytes(), m.GlobalBytes())
	case m.RowUnit() > maxDequantRowBytes/4/max(m.Cols, 1):
		return part{}, fmt.Errorf("%s: %s: %s: %d rows of %d columns would be dequantised at once (its scale blocks), over the %d MiB moeprep allows",
			weight.file, what, weight.tensor, m.RowUnit(), m.Cols, maxDequantRowBytes>>20)
	}
	return part{region: weight.region, dtype: p.o.DType, dq: &dequant{m: m, scale: sc.region, global: gl.region, to: p.o.DType}}, nil
}

// otherWeights finds, with --dtype, the quantised weights outside the
// stacked experts (consumed: the base names they take): by the name of
// their weight tensor, and the stored tensors dequantising them drops (the
// weight tensors too). A tensor of an FP8 dtype left over is refused: the
// output would claim a dequantised model and hold it still quantised.
func (p *planner) otherWeights(consumed map[string]int) (map[string]quantweights.Weight, map[string]bool, error) {
	if p.o.DType == "" {
		return nil, nil, nil
	}
	taken := func(n string) bool { _, ok := consumed[n]; return ok }
	// Each weight by its own format: a mixed-format checkpoint's second
	// format (DeepSeek-V4's FP8 beside FP4 experts, ModelOpt's FP8 beside
	// NVFP4) is dequantised by its own arithmetic.
	qs, err := quantweights.FindMixed(p.ck, p.wf, p.fp.FP8Block, taken)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: --dtype: %w", p.ck.Dir, err)
	}
	other, dropped := map[string]quantweights.Weight{}, map[string]bool{}
	for _, q := range qs {
		other[q.Tensors.Weight] = q
		for _, n := range q.Dropped() {
			dropped[n] = true
		}
		p.dq.inputs = p.dq.inputs || q.Input != ""
		if q.Format == p.wf {
			p.dq.other++
		} else {
			p.dq.second++
			p.dq.secondF = q.Format
		}
	}
	for _, t := range p.ck.Tensors {
		if !taken(t.Name) && !dropped[t.Name] && (t.DType == safetensors.F8E4M3 || t.DType == safetensors.F8E5M2) {
			return nil, nil, fmt.Errorf("%s: --dtype: tensor %s is %s but no %s weight or scale: moeprep dequantises one format per checkpoint, the experts' (%s)",
				t.File, t.Name, t.DType, p.wf, p.wf.Quantization())
		}
	}
	return other, dropped, nil
}

// dequantTensor is the output tensor of a quantised weight outside the
// experts: its plain name, [rows, cols] of the target dtype.
func (p *planner) dequantTensor(q quantweights.Weight) (*outTensor, error) {
	get := func(name string) part {
		if t, ok := p.ck.Tensor(name); ok {
			return whole(t)
		}
		return part{}
	}
	w, ok := p.ck.Tensor(q.Tensors.Weight)
	if !ok {
		return nil, fmt.Errorf("%s: tensor %s is missing", p.ck.Dir, q.Tensors.Weight)
	}
	m := weightfmt.Matrix{Format: q.Format, Rows: q.Rows, Cols: q.Cols}
	pt, err := p.dequantPart(whole(w), get(q.Tensors.Scale), get(q.Tensors.Global), m, "dequantising")
	if err != nil {
		return nil, err
	}
	return &outTensor{name: q.Name, dtype: p.o.DType, shape: []int64{q.Rows, q.Cols}, size: pt.size(), parts: []part{pt}}, nil
}

// dequantRecord is the contract's record of a --dtype run (nil without).
func (p *planner) dequantRecord() *layout.Dequantized {
	if p.o.DType == "" {
		return nil
	}
	d := &layout.Dequantized{DType: string(p.o.DType), Rounding: weightfmt.RoundingOf(p.o.DType), InputScalesDropped: p.dq.inputs}
	for _, g := range []struct {
		name string
		n    int
	}{{layout.GroupExperts, p.dq.experts}, {layout.GroupOther, p.dq.other}} {
		if g.n > 0 {
			d.Groups = append(d.Groups, layout.NewDequantGroup(g.name, p.wf, g.n))
		}
	}
	if p.dq.sharedApart > 0 {
		d.Groups = append(d.Groups, layout.NewDequantGroup(layout.GroupExperts, p.dq.sharedF, p.dq.sharedApart))
	}
	if p.dq.second > 0 {
		d.Groups = append(d.Groups, layout.NewDequantGroup(layout.GroupOther, p.dq.secondF, p.dq.second))
	}
	return d
}

// dequantisers are the scratch buffers of chunk reads, shared by the
// shards' writers.
var dequantisers = sync.Pool{New: func() any { return new(weightfmt.Dequantiser) }}

// maxDequantWorkers bounds the goroutines one chunk is dequantised by.
const maxDequantWorkers = 8

// dequantise fills b with the chunk's dequantised rows. It reads the
// chunk's source bytes (its weight rows through r, its part's region or
// the same bytes through the shard's own file; the scale rows that cover
// them; the global scale) into memory, notes their digest in src (in that
// order: the same whatever the machine), and dequantises them split
// across up to GOMAXPROCS goroutines in runs of whole scale blocks of
// rows: on a machine with cores to spare the CPU keeps up with the disk.
// Its memory is the chunk's source bytes and one Dequantiser a goroutine.
func (c *chunk) dequantise(b []byte, r region, src *sourceDigests) error {
	d := c.p.dq
	rb := d.rowBytes()
	if rb <= 0 || c.pos%rb != 0 || c.n%rb != 0 || int64(len(b)) != c.n {
		return fmt.Errorf("%s: tensor %s: dequantising output bytes %d..%d, not whole rows of %d", c.p.file, c.p.tensor, c.pos, c.pos+c.n, rb)
	}
	r0, n := c.pos/rb, c.n/rb
	if n == 0 {
		return nil
	}
	sl := d.m.RowBlock(r0, n)
	in := chunkSources.Get().(*weightfmt.MemRows)
	defer chunkSources.Put(in)
	h := xxh3.New()
	for _, x := range []struct {
		dst    *[]byte
		from   region
		off, n int64
	}{{&in.Raw, r, sl.Weight.Off, sl.Weight.Size()}, {&in.Scale, d.scale, sl.Scale.Off, sl.Scale.Size()}, {&in.Global, d.global, 0, d.m.GlobalBytes()}} {
		*x.dst = growBytes(*x.dst, x.n)
		if x.n == 0 {
			continue // no scale or global scale: no region to read
		}
		if err := x.from.readAt(*x.dst, x.off); err != nil {
			return err
		}
		h.Write(*x.dst)
	}
	src.set(c, h)
	piece := weightfmt.Matrix{Format: d.m.Format, Rows: n, Cols: d.m.Cols}
	unit := piece.RowUnit()
	units := (n + unit - 1) / unit
	workers := min(int64(cores.N()), maxDequantWorkers, units)
	per := (units + workers - 1) / workers * unit // rows a goroutine: whole scale blocks
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for k := int64(0); k*per < n; k++ {
		p, rows := k*per, min(per, n-k*per)
		wg.Go(func() {
			dq := dequantisers.Get().(*weightfmt.Dequantiser)
			defer dequantisers.Put(dq)
			errs[k] = dq.DequantRows(piece, *in, p, rows, d.to, b[p*rb:(p+rows)*rb])
		})
	}
	wg.Wait()
	for _, err := range errs {
		var over *weightfmt.OverflowError
		if errors.As(err, &over) {
			over.Row += r0
		}
		if err != nil {
			return fmt.Errorf("%s: tensor %s: %w", c.p.file, c.p.tensor, err)
		}
	}
	return nil
}

// chunkSources hold a chunk's source bytes while it is dequantised.
var chunkSources = sync.Pool{New: func() any { return new(weightfmt.MemRows) }}

// growBytes is b resized to n bytes, reallocated only when too small.
func growBytes(b []byte, n int64) []byte {
	if int64(cap(b)) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// sourcePos is where byte pos of the part's output stream starts in its
// region's stream: the same byte, or for a dequantised part the first byte
// of its row.
func (p *part) sourcePos(pos int64) int64 {
	if p.dq == nil {
		return pos
	}
	return pos / p.dq.rowBytes() * p.dq.m.RowBytes()
}

// dequantSummary is the dtype and the number of weights a contract says
// were dequantised ("", 0: none).
func dequantSummary(c *layout.Contract) (string, int) {
	if c == nil || c.Dequantized == nil {
		return "", 0
	}
	n := 0
	for _, g := range c.Dequantized.Groups {
		n += g.Tensors
	}
	return strings.ToLower(c.Dequantized.DType), n
}
