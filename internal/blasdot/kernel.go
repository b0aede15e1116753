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
// Go twin; single (crowdsL1 of ldw, which the caller works out once for
// all its calls) has a block of eight take one group of rows at a time.
// The callers give whole operands (checked here before the assembly reads
// them without Go's bounds checks).
func tiles(k, width int, tp, w []float32, ldw, groups int, acc32 []float32, acc64 []float64, ld int, single bool) {
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
	wide, narrow := acc64 != nil, width != blockTokens
	if useAVX512 && !narrow && groups >= 2 {
		// Two groups at a time on the AVX-512 kernel; an odd last group
		// on the AVX2 one, as before.
		pairs := groups / 2
		tiles512Asm(k, &tp[0], &w[0], ldw, pairs, accOf(acc32, acc64), ld, wide)
		if groups%2 == 0 {
			return
		}
		done := pairs * 2 * groupRows
		w, acc32, acc64, groups = w[done*ldw:], sub(acc32, done*ld), sub(acc64, done*ld), 1
	}
	tilesAsm(k, &tp[0], &w[0], ldw, groups, accOf(acc32, acc64), ld, wide, narrow, narrow && single)
}

// accOf is the kernel's accumulator pointer: acc64's first element where
// it is given, else acc32's.
func accOf(acc32 []float32, acc64 []float64) unsafe.Pointer {
	if acc64 != nil {
		return unsafe.Pointer(unsafe.SliceData(acc64))
	}
	return unsafe.Pointer(unsafe.SliceData(acc32))
}

// crowdsL1 reports whether twelve weight rows ldw float32 apart put more
// than crowdRows of them in one set of the L1 data cache: 64 sets of
// 64-byte lines (32 KiB of 8 ways, or 48 KiB of 12, on the x86 cores that
// have AVX2). A block of eight tokens takes two groups of six rows at once
// (twelve sums in flight, which both FMA pipes need), reading the twelve
// rows side by side; rows a multiple of 4 KiB apart, as at every model's
// widths (k a multiple of 1024), all fall in one set, whose eight ways
// then cannot hold them and the tokens: most loads wait on L2. Six tokens
// against rows of 2048 or 7168 ran at 18-25 GFLOP/s a CPU second that
// way, and at 55 with the same rows a line further apart each. There the
// kernel takes one group at a time (six rows, six sums in flight, which
// keep the FMA pipes three-quarters busy): 42-50 GFLOP/s. It changes which
// rows run together, not one output's sum (TestNarrowGroupsSameBits).
func crowdsL1(ldw int) bool {
	var n [64]int
	for r := range 2 * groupRows {
		s := r * ldw * 4 / 64 % 64
		if n[s]++; n[s] > crowdRows {
			return true
		}
	}
	return false
}

// crowdRows is at most how many of the twelve rows may share a set: with
// the tokens' line, they leave a way of eight free. Rows 2 KiB apart (six
// in each of two sets) ran faster two groups at once (50 GFLOP/s against
// 45). A variable so that tests can run both ways on one shape.
var crowdRows = 6
