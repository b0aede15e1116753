// Package blasdot computes the products validate's CPU paths ask for: a
// float32 matrix product with the second operand transposed (SgemmNT, the
// fused path's GEMM, float32 sums as the GPU's) and row-by-row dot
// products whose pieces are added in float64 (Dot64Rows, the
// reference's), several tokens against several weight rows at once, both
// on the AVX2/FMA units (kernels_amd64.s) at float32 speed.
//
// Each output is a function of its two rows alone, summed in one fixed
// order (kernel.go says which): it does not depend on how many tokens or
// rows a call carries, so SRC's and DST's paths, which batch tokens
// differently, give the same bits for the same rows. It is not bit-for-bit
// the same across builds: the Go twins, which a build without the assembly
// runs, round each product before adding it where the assembly's fused
// multiply-add does not, so they may differ in the last bits. Both are held
// to the bounds below against the exact dot product, not to each other.
//
// The bounds (u = 2^-24, S = the sum of the products' magnitudes):
//
//   - SgemmNT: eight float32 lanes, each piece of kc32 elements summed
//     from zero (128 products a lane), the pieces added to the lanes and
//     the lanes folded in float32: at most (k/8 + k/kc32 + 4) u S from the
//     exact sum. Measured on random normals at k 2048..14336 (validate's
//     H and I): 1.7e-7..2.3e-7 relative L2 (deviation_test.go holds it
//     under 5e-7; gonum's Sgemm, one lane sum over all of k, 2.6e-7..7e-7).
//   - Dot64Rows: pieces of kc64 = 256 elements summed in eight float32
//     lanes (32 products a lane), then everything in float64, rounded once
//     to float32: at most u |exact| + (kc64/8 + 2) u S, whatever k.
//     Measured 0.9e-7..1.4e-7 relative L2 (held under 2.5e-7). Its
//     products were float64 before (2.7e-8, half an ulp of float32), at
//     half float32's speed; the checks do not need that: the two paths'
//     difference, measured under 3e-7, is what judge.TolFP32 (1e-5)
//     bounds, and it stays 30x under it.
//
// The two are different computations (kernels, token and row blocking,
// pieces, lane folds and precision), so the reference stays an
// independent check of the fused path. Data whose partial sums are exact
// in float32 (bf16 values of a few magnitudes, "ties") come out exact from
// both.
//
// k is cut into pieces, and the weight rows into blocks, so that what a
// kernel reads most stays in the L1 and L2 caches (the constants below).
package blasdot

import "sync"

// The pieces of k and the blocks of weight rows. A block (nb32, nb64
// rows: multiples of the kernels' 3 and 4) goes through a piece before the
// next piece, so that the tokens' piece (64 tokens: 256 KiB, 64 KiB) is
// read from memory once for the block and served from L2 beside it.
// SgemmNT: a group's four token rows of kc32 elements (16 KiB) stay in L1
// while the block's weight rows (96 KiB) pass over them. Dot64Rows: four
// weight rows of kc64 (4 KiB) stay in L1 while every group of three
// tokens passes; kc64 is also how many products a float32 lane sums
// (kc64/8 each) before the reference widens them to float64, and its
// error bound (above) grows with it.
const (
	kc32 = 1024
	kc64 = 256
	nb32 = 24
	nb64 = 48
)

// roundUp is n rounded up to a multiple of m.
func roundUp(n, m int) int { return (n + m - 1) / m * m }

// kernels picks the assembly or its Go twin.
func sdot(x []float32, ldx int, w []float32, ldw int, k int, lanes *[96]float32) {
	if useAsm {
		sdot4x3Asm(x, ldx, w, ldw, k, lanes)
		return
	}
	sdot4x3Go(x, ldx, w, ldw, k, lanes)
}

func rdot(x []*float32, off int, w []float32, ldw int, k int, lanes []float64) {
	if useAsm {
		rdot3x4Asm(x, off, w, ldw, k, lanes)
		return
	}
	rdot3x4Go(x, off, w, ldw, k, lanes)
}

var (
	f32Pool sync.Pool // *[]float32
	f64Pool sync.Pool // *[]float64
)

// scratch returns a zeroed buffer of n elements from p.
func scratch[T float32 | float64](p *sync.Pool, n int) *[]T {
	if b, ok := p.Get().(*[]T); ok && cap(*b) >= n {
		*b = (*b)[:n]
		clear(*b)
		return b
	}
	b := make([]T, n)
	return &b
}

// padTokens copies m rows of k (row i from row(i)) into a zeroed buffer
// of mp rows kp apart: whole groups of tokens and whole lanes of k (a
// zero product leaves a lane's sum as it was).
func padTokens(m, mp, k, kp int, row func(i int) []float32) *[]float32 {
	xb := scratch[float32](&f32Pool, mp*kp)
	x := *xb
	for i := range m {
		r := row(i)
		_ = r[k-1] // a row shorter than k panics
		copy(x[i*kp:i*kp+k], r)
	}
	return xb
}

// SgemmNT sets c [m,n] (rows ldc apart) to a [m,k] times b [n,k]
// transposed (rows lda and ldb apart): each output summed in eight
// float32 lanes with fused multiply-adds over all of k (kernel.go's
// sdot4x3Go says which products a lane takes), the lanes then folded as
// b_j = a_j + a_{j+4}, (b0 + b1) + (b2 + b3).
func SgemmNT(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	if m <= 0 || n <= 0 {
		return
	}
	if k <= 0 {
		for i := range m {
			clear(c[i*ldc : i*ldc+n])
		}
		return
	}
	// The kernels read a and b where they lie, without Go's bounds checks:
	// their last rows must hold k elements (a short slice panics here, as
	// a copy of it would).
	_, _ = a[(m-1)*lda+k-1], b[(n-1)*ldb+k-1]
	// The tokens are read where a holds them, but for those a kernel could
	// not: a last group of fewer than four, or all where k is not whole
	// lanes. Those are copied, padded with zeros (a zero product leaves a
	// lane's sum as it was).
	kp, mp := roundUp(k, 8), roundUp(m, 4)
	inPlace := m / 4 * 4
	if kp != k {
		inPlace = 0
	}
	xb := padTokens(m-inPlace, mp-inPlace, k, kp, func(i int) []float32 { return a[(inPlace+i)*lda:] })
	defer f32Pool.Put(xb)
	pad := *xb
	tokens := func(g int) ([]float32, int) {
		if g*4 < inPlace {
			return a[g*4*lda:], lda
		}
		return pad[(g*4-inPlace)*kp:], kp
	}
	groups := mp / 4
	ab := scratch[float32](&f32Pool, nb32/3*groups*96+nb32*kc32)
	defer f32Pool.Put(ab)
	// acc holds the lanes of a block of nb32 rows, each group's; wt the
	// block's piece of weight rows where b cannot be read in place.
	acc, wt := (*ab)[:nb32/3*groups*96], (*ab)[nb32/3*groups*96:]
	var ws [nb32 / 3][]float32
	var ldws [nb32 / 3]int
	for rb := 0; rb < n; rb += nb32 {
		nr := min(nb32, n-rb)
		clear(acc)
		for p0 := 0; p0 < k; p0 += kc32 {
			kl := min(kc32, k-p0)
			klp := roundUp(kl, 8)
			for j := range (nr + 2) / 3 {
				r0 := rb + j*3
				rows := min(3, rb+nr-r0)
				ws[j], ldws[j] = b[r0*ldb+p0:], ldb
				if rows < 3 || klp != kl {
					w := wt[j*3*kc32 : j*3*kc32+3*klp]
					clear(w)
					for r := range rows {
						copy(w[r*klp:r*klp+kl], b[(r0+r)*ldb+p0:])
					}
					ws[j], ldws[j] = w, klp
				}
			}
			// A group's four token rows stay in L1 while the block's
			// weight rows pass: the weights are the fewer loads (three
			// vectors to the tokens' four a step).
			for g := range groups {
				x, ldx := tokens(g)
				for j := range (nr + 2) / 3 {
					sdot(x[p0:], ldx, ws[j], ldws[j], klp, (*[96]float32)(acc[(j*groups+g)*96:]))
				}
			}
		}
		for r0 := rb; r0 < rb+nr; r0 += 3 {
			blk := acc[(r0-rb)/3*groups*96:]
			for i := range m {
				for r := range min(3, rb+nr-r0) {
					l := blk[(i*3+r)*8:]
					b0, b1, b2, b3 := l[0]+l[4], l[1]+l[5], l[2]+l[6], l[3]+l[7]
					c[i*ldc+r0+r] = (b0 + b1) + (b2 + b3)
				}
			}
		}
	}
}

// Dot64Rows sets out[t][i] to the dot product of x[t] and w's row i (w
// [n,k]): k in pieces of kc64, each summed in eight float32 lanes with
// fused multiply-adds, the lanes widened and added in float64 into four
// float64 lanes per output (kernel.go's rdot3x4Go), folded as
// (L0 + L2) + (L1 + L3) and rounded once to float32. It is the
// reference's product: another kernel, order and precision than
// SgemmNT's, and closer to the exact sum (the package comment gives both
// bounds).
func Dot64Rows(x [][]float32, w []float32, n, k int, out [][]float32) {
	m := len(x)
	if m == 0 || n <= 0 {
		return
	}
	if k <= 0 {
		for _, o := range out {
			clear(o[:n])
		}
		return
	}
	// The kernel reads w where it lies, without Go's bounds checks (each
	// token row is checked below): a short w panics here.
	_ = w[n*k-1]
	// The tokens are read where the caller holds them, but where k is not
	// whole lanes (then copied, padded with zeros); a last group of fewer
	// than three is filled with a row of zeros.
	kp, mp := roundUp(k, 8), roundUp(m, 3)
	copied := 0
	if kp != k {
		copied = m
	}
	xb := padTokens(copied, copied+1, k, kp, func(i int) []float32 { return x[i] })
	defer f32Pool.Put(xb)
	// rowsx points at each token row a kernel reads: each holds kp
	// elements from there (x[t] at least k: its length, checked here).
	rowsx := make([]*float32, mp)
	for t := range mp {
		switch {
		case t >= m:
			rowsx[t] = &(*xb)[copied*kp] // zeros
		case copied > 0:
			rowsx[t] = &(*xb)[t*kp]
		default:
			_ = x[t][k-1] // a row shorter than k panics
			rowsx[t] = &x[t][0]
		}
	}
	groups := mp / 3
	accb := scratch[float64](&f64Pool, nb64/4*groups*48)
	defer f64Pool.Put(accb)
	acc := *accb
	wtb := scratch[float32](&f32Pool, 4*kc64) // a piece of four weight rows where w cannot be read in place
	defer f32Pool.Put(wtb)
	wt := *wtb
	for rb := 0; rb < n; rb += nb64 {
		nr := min(nb64, n-rb)
		clear(acc)
		for p0 := 0; p0 < k; p0 += kc64 {
			kl := min(kc64, k-p0)
			klp := roundUp(kl, 8)
			for r0 := rb; r0 < rb+nr; r0 += 4 {
				rows := min(4, rb+nr-r0)
				ww, ldw := w[r0*k+p0:], k
				if rows < 4 || klp != kl {
					ww, ldw = wt[:4*klp], klp
					clear(ww)
					for r := range rows {
						copy(ww[r*klp:r*klp+kl], w[(r0+r)*k+p0:])
					}
				}
				rdot(rowsx, p0, ww, ldw, klp, acc[(r0-rb)/4*groups*48:])
			}
		}
		for r0 := rb; r0 < rb+nr; r0 += 4 {
			blk := acc[(r0-rb)/4*groups*48:]
			for t := range m {
				for r := range min(4, rb+nr-r0) {
					l := blk[(t*4+r)*4:]
					out[t][r0+r] = float32((l[0] + l[2]) + (l[1] + l[3]))
				}
			}
		}
	}
}
