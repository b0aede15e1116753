package validate

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/human"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/byteproof"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/stream"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// The one streamed pass of a CPU run with SRC and DST: every byte the
// layer checks and the byte proof need is read once (stream), in the
// order the layer checks use them, and both take it from memory.
//
// Per checked layer the plan reads a head (the routers, the shared
// expert, anything not cut by expert), then one step per bank expert:
// DST's slice of every stack and SRC's expert, which the byte proof's
// prediction of that slice reads too; the shared replicas come first, as
// PairLayer runs them first. The rest of DST (every other tensor, the
// headers, layers left out) follows in file order, with the SRC bytes
// that predict it. Each expert step is let go as soon as both its
// expert's job and the byte proof are done with it, so memory holds the
// read-ahead budget, a head, and the experts in flight, whatever the
// model's size.

// passPlan is the steps of a run's pass and who reads what in them.
type passPlan struct {
	steps  []stream.Step
	layers map[int]*layerSteps // by decoder layer index
	// proof lists, per step, the DST bytes the byte proof takes from it;
	// pieces are the proof's pieces they name.
	proof  [][]proofTake
	pieces []byteproof.Piece
	// layerOf is each step's checked layer, -1 for the rest; display the
	// decoder layer a rest step's DST bytes belong to (-1: none).
	layerOf, display []int
	// holdUntil: the byte proof lets step i go only after step
	// holdUntil[i] (a layer's head, until the layer's last expert).
	holdUntil map[int]int
	// partOf is the checked layer of each part of a large expert.
	partOf map[int]*layerSteps
}

// layerSteps are a checked layer's steps: its head and one per bank
// expert.
type layerSteps struct {
	head int
	bank []int
	// parts are each bank expert's parts after its step bank[b] (none
	// where the expert is not cut: see partsAbove); paired, that the
	// layer's experts are cut, so its check runs each expert's paths band
	// by band together, one expert at a time.
	parts  [][]int
	paired bool
	// released marks the steps the layer checks let go of (each once).
	released map[int]bool
	// read is the bytes the layer's steps read of SRC and of DST; once
	// the bytes among them that no other of its steps reads too, which
	// the progress line sets against read.
	read, once [2]int64
}

// The sides of layerSteps' byte counts.
const (
	srcSide = iota
	dstSide
)

// count adds a step's extents to the layer's byte counts: DST's first
// (ndst of them), then SRC's; spans collects each tensor's ranges.
func (ls *layerSteps) count(st stream.Step, ndst int, spans map[*checkpoint.Tensor][][2]int64) {
	for i, x := range st.Extents {
		side := srcSide
		if i < ndst {
			side = dstSide
		}
		ls.read[side] += x.N
		if x.T != nil {
			spans[x.T] = append(spans[x.T], [2]int64{x.Off, x.Off + x.N})
		}
	}
}

// countOnce sets once from the tensors' ranges of the layer's steps
// (spans; dst tells DST's tensors).
func (ls *layerSteps) countOnce(spans map[*checkpoint.Tensor][][2]int64, dst func(*checkpoint.Tensor) bool) {
	for t, rs := range spans {
		side := srcSide
		if dst(t) {
			side = dstSide
		}
		for _, r := range mergeRanges(rs) {
			ls.once[side] += r[1] - r[0]
		}
	}
}

// order is the layer's bank experts in the order of their steps.
func (ls *layerSteps) order() []int {
	out := rangeOf(0, len(ls.bank))
	slices.SortFunc(out, func(a, b int) int { return ls.bank[a] - ls.bank[b] })
	return out
}

// proofTake is one DST extent of a step that the byte proof takes: the
// step's extent e, bytes off.. of passPlan.pieces[piece]. There is one for
// every DST extent (a stack's slice of each expert): the piece is named by
// its index, not copied into each.
type proofTake struct {
	e, piece int32
	off      int64
}

// passBudget is the pass's budget (0: stream's default); tests shrink it
// to the least, where only the reads consumers wait for get in.
var passBudget int64

// restChunk bounds one DST read of the rest: a multiple of every dtype's
// size, so that a chunk of a tensor starts on an element.
const restChunk = 8 << 20

// restStep is about how many DST bytes of the rest one step reads (a
// chunk more at most). The rest is the byte proof's alone, which takes a
// step at once; the pass's default budget holds two of its largest
// (stream.Step.Trailing), so a step of 32 MiB (66 MB with its SRC bytes)
// had a Kimi-K2 INT4 layer of 6 MB experts read 132 MB ahead, each page
// of it new to the process; at 8 MiB the layer's steps size the budget.
const restStep = 8 << 20

// stepBuilder collects one step's extents: DST's, with what the byte
// proof takes of them, and SRC's, merged per tensor.
type stepBuilder struct {
	dst   []stream.Extent
	takes []proofTake
	src   map[*checkpoint.Tensor][][2]int64
	order []*checkpoint.Tensor
	// consume: a part of a large expert, every byte of which the layer
	// check reads once and reports (stream.Extent.Consume).
	consume bool
	// minus are parts whose SRC bytes this step leaves out (a large
	// expert's first step holds what its parts do not).
	minus []*stepBuilder
}

// Large experts are cut into parts (a CPU pass only, and only with the
// byte proof, whose prediction pairs each part of DST's slice with the SRC
// bytes it copies): an expert whose DST slice is over partsAbove bytes
// gets a step of its small tensors (scales, biases) and then one step per
// partBytes of each weight of at least partMin bytes, each with its SRC
// bytes. Both paths read the weights a band at a time in that order
// (cpuref's paired run), report each band consumed, and each part goes as
// soon as both are past it: the pass holds a few parts of an expert,
// whatever its size, instead of the whole expert a job (704 MB for one of
// Mixtral's in bf16, SRC's and DST's).
// partMin is tensorload's LazyBytes: a weight that large is read a band
// at a time. Tests shrink the three.
var (
	partsAbove int64 = 64 << 20
	partBytes  int64 = 16 << 20
)

// partsBudget is the read-ahead of a pass that cuts experts into parts:
// 256 MiB, eight parts of SRC's and DST's 16 MiB each (a pass of whole
// experts reads four of its largest steps ahead, up to stream.MaxBudget).
const partsBudget = 256 << 20

// addSrc adds bytes [off, off+n) of SRC tensor t to b: for a view (the
// byte proof predicts gpt-oss's and Llama 4's stacked experts from views
// of them), the bytes of the stored tensor its reads take, so that the
// pass reads them once for the stack and every view of it.
func (b *stepBuilder) addSrc(t *checkpoint.Tensor, off, n int64) {
	if t == nil || n <= 0 {
		return
	}
	t, off, end := t.StoredSpan(off, n)
	n = end - off
	if b.src == nil {
		b.src = map[*checkpoint.Tensor][][2]int64{}
	}
	if _, ok := b.src[t]; !ok {
		b.order = append(b.order, t)
	}
	b.src[t] = append(b.src[t], [2]int64{off, off + n})
}

// step is the builder's step, SRC ranges of one tensor merged, less what
// skip (a layer's head) already holds.
func (b *stepBuilder) step(users int, skip *stepBuilder) (stream.Step, []proofTake) {
	exts := slices.Clone(b.dst)
	takes := slices.Clone(b.takes)
	for _, t := range b.order {
		for _, r := range mergeRanges(b.src[t]) {
			if skip != nil && skip.covers(t, r) {
				continue
			}
			var held [][2]int64
			for _, m := range b.minus {
				held = append(held, m.src[t]...)
			}
			for _, r := range subtractRanges(r, mergeRanges(held)) {
				exts = append(exts, stream.Extent{T: t, Off: r[0], N: r[1] - r[0]})
			}
		}
	}
	if b.consume {
		for i := range exts {
			exts[i].Consume = true
		}
	}
	return stream.Step{Extents: exts, Users: users}, takes
}

// subtractRanges is r less the sorted, disjoint ranges rs.
func subtractRanges(r [2]int64, rs [][2]int64) [][2]int64 {
	var out [][2]int64
	cur := r[0]
	for _, h := range rs {
		if h[1] <= cur || h[0] >= r[1] {
			continue
		}
		if h[0] > cur {
			out = append(out, [2]int64{cur, h[0]})
		}
		cur = max(cur, h[1])
	}
	if cur < r[1] {
		out = append(out, [2]int64{cur, r[1]})
	}
	return out
}

// covers reports whether the builder's SRC ranges of t hold all of r.
func (b *stepBuilder) covers(t *checkpoint.Tensor, r [2]int64) bool {
	for _, h := range mergeRanges(b.src[t]) {
		if h[0] <= r[0] && r[1] <= h[1] {
			return true
		}
	}
	return false
}

// mergeRanges sorts byte ranges and joins those that overlap or touch.
func mergeRanges(rs [][2]int64) [][2]int64 {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b [2]int64) int { return int(min(max(a[0]-b[0], -1), 1)) })
	var out [][2]int64
	for _, r := range rs {
		if n := len(out); n > 0 && r[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], r[1])
			continue
		}
		out = append(out, r)
	}
	return out
}

// planPass lays out the pass of targets (every one with both sides);
// proof nil: no byte proof, the layers' bytes alone.
func (s *session) planPass(targets []target, proof *byteproof.Stream) *passPlan {
	pp := &passPlan{layers: map[int]*layerSteps{}, holdUntil: map[int]int{}, partOf: map[int]*layerSteps{}}
	users := 1
	var pieces map[string]int32
	if proof != nil {
		users = 2
		pp.pieces = proof.Pieces()
		pieces = map[string]int32{}
		for i, p := range pp.pieces {
			if p.Tensor != "" {
				pieces[p.Tensor] = int32(i)
			}
		}
	}
	var counting *layerSteps // the layer whose steps add counts
	spans := map[*checkpoint.Tensor][][2]int64{}
	add := func(b *stepBuilder, layer, display int, skip *stepBuilder, u int) int {
		st, takes := b.step(u, skip)
		// The rest of DST, after the layers, is the byte proof's alone,
		// which compares and lets each step go at once: the read-ahead
		// is sized by the layers' steps, which the checks hold for long
		// (four 66 MB rest steps had a Kimi-K2 INT4 layer of 6 MB
		// experts read 265 MB ahead, each page of it new memory).
		st.Trailing = layer < 0
		if counting != nil {
			counting.count(st, len(b.dst), spans)
		}
		pp.steps = append(pp.steps, st)
		pp.proof = append(pp.proof, takes)
		pp.layerOf = append(pp.layerOf, layer)
		pp.display = append(pp.display, display)
		return len(pp.steps) - 1
	}
	// dstPart adds bytes [off, off+n) of DST tensor t to b, and what
	// predicts them.
	dstPart := func(b *stepBuilder, t *checkpoint.Tensor, off, n int64) {
		b.dst = append(b.dst, stream.Extent{T: t, Off: off, N: n})
		if proof == nil {
			return
		}
		if p, ok := pieces[t.Name]; ok {
			b.takes = append(b.takes, proofTake{e: int32(len(b.dst) - 1), piece: p, off: off})
		}
		for _, r := range proof.Predicted(t.Name, off, n) {
			b.addSrc(r.T, r.Off, r.N)
		}
	}
	taken := map[string]bool{} // DST tensors the layers' steps read
	// layer lays out one MoE layer: its head, then a step per bank
	// expert, each read by users.
	layer := func(tg target, users int) *layerSteps {
		fl, l := tg.fused, tg.src
		bank := fl.Contract.BankSize()
		ls := &layerSteps{released: map[int]bool{}}
		head := &stepBuilder{}
		experts := make([]stepBuilder, bank)
		parts := make([][]*stepBuilder, bank) // a large expert's parts
		stacks, rest := dstLayerTensors(fl)
		split := s.passParts && proof != nil && users == 2 && s.expertSliceBytes(stacks, bank) > partsAbove
		weights := fl.Names.NamesOf(layout.RoleWeight)
		for _, name := range append(stacks, rest...) {
			name = checkpoint.BaseName(name) // a view reads the tensor it is cut from
			t, ok := s.dst.Tensor(name)
			if !ok || taken[name] {
				continue
			}
			taken[name] = true
			if sz, ok := sliceBytes(t, bank); ok && slices.Contains(stacks, name) {
				cut := split && sz >= tensorload.LazyBytes && slices.Contains(weights, name) && proof.Spans(name) == nil
				for b := range bank {
					if !cut {
						dstPart(&experts[b], t, int64(b)*sz, sz)
						continue
					}
					for off := int64(0); off < sz; off += partBytes {
						pb := &stepBuilder{consume: true}
						dstPart(pb, t, int64(b)*sz+off, min(partBytes, sz-off))
						parts[b] = append(parts[b], pb)
					}
				}
				continue
			}
			dstPart(head, t, 0, t.NumBytes())
		}
		for _, name := range srcHeadTensors(l) {
			s.addSrcTensor(head, name, -1, 0)
		}
		for b, m := range l.Experts {
			experts[b].minus = parts[b]
			for _, name := range mlpTensors(m) {
				s.addSrcTensor(&experts[b], name, b, len(l.Experts))
			}
		}
		layerOf := tg.index
		if users == 1 {
			layerOf = -1 // read for the byte proof alone
		}
		counting = ls
		ls.head = add(head, layerOf, tg.index, nil, users)
		order := append(rangeOf(len(l.Experts), bank), rangeOf(0, len(l.Experts))...)
		ls.bank = make([]int, bank)
		ls.parts = make([][]int, bank)
		before := len(pp.partOf)
		for _, b := range order {
			ls.bank[b] = add(&experts[b], layerOf, tg.index, head, users)
			for _, pb := range parts[b] {
				i := add(pb, layerOf, tg.index, head, users)
				ls.parts[b] = append(ls.parts[b], i)
				pp.partOf[i] = ls
			}
		}
		ls.paired = len(pp.partOf) > before // experts were cut (not every weight can be)
		ls.countOnce(spans, func(t *checkpoint.Tensor) bool { d, ok := s.dst.Tensor(t.Name); return ok && d == t })
		counting = nil
		clear(spans)
		// The proof compares the replicas with the head's shared expert:
		// it lets the head go after the layer's last step.
		pp.holdUntil[ls.head] = len(pp.steps) - 1
		return ls
	}
	checked := map[int]bool{}
	for _, tg := range targets {
		pp.layers[tg.index] = layer(tg, users)
		checked[tg.index] = true
	}
	if proof == nil {
		return pp
	}
	// Layers left out of the checks, for the byte proof alone.
	for _, tg := range s.allLayers {
		if !checked[tg.index] {
			layer(tg, 1)
		}
	}
	// The rest of DST, in file order, a few chunks a step.
	var cur stepBuilder
	var curBytes int64
	curLayer := -1
	flush := func() {
		if len(cur.dst) > 0 {
			add(&cur, -1, curLayer, nil, 1)
		}
		cur, curBytes = stepBuilder{}, 0
	}
	for pi, p := range pp.pieces {
		if p.Tensor != "" && taken[p.Tensor] {
			continue
		}
		t, _ := s.dst.Tensor(p.Tensor)
		if p.Tensor == "" || t == nil {
			cur.dst = append(cur.dst, stream.Extent{File: p.Path, Off: p.Off, N: p.N})
			cur.takes = append(cur.takes, proofTake{e: int32(len(cur.dst) - 1), piece: int32(pi)})
			curBytes += p.N
			continue
		}
		spans := proof.Spans(p.Tensor)
		if spans == nil {
			spans = []byteproof.Span{{N: p.N}}
		}
		for _, sp := range spans {
			// A span compared only as a whole (a dequantised or in-out
			// matrix) is one extent, however large; any other goes in
			// chunks.
			chunk := int64(restChunk)
			if sp.Whole {
				chunk = sp.N
			}
			for off := sp.Off; off < sp.Off+sp.N; off += chunk {
				if curBytes >= restStep {
					flush()
				}
				curLayer = decoderLayerOf(p.Tensor)
				n := min(chunk, sp.Off+sp.N-off)
				dstPart(&cur, t, off, n)
				curBytes += n
			}
		}
	}
	flush()
	return pp
}

// rangeOf is lo, lo+1, ..., hi-1.
func rangeOf(lo, hi int) []int {
	var out []int
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}

// sliceBytes is the size of one of n slices of t along its first axis,
// when t is a stack of n.
func sliceBytes(t *checkpoint.Tensor, n int) (int64, bool) {
	if len(t.Shape) == 0 || t.Shape[0] != int64(n) || n < 2 {
		return 0, false
	}
	return t.NumBytes() / int64(n), true
}

// addSrcTensor adds SRC tensor name (or, for a view, the part of its
// stored tensor it reads: expert b's slice of a stack of e, or all of it)
// to b.
func (s *session) addSrcTensor(b *stepBuilder, name string, expert, e int) {
	if name == "" {
		return
	}
	t, ok := s.src.Tensor(checkpoint.BaseName(name))
	if !ok {
		return
	}
	if sz, ok := sliceBytes(t, e); ok && expert >= 0 && checkpoint.BaseName(name) != name {
		b.addSrc(t, int64(expert)*sz, sz)
		return
	}
	b.addSrc(t, 0, t.NumBytes())
}

// dstLayerTensors are the stored DST tensors of a checked layer's fused
// path: its expert stacks (which the plan cuts by expert) and the rest of
// what it reads.
func dstLayerTensors(fl *moelayer.FusedLayer) (stacks, rest []string) {
	stacks = fl.Names.Names() // every role of every stack, in the table's order
	if b := fl.Biases; b != nil {
		stacks = append(stacks, b.Gate, b.Up, b.GateUp, b.Down)
	}
	rest = append([]string{fl.Router, fl.RouterBias, fl.RouterLogitBias, fl.RouterScale, fl.ExpertScale, fl.Prep.RouterScale, fl.Prep.ExpertNorm, fl.SharedGate, fl.HashTable},
		sharedTensors(fl.Shared, fl.SharedExperts)...)
	if lt := fl.Latent; lt != nil {
		rest = append(rest, latentTensors(lt.Down, lt.Norm, lt.Up)...)
	}
	empty := func(s string) bool { return s == "" }
	return slices.DeleteFunc(stacks, empty), slices.DeleteFunc(rest, empty)
}

// srcHeadTensors are what SRC's reference reads of a layer apart from its
// routed experts.
func srcHeadTensors(l *family.Layer) []string {
	return append(append(append([]string{l.Router, l.RouterBias, l.RouterLogitBias, l.RouterScale, l.SharedGate, l.HashTable}, l.InputTensors()...),
		sharedTensors(l.Shared, l.SharedExperts)...), latentTensors(l.LatentDown, l.LatentNorm, l.LatentUp)...)
}

// latentTensors are a latent MoE layer's projections and norm (Kimi K3),
// those it has, for its head step. Each path reads its down projection
// before any expert: outside the head, it sat in a step after the layer's
// experts (DST's) or in none (SRC's), and a tensor read waiting for a
// step lets every step before it in past the budget, so the whole layer's
// experts were read into memory ahead of their readers (34 GB of host
// memory at Kimi K3's 896 experts on the H200).
func latentTensors(down, norm, up string) []string {
	var out []string
	for _, n := range []string{down, norm, up} {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

// sharedTensors are every tensor of a layer's shared experts: the one
// beside the routed ones (nil: none) and those the router weights.
func sharedTensors(shared *family.MLP, routed []family.MLP) []string {
	var names []string
	if shared != nil {
		names = mlpTensors(*shared)
	}
	for _, m := range routed {
		names = append(names, mlpTensors(m)...)
	}
	return names
}

// mlpTensors are every tensor one MLP's weights are stored in.
func mlpTensors(m family.MLP) []string {
	return m.Names()
}

// decoderLayerOf is the decoder layer a tensor belongs to, -1: none.
func decoderLayerOf(name string) int {
	if sm := decoderLayer.FindStringSubmatch(name); sm != nil {
		var v int
		if _, err := fmt.Sscan(sm[1], &v); err == nil {
			return v
		}
	}
	return -1
}

// runStreamed runs the layer checks of targets on the CPU, and with
// withBytes the byte proof, over one streamed pass.
func (s *session) runStreamed(ctx context.Context, targets []target, rep *Report, withBytes bool) error {
	s.passParts = true // the CPU paths read large experts a part at a time
	return s.streamPass(ctx, targets, rep, withBytes, nil, stream.Options{}, 0, func(ctx context.Context, tg target, lp layerPass) ([]LayerResult, error) {
		return s.checkLayerWith(ctx, tg, lp.release, lp.paired)
	})
}

// readLine says what a layer's steps read, and that each byte came once:
// the bytes of SRC and DST read, those of them read twice (two of its
// steps reading the same: none in a good plan), and missed, those the
// layer's reads took from the files around the pass.
func (ls *layerSteps) readLine(missed int64) string {
	twice := ls.read[srcSide] + ls.read[dstSide] - ls.once[srcSide] - ls.once[dstSide]
	return fmt.Sprintf("one pass read SRC %s and DST %s, %s of it twice, %s outside the pass",
		human.Bytes(ls.read[srcSide]), human.Bytes(ls.read[dstSide]), human.Bytes(twice), human.Bytes(missed))
}

// layerPass is what a check of one layer of a streamed pass gets.
type layerPass struct {
	// order is the layer's bank experts in the order the pass reads them.
	order []int
	// budget is the bytes the pass holds at most; head the layer's head
	// step, which the pass holds until the layer is done; step the largest
	// of the layer's bank steps.
	budget, head, step int64
	// release lets a bank expert's step go once the check is done with it
	// (each at most once; the rest go when the check returns).
	release func(bank int)
	// paired: the layer's large experts are cut into parts, which go as
	// the paths report them consumed (layerSteps.paired).
	paired bool
	// proofPast waits until the byte proof has taken bank expert b's step
	// (at once when the run has no proof, or it ended). The byte proof is
	// a user of every step too: readers that run ahead of it while it
	// works (a requantised shared expert's replicas are predicted by
	// requantising SRC's) make the pass read past its budget for them,
	// and every step read meanwhile stays until the proof takes it. A
	// streamed GPU layer's readers wait on it (layerPace).
	proofPast func(ctx context.Context, b int) error
}

// proofMark is how far the byte proof has taken a pass's steps (in step
// order: it takes them one after another).
type proofMark struct {
	mu    sync.Mutex
	cond  *sync.Cond
	next  int  // the steps before next are taken
	ended bool // the proof ended, or there is none: nothing waits
	// want, when set, asks the pass for the step the proof takes next
	// while a reader waits on it: the steps the waiting readers hold may
	// fill the budget, and the proof's next step must still come in.
	want func(step int)
}

func newProofMark(want func(step int)) *proofMark {
	m := &proofMark{want: want}
	m.cond = sync.NewCond(&m.mu)
	return m
}

// taken records steps [0, i] taken.
func (m *proofMark) taken(i int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next = max(m.next, i+1)
	m.cond.Broadcast()
}

// end lets every waiter go, now and from now on.
func (m *proofMark) end() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ended = true
	m.cond.Broadcast()
}

// wait returns once step i is taken, the proof ended, or ctx ends.
func (m *proofMark) wait(ctx context.Context, i int) error {
	var want func()
	if m.want != nil {
		want = func() { m.want(m.next) }
	}
	return condWait(ctx, m.cond, func() bool { return m.ended || m.next > i }, want)
}

// layerBudget is a pass budget that holds a checked layer's head, which
// the pass keeps until the layer's last expert (holdUntil), beside ahead
// of the layer's largest expert step, for the layer that needs most;
// beside it, two of the largest step no layer holds (the byte proof's
// rest of DST, which it lets go at once); within stream's bounds. Bytes
// are the extents' (a step's buffers are a few blocks more). 0 where no
// layer is checked: stream's default.
//
// Stream's default sizes the budget by the largest step of all, the head
// among them: a Kimi-K2 layer's head (its BF16 shared expert, 88 MB) is
// almost twice an expert's step (50 MB of INT4 SRC and DST), so four of
// it held 512 MiB where the head and six experts are 378.
func layerBudget(pp *passPlan, ahead int) int64 {
	stepBytes := func(i int) int64 {
		var n int64
		for _, x := range pp.steps[i].Extents {
			n += x.N
		}
		return n
	}
	var most int64
	for _, ls := range pp.layers {
		var step int64
		for _, i := range ls.bank {
			step = max(step, stepBytes(i))
		}
		most = max(most, stepBytes(ls.head)+int64(ahead)*step)
	}
	if most == 0 {
		return 0
	}
	for i, l := range pp.layerOf {
		if l < 0 {
			most = max(most, 2*stepBytes(i))
		}
	}
	return min(max(most, stream.MinBudget), stream.MaxBudget)
}

// layerCheck checks one target of a streamed pass, reading its bytes
// through the pass.
type layerCheck func(ctx context.Context, tg target, lp layerPass) ([]LayerResult, error)

// streamPass runs check on every target, and with withBytes the byte
// proof, over one streamed pass read as so says (its Budget and Depth; 0:
// stream's defaults) or, where ahead is above 0 and so has no Budget,
// with a budget of each checked layer's head and ahead of its expert
// steps (layerBudget); on names the device in the progress lines (nil:
// none), asked as each layer starts (a GPU run's device opens while the
// pass's first reads come in).
func (s *session) streamPass(ctx context.Context, targets []target, rep *Report, withBytes bool, on func() string, so stream.Options, ahead int, check layerCheck) error {
	var proof *byteproof.Stream
	var early *byteproof.BytesResult
	if withBytes {
		var err error
		if proof, early, err = byteproof.NewStream(s.src, s.dst, s.srcPlan, s.contract); err != nil {
			return err
		}
	}
	pp := s.planPass(targets, proof)
	var pass *stream.Pass // let and consumed run once the pass does
	var mu sync.Mutex
	let := func(ls *layerSteps, i int) {
		mu.Lock()
		defer mu.Unlock()
		if !ls.released[i] {
			ls.released[i] = true
			pass.Release(i)
		}
	}
	// A part of a large expert goes once both paths report every byte of
	// it consumed.
	consumed := func(i int) {
		if ls := pp.partOf[i]; ls != nil {
			s.partsConsumed.Add(1)
			let(ls, i)
		}
	}
	budget := passBudget // a test's override first, then the caller's
	if budget == 0 {
		budget = so.Budget
	}
	if budget == 0 && ahead > 0 {
		budget = layerBudget(pp, ahead)
	}
	if budget == 0 && len(pp.partOf) > 0 {
		// Parts are small: read further ahead than four of them, so that
		// the disk keeps reading while a job waits on none.
		budget = partsBudget
	}
	var err error
	so.Budget, so.OnRead, so.OnConsumed = budget, s.meter.streamRead(pp), consumed
	pass, err = stream.New(pp.steps, so)
	if err != nil {
		return err
	}
	// The pass holds where every extent lies; the plan's own list of them
	// (one for each SRC tensor and each DST slice) is not read again.
	for i := range pp.steps {
		pp.steps[i].Extents = nil
	}
	s.meter.planStream(pp, targets, pass.StepBytes)
	defer pass.Close()
	defer func() { s.streamMisses = pass.Misses() }()
	pass.Install(s.src)
	pass.Install(s.dst)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pass.Start(ctx)
	var proofErr error
	proofDone := make(chan struct{})
	mark := newProofMark(pass.Want)
	go func() {
		defer close(proofDone)
		defer mark.end()
		proofErr = s.feedProof(ctx, pass, pp, proof, mark)
	}()
	// The byte proof compares bytes the pass lends: it ends before the
	// pass closes, however the run ends.
	defer func() {
		cancel()
		<-proofDone
	}()

	var sharing *layerSteps // a head kept for the next target, its sibling bank
	for i, tg := range targets {
		if err := ctx.Err(); err != nil {
			return err
		}
		where := ""
		if on != nil {
			where = on()
		}
		s.o.progress("validate: layer %s (%d of %d)%s", tg.label(), i+1, len(targets), where)
		ls := pp.layers[tg.index]
		lp := layerPass{order: ls.order(), budget: pass.Budget(), head: pass.StepBytes(ls.head), paired: ls.paired, release: func(b int) {
			let(ls, ls.bank[b])
			for _, st := range ls.parts[b] {
				let(ls, st)
			}
		}, proofPast: func(ctx context.Context, b int) error { return mark.wait(ctx, ls.bank[b]) }}
		for _, st := range ls.bank {
			lp.step = max(lp.step, pass.StepBytes(st))
		}
		missed := pass.MissedBytes()
		rows, err := check(ctx, tg, lp)
		if err == nil {
			s.o.progress("validate: layer %s: %s", tg.label(), ls.readLine(pass.MissedBytes()-missed))
		}
		// The second routed bank of a decoder layer (ERNIE-4.5-VL) reads
		// what the first's head holds and it does not: the shared MLP and
		// the correction bias. That head goes when both are done.
		if sharing != nil {
			let(sharing, sharing.head)
			sharing = nil
		}
		if i+1 < len(targets) && targets[i+1].layer == tg.layer {
			sharing = ls
		} else {
			let(ls, ls.head)
		}
		for b, st := range ls.bank {
			let(ls, st)
			for _, st := range ls.parts[b] {
				let(ls, st)
			}
		}
		if err != nil {
			return err
		}
		rep.Rows = append(rep.Rows, rows...)
	}
	s.meter.finishLayers()
	// A pass of no layers (validate --bytes) measured nothing of a
	// requantised shared expert, and its report does not say so: it is the
	// byte proof's alone, as CheckBytes' is.
	if n := s.requantNote(rep.Rows); n != "" && check != nil {
		rep.Notes = append(rep.Notes, n)
	}
	if !withBytes {
		return nil
	}
	s.meter.startBytes()
	s.o.progress("validate: --bytes: every DST file against SRC, the contract and the manifest, every tensor byte for byte")
	if <-proofDone; proofErr != nil {
		return proofErr
	}
	if early != nil {
		rep.Bytes = early
		return nil
	}
	res, err := proof.Result(ctx)
	if err != nil {
		return err
	}
	s.rechecked, s.reread = proof.Rechecked, proof.Reread
	rep.Bytes = res
	s.noteExcluded(rep)
	return nil
}

// feedProof hands the byte proof its bytes, step after step, and lets
// each step go, marking each taken; without a proof it does nothing.
func (s *session) feedProof(ctx context.Context, pass *stream.Pass, pp *passPlan, proof *byteproof.Stream, mark *proofMark) error {
	if proof == nil {
		return nil
	}
	after := map[int][]int{} // steps to let go once step i is done
	for i, j := range pp.holdUntil {
		after[j] = append(after[j], i)
	}
	for i := range pp.steps {
		if err := pass.Wait(ctx, i); err != nil {
			return err
		}
		for _, tk := range pp.proof[i] {
			if err := proof.Take(pp.pieces[tk.piece], tk.off, pass.Bytes(i, int(tk.e))); err != nil {
				return err
			}
		}
		mark.taken(i)
		if _, held := pp.holdUntil[i]; !held || pp.holdUntil[i] == i {
			pass.Release(i)
		}
		for _, h := range after[i] {
			if h != i {
				pass.Release(h)
			}
		}
	}
	return nil
}

// expertSliceBytes is the bytes of one bank expert's slices of the stacks
// (of bank experts each).
func (s *session) expertSliceBytes(stacks []string, bank int) int64 {
	var n int64
	for _, name := range stacks {
		if t, ok := s.dst.Tensor(checkpoint.BaseName(name)); ok {
			if sz, ok := sliceBytes(t, bank); ok {
				n += sz
			}
		}
	}
	return n
}
