package moe

import (
	"bytes"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sync/errgroup"
)

// An MLP's work on its tokens is three banded products, each followed by
// what it makes possible. Stages hands them out one at a time so that two
// MLPs holding the same weights (SRC's expert and DST's copy of it) can
// run their products band by band together (RunPaired): both then read
// their stored bytes in the same row order, and a stream that holds the two
// sides' bytes of a band together can let them go once both are done with
// them, instead of holding the whole expert while one path runs after the
// other (one Mixtral expert is 700 MB of bf16 on the two sides).

// The stages, in the order both paths run them: the gate product first
// (so that a gate-up stack's rows are read in stored order), then up, then
// down.
const (
	StageGate = iota
	StageUp
	StageDown
	NumStages
)

// BandProduct is one stage's product: the weight (W, or Dense where W is
// nil) of Rows x Cols, and F, the work on each band of its rows (called
// concurrently for different bands; each writes its own rows' outputs).
//
// Tokens, X and Y, where set, say what F multiplies: X(i) is token i's
// input row (Cols values) and Y(i) where F writes its outputs (Rows
// values, one a weight row). Of two products run paired (RunPaired) whose
// weight rows hold the same bytes (SameRows) and whose tokens are the
// same, bit for bit and in the same order, the second takes the first's
// outputs of those rows instead of multiplying them again: one product,
// computed once, by the first side's arithmetic; where the second's rows
// are the first's with a factor folded into their scales (ScaledRows), it
// takes the first's outputs times the factor.
type BandProduct struct {
	W          Weight
	Dense      []float32
	Rows, Cols int
	F          func(r0, r1 int, band []float32)
	Tokens     int
	X, Y       func(i int) []float32
}

// sameTokens reports whether a and b multiply the same token rows, bit for
// bit and in the same order (both name them).
func sameTokens(a, b BandProduct) bool {
	if a.X == nil || b.X == nil || a.Y == nil || b.Y == nil || a.Tokens != b.Tokens || a.Tokens <= 0 {
		return false
	}
	for i := range a.Tokens {
		x, y := a.X(i), b.X(i)
		if len(x) < a.Cols || len(y) < a.Cols || len(a.Y(i)) < a.Rows || len(b.Y(i)) < a.Rows {
			return false
		}
		if !bytes.Equal(floatBytes(x[:a.Cols]), floatBytes(y[:a.Cols])) {
			return false
		}
	}
	return true
}

// floatBytes is v's memory as bytes, for a comparison of bits (where == on
// floats would take -0 for 0 and no NaN for itself).
func floatBytes(v []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}

// band is the rows p's bands start at a multiple of.
func (p BandProduct) band() int {
	if p.W == nil {
		return 1
	}
	return p.W.Band()
}

// Stages is one MLP's computation on its tokens, stage by stage.
type Stages interface {
	// Product is stage i's product; ok false where the MLP has none (an
	// ungated MLP's gate).
	Product(i int) (p BandProduct, ok bool)
	// After ends stage i once its product is done (the activation after
	// up, the bias and the output rows after down).
	After(i int) error
}

// RunStages runs s alone, par bands of a product at once.
func RunStages(s Stages, par int) error {
	for i := range NumStages {
		if p, ok := s.Product(i); ok {
			if err := eachBand(p.W, p.Dense, p.Rows, p.Cols, par, p.F); err != nil {
				return err
			}
		}
		if err := s.After(i); err != nil {
			return err
		}
	}
	return nil
}

// RunPaired runs a and b together, stage by stage, par bands at once: of
// two products of one shape whose bands start alike, band r of a and then
// band r of b, in row order; other products one after the other. Each
// output is the one RunStages gives (a band's outputs are its rows'
// alone). A side stops at its first error (the lowest band's), which is
// returned as its own; the other side goes on.
func RunPaired(a, b Stages, par int) (errA, errB error) {
	for i := range NumStages {
		pa, okA := a.Product(i)
		pb, okB := b.Product(i)
		if errA != nil {
			okA = false
		}
		if errB != nil {
			okB = false
		}
		switch {
		case okA && okB && pa.Rows == pb.Rows && pa.Cols == pb.Cols && pa.band() == pb.band():
			ea, eb := pairedBands(pa, pb, par)
			errA, errB = cmpErr(errA, ea), cmpErr(errB, eb)
		default:
			if okA {
				errA = eachBand(pa.W, pa.Dense, pa.Rows, pa.Cols, par, pa.F)
			}
			if okB {
				errB = eachBand(pb.W, pb.Dense, pb.Rows, pb.Cols, par, pb.F)
			}
		}
		if errA == nil {
			errA = a.After(i)
		}
		if errB == nil {
			errB = b.After(i)
		}
		if errA != nil && errB != nil {
			return errA, errB
		}
	}
	return errA, errB
}

// cmpErr is the earlier of two errors (have first).
func cmpErr(have, got error) error {
	if have != nil {
		return have
	}
	return got
}

// pairedChunk is about how many weight values a paired run multiplies on
// one side before it turns to the other: one band (bandElems, 1 MiB of
// float32), so a band that both sides take (SameRows) is multiplied by
// the second side while the first side's decode has left it in the cache.
// Chunks of 16 bands (16 MiB) kept the token rows of a side in the cache
// instead, but wrote and read every band through memory: on the 2-core
// AVX2 machine gpt-oss's MXFP4 layer took 17% more CPU time (the decode
// and the float32 products both twice as long; BENCHMARKS.md, issue 45).
// The order of bands does not change a value: each band writes its own
// rows.
const pairedChunk = bandElems

// SameRows is a Weight that can tell that its rows [r0, r1) decode to the
// very values another weight's rows do (the same stored bytes, scales and
// format: DST's copy of SRC's expert), so that a paired run decodes them
// once for both. Comparing bytes costs a fraction of decoding them.
type SameRows interface {
	SameRows(o Weight, r0, r1 int) bool
}

// ScaledRows is a Weight that can tell that its rows [r0, r1) are another
// weight's with a factor folded into their scales: the same stored
// elements, each scale entry the other's times factor rounded once to its
// float32 (DST's routed expert where convert folded routed_scaling_factor
// into its scales). Its product by the same tokens is then the other's
// times factor, to within the roundings of the scales and the values (3u
// of the products' magnitudes, u = 2^-24) and of that multiply: far
// closer than a product's own float32 sums come to the exact one (blasdot:
// hundreds of u), so a paired run takes it so instead of multiplying.
type ScaledRows interface {
	ScaledRows(o Weight, r0, r1 int) (factor float64, ok bool)
}

// decoded is one band of a paired run's first side: its values (nil when
// it failed or was skipped), ready once they are written.
type decoded struct {
	bp    *[]float32
	done  bool // the band's outputs are written
	ready chan struct{}
}

// pairedBands runs two products of one shape and banding together: a
// chunk of bands of a, then the same rows of b, chunk after chunk, par
// bands at once. A band of b whose rows hold a's bytes (SameRows) takes
// a's decoded values instead of decoding its own, and where the two
// multiply the same tokens (sameTokens), a's outputs of those rows instead
// of multiplying; a band of b whose rows are a's with a factor folded into
// their scales (ScaledRows) takes a's outputs times the factor there, where
// a's band wrote them. A side's error is its lowest band's; its later
// bands are skipped.
func pairedBands(a, b BandProduct, par int) (errA, errB error) {
	rows, cols := a.Rows, a.Cols
	for _, p := range []BandProduct{a, b} {
		if p.W == nil && len(p.Dense) < rows*cols {
			return fmt.Errorf("weight has %d values, want %d x %d", len(p.Dense), rows, cols), nil
		}
	}
	n := bandRows(rows, cols, a.band())
	chunk := n * max(1, pairedChunk/max(n*cols, 1))
	same, _ := b.W.(SameRows)
	scaled, _ := b.W.(ScaledRows)
	if a.W == nil {
		same, scaled = nil, nil
	}
	share := (same != nil || scaled != nil) && sameTokens(a, b)
	var mu sync.Mutex
	failed := [2]int{rows, rows} // each side's lowest failing band (rows: none)
	var errs [2]error
	fail := func(side, r0 int, err error) {
		mu.Lock()
		defer mu.Unlock()
		if r0 < failed[side] {
			failed[side], errs[side] = r0, err
		}
	}
	live := func(side, r0 int) bool {
		mu.Lock()
		defer mu.Unlock()
		return r0 < failed[side]
	}
	get := func() *[]float32 {
		bp, _ := bandPool.Get().(*[]float32)
		if bp == nil || cap(*bp) < n*cols {
			buf := make([]float32, n*cols)
			bp = &buf
		}
		return bp
	}
	var g errgroup.Group
	g.SetLimit(max(par, 1))
	for c0 := 0; c0 < rows; c0 += chunk {
		c1 := min(rows, c0+chunk)
		var firsts []*decoded // a's bands of the chunk, kept for b where same
		for r0 := c0; r0 < c1; r0 += n {
			r1 := min(rows, r0+n)
			d := &decoded{ready: make(chan struct{})}
			firsts = append(firsts, d)
			g.Go(func() error {
				defer close(d.ready)
				if !live(0, r0) {
					return nil
				}
				if a.W == nil {
					a.F(r0, r1, a.Dense[r0*cols:r1*cols])
					return nil
				}
				bp := get()
				band := (*bp)[:(r1-r0)*cols]
				if err := a.W.Rows(r0, r1, band); err != nil {
					bandPool.Put(bp)
					fail(0, r0, err)
					return nil
				}
				a.F(r0, r1, band)
				d.done = true
				if same == nil {
					bandPool.Put(bp)
				} else {
					d.bp = bp
				}
				return nil
			})
		}
		for k, r0 := 0, c0; r0 < c1; k, r0 = k+1, r0+n {
			r1 := min(rows, r0+n)
			d := firsts[k]
			g.Go(func() error {
				<-d.ready
				defer func() {
					if d.bp != nil {
						bandPool.Put(d.bp)
					}
				}()
				if !live(1, r0) {
					return nil
				}
				if b.W == nil {
					b.F(r0, r1, b.Dense[r0*cols:r1*cols])
					return nil
				}
				if d.bp != nil && same.SameRows(a.W, r0, r1) {
					if share {
						for i := range b.Tokens {
							copy(b.Y(i)[r0:r1], a.Y(i)[r0:r1])
						}
						return nil
					}
					b.F(r0, r1, (*d.bp)[:(r1-r0)*cols])
					return nil
				}
				if share && scaled != nil && d.done {
					if f, ok := scaled.ScaledRows(a.W, r0, r1); ok {
						for i := range b.Tokens {
							ya, yb := a.Y(i)[r0:r1], b.Y(i)[r0:r1]
							for r, v := range ya {
								yb[r] = float32(f * float64(v))
							}
						}
						return nil
					}
				}
				bp := get()
				defer bandPool.Put(bp)
				band := (*bp)[:(r1-r0)*cols]
				if err := b.W.Rows(r0, r1, band); err != nil {
					fail(1, r0, err)
					return nil
				}
				b.F(r0, r1, band)
				return nil
			})
		}
	}
	_ = g.Wait() // the bands report through fail
	return errs[0], errs[1]
}
