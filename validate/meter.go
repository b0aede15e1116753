package validate

import (
	"fmt"
	"github.com/moeprep/moeprep/layout"
	"io"
	"regexp"
	"strconv"
	"sync"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/validate/moelayer"
)

// Reporter receives a run's byte progress (Options.ByteProgress): Total
// once the run is planned, Add as the run's reads land (from many
// goroutines), Stage when the layer or phase changes, e.g. "layer 12
// (5 of 58) reading SRC experts". internal/progress.Status satisfies it.
type Reporter interface {
	Total(n int64)
	Add(n int64)
	Stage(s string)
}

// The sides a read comes from, as the stage names them.
const (
	sideSRC  = "SRC"
	sideDST  = "DST"
	sideBoth = "SRC and DST" // a streamed pass reads them side by side
)

// meter turns the bytes the run reads into progress. Every tensor of the
// opened checkpoints reads through a counting reader that knows its side
// and layer, so the CPU paths, the GPU stager and the byte proof are all
// counted where they read, without any of them knowing.
//
// The layer checks' total is planned from the layers' tensors, and each
// read counts for the layer its tensor belongs to, whenever it happens
// (the GPU loads the next layer's bank during this one). A layer reads less
// than planned when tokens leave experts untouched (goldens alone,
// --sample-experts), so a finished layer counts as its whole plan; and a
// layer never counts more than its plan (--io-baseline reads each layer
// again): the count neither stalls nor runs past the total. The byte proof
// counts the SRC bytes it compares, which is every DST tensor byte.
type meter struct {
	rep Reporter
	// planned, when set, hears the plan once: the layer checks' bytes
	// and the byte proof's (the run's estimate, estimate.go).
	planned func(layerBytes, proofBytes int64)

	mu         sync.Mutex
	layers     []meterLayer // in run order
	pos        map[int]int  // layer index -> position in layers
	cur        int          // the layer being checked, -1 before the first
	started    bool         // a layer has been the current one
	side       string       // where the current layer's latest read came from
	layersDone int64        // sum over layers of what each counts now
	bytesPhase bool
	bytesTotal int64
	bytesRead  int64
	bytesLayer int // the layer of the byte proof's latest read, -1: none
	reported   int64
	stage      string
	stageKey   stageKey // what stage says, as of its last formatting
	staged     bool
}

type stageKey struct {
	bytesPhase        bool
	bytesLayer, layer int
	side              string
}

type meterLayer struct {
	index         int
	mtp           bool
	planned, read int64
	complete      bool
	counted       int64 // what the layer adds to the progress now
}

// newMeter returns nil (a meter that does nothing) without a reporter.
func newMeter(rep Reporter) *meter {
	if rep == nil {
		return nil
	}
	return &meter{rep: rep, cur: -1, bytesLayer: -1, pos: map[int]int{}}
}

// plan sets the layers in run order with the bytes each will read, and
// the byte proof's total (0: no byte proof), and reports the total.
func (m *meter) plan(layers []meterLayer, bytesTotal int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.layers, m.bytesTotal = layers, bytesTotal
	total := bytesTotal
	for i, l := range layers {
		m.pos[l.index] = i
		total += l.planned
	}
	if m.planned != nil {
		m.planned(total-bytesTotal, bytesTotal)
		m.planned = nil
	}
	m.rep.Total(total)
}

// startLayer marks every layer before index (in run order) finished and
// index the one being checked.
func (m *meter) startLayer(index int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.pos[index]
	if !ok {
		return
	}
	for i := range p {
		m.complete(i)
	}
	if m.cur != p {
		m.cur, m.side = p, ""
	}
	m.started = true
	m.push()
}

// finishLayers marks every layer finished: the layer checks are over.
func (m *meter) finishLayers() { m.endLayers(false) }

// startBytes begins the byte proof's count (its total was planned).
func (m *meter) startBytes() { m.endLayers(true) }

// endLayers marks every layer finished and, with bytes, begins the byte
// proof's count.
func (m *meter) endLayers(bytes bool) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.layers {
		m.complete(i)
	}
	m.cur = -1
	if bytes {
		m.bytesPhase = true
	}
	m.push()
}

// complete counts layer i as its whole plan; m.mu is held.
func (m *meter) complete(i int) {
	l := &m.layers[i]
	if l.complete {
		return
	}
	l.complete = true
	m.layersDone += l.planned - l.counted
	l.counted = l.planned
}

// read records n bytes read from side's tensor of layer (-1: none of the
// layers checked); display is the decoder layer the tensor belongs to, for
// the byte proof's stage.
func (m *meter) read(side string, layer, display int, n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bytesPhase {
		if side == sideSRC {
			m.bytesRead += n
			m.bytesLayer = display
		}
		m.push()
		return
	}
	m.readLayer(side, layer, n)
}

// readLayer counts n bytes read from side for checked layer layer (none
// when it is not one); m.mu is held.
func (m *meter) readLayer(side string, layer int, n int64) {
	p, ok := m.pos[layer]
	if !ok {
		return
	}
	l := &m.layers[p]
	l.read += n
	if !l.complete {
		c := min(l.read, l.planned)
		m.layersDone += c - l.counted
		l.counted = c
	}
	if m.cur < 0 && !m.started {
		// The GPU loads the first layer's bank before the layer starts:
		// that is the first layer's work already.
		m.cur, m.started = p, true
	}
	if p == m.cur {
		m.side = side
	}
	m.push()
}

// push reports the bytes counted since the last push and the stage when
// it changed; m.mu is held.
func (m *meter) push() {
	done := m.layersDone + min(m.bytesRead, m.bytesTotal)
	if done > m.reported {
		m.rep.Add(done - m.reported)
		m.reported = done
	}
	// Reads come by the thousand a layer (a transposed view reads a row at
	// a time): the stage is formatted again only when what it says changed.
	if k := (stageKey{m.bytesPhase, m.bytesLayer, m.cur, m.side}); k != m.stageKey || !m.staged {
		m.stageKey, m.staged = k, true
		if st := m.stageNow(); st != m.stage {
			m.stage = st
			m.rep.Stage(st)
		}
	}
}

// stageNow says what the run is doing; m.mu is held.
func (m *meter) stageNow() string {
	switch {
	case m.bytesPhase && m.bytesLayer >= 0:
		return fmt.Sprintf("byte proof, comparing DST with SRC at layer %d", m.bytesLayer)
	case m.bytesPhase:
		return "byte proof, comparing DST with SRC"
	case m.cur < 0:
		return ""
	}
	l := m.layers[m.cur]
	s := fmt.Sprintf("layer %d (%d of %d)", l.index, m.cur+1, len(m.layers))
	if l.mtp {
		s = fmt.Sprintf("layer %d, mtp (%d of %d)", l.index, m.cur+1, len(m.layers))
	}
	if m.side != "" {
		s += " reading " + m.side + " experts"
	}
	return s
}

// meteredData counts the bytes read through one tensor's Data.
type meteredData struct {
	r       io.ReaderAt
	m       *meter
	side    string
	layer   int
	display int
}

func (d *meteredData) ReadAt(p []byte, off int64) (int, error) {
	n, err := d.r.ReadAt(p, off)
	if n > 0 {
		d.m.read(d.side, d.layer, d.display, int64(n))
	}
	return n, err
}

// decoderLayer finds "layers.N." in a tensor name: the layer the byte
// proof's stage names for a tensor outside the checked MoE layers.
var decoderLayer = regexp.MustCompile(`(?:^|\.)layers\.(\d+)\.`)

// wrap makes every tensor of c count its reads as side's; layerOf maps a
// stored tensor's name to its checked layer. Views made later read
// through the wrapped Data, so they count too.
func (m *meter) wrap(c *checkpoint.Checkpoint, side string, layerOf map[string]int) {
	if m == nil || c == nil {
		return
	}
	for _, t := range c.Tensors {
		layer, display := -1, -1
		if l, ok := layerOf[t.Name]; ok {
			layer, display = l, l
		} else if sm := decoderLayer.FindStringSubmatch(t.Name); sm != nil {
			if v, err := strconv.Atoi(sm[1]); err == nil {
				display = v
			}
		}
		if d, ok := t.Data.(*meteredData); ok && d.m == m {
			d.layer, d.display = layer, display // wrapped already: count once
			continue
		}
		t.Data = &meteredData{r: t.Data, m: m, side: side, layer: layer, display: display}
	}
}

// srcLayerNames are the tensors the unfused paths read for one SRC layer
// (the hash table, read a row per token, is left out of the plan).
func srcLayerNames(l *family.Layer) []string {
	names := append([]string{l.Router, l.RouterBias, l.RouterLogitBias, l.RouterScale, l.SharedGate}, l.InputTensors()...)
	for _, e := range l.Experts {
		names = append(names, mlpNames(e)...)
	}
	if l.Shared != nil {
		names = append(names, mlpNames(*l.Shared)...)
	}
	for _, e := range l.SharedExperts {
		names = append(names, mlpNames(e)...)
	}
	return names
}

// dstLayerNames are the tensors the fused paths read for one DST layer.
func dstLayerNames(fl *moelayer.FusedLayer) []string {
	names := []string{fl.Router, fl.RouterBias, fl.RouterLogitBias, fl.RouterScale, fl.ExpertScale, fl.Prep.RouterScale, fl.Prep.ExpertNorm, fl.SharedGate}
	names = append(names, fl.Names.NamesOf(layout.RoleWeight, layout.RoleScale)...)
	if b := fl.Biases; b != nil {
		names = append(names, b.Gate, b.Up, b.GateUp, b.Down)
	}
	if fl.Shared != nil {
		names = append(names, mlpNames(*fl.Shared)...)
	}
	for _, e := range fl.SharedExperts {
		names = append(names, mlpNames(e)...)
	}
	return names
}

func mlpNames(m family.MLP) []string {
	return m.NamesOf(layout.RoleWeight, layout.RoleScale, layout.RoleBias)
}

// layerBytes sums the sizes of names in c (views resolved, each name
// once) and records each stored tensor's layer in layerOf.
func layerBytes(c *checkpoint.Checkpoint, names []string, layer int, layerOf map[string]int) int64 {
	var n int64
	seen := map[string]bool{}
	for _, name := range names {
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		if t, ok := c.Tensor(name); ok {
			n += readCost(name, t.NumBytes())
			layerOf[checkpoint.BaseName(name)] = layer
		}
	}
	return n
}

// transposedView finds a transposed view's last argument, "[T:c0:n:step]".
var transposedView = regexp.MustCompile(`\[T:\d+:(\d+):(\d+)\]$`)

// readCost is what reading a tensor of size bytes takes from its file: its
// size, except for a transposed view (Llama 4, gpt-oss), which reads each
// source row's whole span of its columns, (n-1)*step+1 of them for n: twice
// its size for gpt-oss's interleaved gate and up.
func readCost(name string, size int64) int64 {
	m := transposedView.FindStringSubmatch(name)
	if m == nil {
		return size
	}
	n, err1 := strconv.ParseInt(m[1], 10, 64)
	step, err2 := strconv.ParseInt(m[2], 10, 64)
	if err1 != nil || err2 != nil || n < 1 || step < 1 {
		return size
	}
	return size / n * ((n-1)*step + 1)
}

// planProgress plans the byte progress of the layer checks of targets and
// makes the checkpoints count their reads: per layer, SRC's tensors once
// for the unfused path (twice on a GPU layer the CPU reference also
// checks) and DST's once for the fused path (its whole bank on the GPU).
// withBytes adds the byte proof: every DST tensor byte, compared with SRC.
func (s *session) planProgress(targets []target, withBytes bool) {
	m := s.meter
	if m == nil {
		return
	}
	srcOf, dstOf := map[string]int{}, map[string]int{}
	sampled := map[int]bool{}
	if s.o.Device == DeviceCUDA {
		sampled = refSampled(targets, s.o.CPUCheck)
	}
	var layers []meterLayer
	for _, tg := range targets {
		l := meterLayer{index: tg.index, mtp: tg.mtp}
		if tg.src != nil && s.src != nil {
			b := layerBytes(s.src, srcLayerNames(tg.src), tg.index, srcOf)
			if tg.src.HashTable != "" {
				srcOf[checkpoint.BaseName(tg.src.HashTable)] = tg.index
			}
			if sampled[tg.index] {
				b *= 2
			}
			l.planned += b
		}
		if tg.fused != nil && s.dst != nil {
			l.planned += layerBytes(s.dst, dstLayerNames(tg.fused), tg.index, dstOf)
			if tg.fused.HashTable != "" {
				dstOf[checkpoint.BaseName(tg.fused.HashTable)] = tg.index
			}
		}
		layers = append(layers, l)
	}
	var bytesTotal int64
	if withBytes {
		bytesTotal = s.dst.TotalBytes()
	}
	m.wrap(s.src, sideSRC, srcOf)
	m.wrap(s.dst, sideDST, dstOf)
	m.plan(layers, bytesTotal)
}

// planBytesOnly plans a run that is the byte proof alone.
func (s *session) planBytesOnly() {
	if s.meter == nil {
		return
	}
	s.meter.wrap(s.src, sideSRC, nil)
	s.meter.plan(nil, s.dst.TotalBytes())
}

// planStream plans the progress of a streamed pass (pass.go): each
// checked layer's steps, then the rest of DST for the byte proof, each at
// the bytes the pass reads for it, which it counts as it reads them
// (streamRead): every byte of the run once.
func (m *meter) planStream(pp *passPlan, targets []target, stepBytes func(i int) int64) {
	if m == nil {
		return
	}
	planned := map[int]int64{}
	var rest int64
	for i, l := range pp.layerOf {
		if l < 0 {
			rest += stepBytes(i)
		} else {
			planned[l] += stepBytes(i)
		}
	}
	var layers []meterLayer
	for _, tg := range targets {
		layers = append(layers, meterLayer{index: tg.index, mtp: tg.mtp, planned: planned[tg.index]})
	}
	m.plan(layers, rest)
}

// streamRead is the pass's OnRead: a step's bytes count for its layer, or
// for the byte proof.
func (m *meter) streamRead(pp *passPlan) func(step int, n int64) {
	if m == nil {
		return nil
	}
	return func(i int, n int64) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if layer := pp.layerOf[i]; layer >= 0 {
			m.readLayer(sideBoth, layer, n)
		} else {
			m.bytesRead += n
			if m.bytesPhase {
				m.bytesLayer = pp.display[i]
			}
		}
		m.push()
	}
}
