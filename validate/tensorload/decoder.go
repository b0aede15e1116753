package tensorload

import (
	"bytes"
	"reflect"
	"sync"

	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/weightfmt"
)

// A Decoder shares decoded weights between the loads of one job: a weight
// whose stored bytes, scales and global scale are byte for byte those of
// one it already decoded, in the same format and shape, gets that float32
// buffer back instead of a second decode. PairLayer gives each expert's job
// one, so SRC's expert and DST's stacked slice of it, the same bytes where
// convert copied them, are decoded once for both paths; bytes that differ
// (a folded down projection, a corrupted slice) are decoded on their own.
// Decoding is a pure function of what is compared, so sharing changes no
// value. The nil decoder decodes every load afresh.
type Decoder struct {
	mu      sync.Mutex
	entries []*decoded
}

// decoded is one weight decoded for a job, with the inputs it was decoded
// from (the decoder owns those buffers) and how many loads hold it.
type decoded struct {
	decodeInputs
	f          weightfmt.Format
	rows, cols int
	out        []float32
	refs       int
}

// seen reports whether b holds exactly the bytes of an input the decoder
// already decoded from (which were scanned for NaN and Inf then).
func (d *Decoder) seen(b []byte) bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range d.entries {
		for _, in := range [][]byte{e.raw, e.scale, e.global} {
			if len(in) == len(b) && bytes.Equal(in, b) {
				return true
			}
		}
	}
	return false
}

// find returns the buffer decoded from exactly these inputs, taking a
// reference to it, or nil.
func (d *Decoder) find(f weightfmt.Format, rows, cols int, raw, scale, global []byte) []float32 {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range d.entries {
		if e.rows == rows && e.cols == cols && len(e.raw) == len(raw) && bytes.Equal(e.scale, scale) &&
			bytes.Equal(e.global, global) && reflect.DeepEqual(e.f, f) && bytes.Equal(e.raw, raw) {
			e.refs++
			return e.out
		}
	}
	return nil
}

// keep records out, decoded from in, for later loads; it reports whether
// the decoder took the inputs (the caller then must not hand them back).
func (d *Decoder) keep(in decodeInputs, f weightfmt.Format, rows, cols int, out []float32) bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.entries = append(d.entries, &decoded{decodeInputs: in, f: f, rows: rows, cols: cols, out: out, refs: 1})
	return true
}

// put hands back one load's buffer: to the pool once no load holds it.
func (d *Decoder) Put(out []float32) {
	if out == nil {
		return
	}
	if d == nil {
		PutFloats(out)
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, e := range d.entries {
		if len(e.out) == 0 || &e.out[0] != &out[0] {
			continue
		}
		if e.refs--; e.refs == 0 {
			d.entries = append(d.entries[:i], d.entries[i+1:]...)
			e.free()
		}
		return
	}
	PutFloats(out) // not one the decoder shares
}

func (e *decoded) free() {
	PutFloats(e.out)
	e.release()
}

// releaseExpert hands a bank expert's weight buffers back (to dec, which
// loaded them) once the grouped GEMM is done with it.
func (dec *Decoder) ReleaseExpert(m *moe.ExpertMats) {
	dec.Put(m.Gate)
	dec.Put(m.Up)
	dec.Put(m.Down)
	m.Gate, m.Up, m.Down = nil, nil, nil
}
