package blasdot

import "unsafe"

// The kernel in Go: what the assembly computes, step for step, except
// that Go cannot write a float32 fused multiply-add, so the twin rounds
// each product before adding it. It may therefore differ from the
// assembly in the last bits; both are held to the same bound on the
// distance from the exact dot product (blasdot_test.go, deviation_test.go),
// not to each other's bits. A build without the assembly runs the twin.

// tilesGo is the kernel (kernels_amd64.s's tilesAsm): for each of groups
// groups of six weight rows (row r of group g at w[(6g+r)*ldw:], k
// elements read) against a block of width packed tokens (16, or 8 for a
// last block of eight or fewer; token i's element p at tp[p*width+i]), it
// sums the products of token i and row r over the k elements in order in
// one float32 from zero, then adds that sum to the float32 accumulator
// acc32[(6g+r)*ld+i] or, where acc64 is given, widens it to float64
// (exactly) and adds it to acc64[(6g+r)*ld+i].
func tilesGo(k, width int, tp, w []float32, ldw, groups int, acc32 []float32, acc64 []float64, ld int) {
	var s [blockTokens]float32
	for row := range groups * groupRows {
		sums := s[:width]
		clear(sums)
		wr := w[row*ldw : row*ldw+k]
		for p, v := range wr {
			t := tp[p*width : (p+1)*width]
			for i := range sums {
				sums[i] += float32(t[i] * v)
			}
		}
		for i, v := range sums {
			if acc64 != nil {
				acc64[row*ld+i] += float64(v)
			} else {
				acc32[row*ld+i] += v
			}
		}
	}
}

// tiles runs the assembly where this build and machine have it, else its
// Go twin. The callers give whole operands (checked here before the
// assembly reads them without Go's bounds checks).
func tiles(k, width int, tp, w []float32, ldw, groups int, acc32 []float32, acc64 []float64, ld int) {
	if width != blockTokens && width != blockTokens/2 {
		panic("blasdot: a block of tokens is 16 or 8 wide")
	}
	last := (groups*groupRows-1)*ld + width - 1
	_, _ = tp[k*width-1], w[(groups*groupRows-1)*ldw+k-1]
	if acc64 != nil {
		_ = acc64[last]
	} else {
		_ = acc32[last]
	}
	if !useAsm {
		tilesGo(k, width, tp, w, ldw, groups, acc32, acc64, ld)
		return
	}
	acc, wide := unsafe.Pointer(unsafe.SliceData(acc32)), acc64 != nil
	if wide {
		acc = unsafe.Pointer(unsafe.SliceData(acc64))
	}
	tilesAsm(k, &tp[0], &w[0], ldw, groups, acc, ld, wide, width != blockTokens)
}
