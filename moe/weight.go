package moe

import (
	"fmt"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/moeprep/moeprep/internal/blasdot"
	"github.com/moeprep/moeprep/internal/cores"
)

// Weight is a [rows, cols] float32 matrix that the products read a band of
// rows at a time: a loader that keeps only a weight's stored bytes decodes
// each band into the caller's buffer, so an expert never holds its float32
// matrices whole (one Mixtral-sized expert is 700 MB of them).
type Weight interface {
	// Band is the rows a band starts at a multiple of (a scale block's
	// rows; 1 where any row may start one).
	Band() int
	// Rows decodes rows [r0, r1) into dst [(r1-r0)*cols].
	Rows(r0, r1 int, dst []float32) error
}

// bandElems is about how many float32 a band holds (1 MiB): small beside
// the experts' bytes, large enough that a band's rows pass over every
// token of a job at once.
const bandElems = 1 << 18

// bandRows is the rows of one band of a rows x cols weight whose bands
// start at multiples of band: about bandElems elements, a multiple of 12
// rows (the products' row groups) where band allows.
func bandRows(rows, cols, band int) int {
	n := max(1, bandElems/max(cols, 1))
	n = max(12, n/12*12)
	if band > 1 {
		n = max(band, n/band*band)
	}
	return min(n, rows)
}

var bandPool sync.Pool // *[]float32

// bandsAtOnce is how many bands a product decodes and multiplies at once:
// the cores that Workers' jobs leave (on 16 cores, 4 jobs of 4 bands), 1
// where the jobs take every core. A band's outputs are its rows' alone, so
// the result is the same however many run at once.
func bandsAtOnce() int { return max(1, cores.N()/Workers()) }

// EachBand calls f for every band of rows of a rows x cols weight, in
// order: with the rows of dense where w is nil (no copy), else decoded
// from w into a pooled buffer f must not keep.
func EachBand(w Weight, dense []float32, rows, cols int, f func(r0, r1 int, band []float32)) error {
	return eachBand(w, dense, rows, cols, 1, f)
}

// eachBand is EachBand with up to par bands at once, f called
// concurrently for different bands.
func eachBand(w Weight, dense []float32, rows, cols, par int, f func(r0, r1 int, band []float32)) error {
	if w == nil {
		if len(dense) < rows*cols {
			return fmt.Errorf("weight has %d values, want %d x %d", len(dense), rows, cols)
		}
		f(0, rows, dense[:rows*cols])
		return nil
	}
	n := bandRows(rows, cols, w.Band())
	var g errgroup.Group
	g.SetLimit(max(par, 1))
	for r0 := 0; r0 < rows; r0 += n {
		r1 := min(rows, r0+n)
		g.Go(func() error {
			bp, _ := bandPool.Get().(*[]float32)
			if bp == nil || cap(*bp) < n*cols {
				b := make([]float32, n*cols)
				bp = &b
			}
			defer bandPool.Put(bp)
			band := (*bp)[:(r1-r0)*cols]
			if err := w.Rows(r0, r1, band); err != nil {
				return err
			}
			f(r0, r1, band)
			return nil
		})
	}
	return g.Wait()
}

// ProductBands is EachBand for a product: bandsAtOnce bands at once, f
// called concurrently for different bands (each writes its own rows'
// outputs).
func ProductBands(w Weight, dense []float32, rows, cols int, f func(r0, r1 int, band []float32)) error {
	return eachBand(w, dense, rows, cols, bandsAtOnce(), f)
}

// SgemmNTBands is blasdot.SgemmNT of a [m,k] (rows lda apart) and the
// weight w (or dense) [n,k] transposed into c [m,n] (rows ldc apart), the
// weight read a band at a time: each output is the same as from the whole
// matrix (blasdot's outputs depend on their two rows alone).
func SgemmNTBands(m, n, k int, a []float32, lda int, w Weight, dense []float32, c []float32, ldc int) error {
	t := blasdot.PackMatrix(m, k, a, lda) // once, for every band
	defer t.Release()
	return ProductBands(w, dense, n, k, func(r0, r1 int, band []float32) {
		t.SgemmNT(r1-r0, band, k, c[r0:], ldc)
	})
}

// BandsAtOnce is how many bands a product decodes and multiplies at once
// (bandsAtOnce), for callers that run Stages.
func BandsAtOnce() int { return bandsAtOnce() }
