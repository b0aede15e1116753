package blasdot

import "unsafe"

// The kernels in Go: what the assembly computes, step for step, except
// that Go cannot write a float32 fused multiply-add, so the twins round
// each product before adding it. They may therefore differ from the
// assembly in the last bits; both are held to the same bound on the
// distance from the exact dot product (blasdot_test.go, deviation_test.go),
// not to each other's bits. A build without the assembly runs the twins.

// sdot4x3 (the fused path's) sums the products of x row t (t < 4) and w
// row r (r < 3) over a piece of k (a multiple of 8, at most kc32; rows ldx
// and ldw apart) in eight float32 lanes from zero, lane l taking the
// elements l, l+8, l+16, ... in order, and adds lane l to
// lanes[(t*3+r)*8+l] in float32. SgemmNT folds an output's eight lanes
// once, after the last piece of k.
func sdot4x3Go(x []float32, ldx int, w []float32, ldw int, k int, lanes *[96]float32) {
	for t := range 4 {
		xt := x[t*ldx : t*ldx+k]
		for r := range 3 {
			wr := w[r*ldw : r*ldw+k]
			a := lanes8(xt, wr, k)
			for l, v := range a {
				lanes[(t*3+r)*8+l] += v
			}
		}
	}
}

// rdot3x4 (the reference's) takes the token rows three at a time, a group
// g of x[3g:3g+3] (pointers to the rows where the caller holds them, each
// read from element off on), against the same four w rows (r < 4): for
// each token t and row r it sums their products over a piece of k (a
// multiple of 8, at most kc64) in eight float32 lanes from zero, as
// sdot4x3 does, then widens lanes j and j+4 to float64 (exactly), adds
// them and adds that to the float64 lane lanes[g*48+(t*4+r)*4+j]. A
// float32 lane so sums at most kc64/8 products; every addition after is
// in float64.
func rdot3x4Go(x []*float32, off int, w []float32, ldw int, k int, lanes []float64) {
	for g := range len(x) / 3 {
		for t := range 3 {
			xt := unsafe.Slice(x[g*3+t], off+k)[off:]
			for r := range 4 {
				wr := w[r*ldw : r*ldw+k]
				a := lanes8(xt, wr, k)
				d := lanes[g*48+(t*4+r)*4 : g*48+(t*4+r)*4+4]
				for j := range d {
					d[j] += float64(a[j]) + float64(a[j+4])
				}
			}
		}
	}
}

// lanes8 sums the products of x and w (k a multiple of 8) in eight float32
// lanes from zero: lane l the products of elements l, l+8, l+16, ... in
// order, each product rounded to float32 before it is added (Go writes no
// float32 fused multiply-add). Both kernels' twins sum a piece so.
func lanes8(x, w []float32, k int) (a [8]float32) {
	for p := 0; p < k; p += 8 {
		for l := range 8 {
			a[l] += float32(x[p+l] * w[p+l])
		}
	}
	return a
}
