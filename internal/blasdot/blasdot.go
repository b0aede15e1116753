// Package blasdot computes the products validate's CPU paths ask for: a
// float32 matrix product with the second operand transposed (SgemmNT, the
// fused path's GEMM, float32 sums as the GPU's) and dot products whose
// pieces are added in float64 (Dot64Rows, the reference's), many tokens
// against the rows of a weight band, both on the AVX2/FMA units
// (kernels_amd64.s) at close to a core's float32 peak, and where the CPU
// has AVX-512 a block of sixteen tokens on it (kernel512_amd64.s: the same
// bits, 1.4-1.9x the AVX2 kernel's rate on a Xeon with two 512-bit FMA
// units).
//
// The tokens are packed first (Tokens: sixteen tokens side by side, so a
// vector holds one element of sixteen tokens), once for all the bands of
// a weight; the kernel broadcasts an element of each of six weight rows
// and multiplies-adds it into twelve vectors of sums: 16 x 6 outputs in
// registers, each a float32 lane of its own.
//
// Each output is a function of its two rows alone, summed in one fixed
// order: it does not depend on how many tokens or rows a call carries, so
// SRC's and DST's paths, which batch tokens differently, give the same bits
// for the same rows. It is not bit-for-bit the same across builds: the Go
// twin, which a build without the assembly runs, rounds each product
// before adding it where the assembly's fused multiply-add does not, so
// they may differ in the last bits. Both are held to the bounds below
// against the exact dot product, not to each other.
//
// The bounds (u = 2^-24, S = the sum of the products' magnitudes):
//
//   - SgemmNT: k in pieces of kc32 = 256 elements, each piece summed in
//     order in one float32 from zero, the pieces' sums added in float32 in
//     order: at most (kc32 + k/kc32 + 2) u S from the exact sum (a piece's
//     additions, the pieces', and each product's rounding). Measured on
//     random normals at k 2048..14336 (validate's H and I): 2.3e-7..3.6e-7
//     relative L2 (deviation_test.go holds it under 5e-7; gonum's Sgemm,
//     one sum over all of k, 2.6e-7..7e-7).
//   - Dot64Rows: pieces of kc64 = 128 elements summed so in float32, then
//     everything in float64, rounded once to float32: at most u |exact| +
//     (kc64 + 2) u S, whatever k. Measured 1.8e-7..2.3e-7 relative L2
//     (held under 3e-7). Its products were float64 once (2.7e-8, half an
//     ulp of float32), at a quarter of this speed, and its pieces 64
//     elements until issue 45's eleventh session (1.2e-7..1.6e-7), when
//     adding each piece's sixteen-by-six sums into float64 cost a quarter
//     of the kernel's speed (a DeepSeek-V3 gate band of 64 tokens: 28-30
//     GFLOP/s at 64, 34-40 at 128, SgemmNT 39-41, on the 2-core VM). The
//     checks do not need the shorter pieces: the two paths' difference,
//     measured under 4e-7, is what judge.TolFP32 (1e-5) bounds, and it
//     stays 27x under it.
//
// The two are different computations (their pieces' lengths, where the
// pieces meet, and the precision they are added in) wherever k is longer
// than one reference piece, as every real model's is (k 2048 and more), so
// the reference has arithmetic of its own there; the checks' tolerance
// between them (judge.TolFP32) is many times what they measure apart.
// Where k fits in one piece of both (k <= kc64: the toy fixtures), they
// are the same sums, and the two paths' products agree bit for bit. The
// kernel itself is held to the exact sums by this package's tests. Data
// whose partial sums are exact in float32 (bf16 values of a few
// magnitudes, "ties") come out exact from both.
package blasdot

import "sync"

const (
	// blockTokens is how many tokens a packed block holds side by side:
	// two vectors of eight float32, the kernel's width across tokens.
	blockTokens = 16
	// groupRows is how many weight rows the kernel takes at once.
	groupRows = 6
	// kc32 and kc64 are SgemmNT's and Dot64Rows' pieces of k: how many
	// products a float32 sum takes before it is added to the rest (their
	// error bounds grow with them). A piece of a block's tokens (16 KiB,
	// 8 KiB) stays in L1 while every group of weight rows passes over it.
	kc32 = 256
	kc64 = 128
	// rowBlock is at most how many weight rows go through every piece of
	// k together: their accumulators (192 rows of 64 tokens: 48 KiB in
	// float32, 96 KiB in float64) stay in L2. A band validate decodes
	// (128 rows of FP8, 12 of bf16) is one block.
	rowBlock = 192
)

// roundUp is n rounded up to a multiple of m.
func roundUp(n, m int) int { return (n + m - 1) / m * m }

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

// Tokens is m token rows of k elements packed for the kernel: blocks of
// sixteen tokens, each block k steps of sixteen values, token i's element
// p at p*16 + i%16 of block i/16. The last block is filled up with zero
// tokens, and is eight wide (k steps of eight) where eight hold the rest:
// with few tokens an expert (many experts), a block of sixteen would be
// mostly zeros. Pack a weight's tokens once and multiply them by each of
// its bands.
type Tokens struct {
	m, k int
	buf  *[]float32
}

// PackRows packs m tokens of k elements, token i's from row(i) (which
// must hold at least k: a shorter row panics).
func PackRows(m, k int, row func(i int) []float32) *Tokens {
	k, m = max(k, 0), max(m, 0)
	t := &Tokens{m: m, k: k, buf: scratch[float32](&f32Pool, paddedTokens(m)*k)}
	if k == 0 {
		return t
	}
	p := *t.buf
	// A block is written a chunk of k at a time, its sixteen rows in turn,
	// so that the chunk being written (64 steps, 4 KiB) stays in L1.
	const chunk = 64
	for b0 := 0; b0 < m; b0 += blockTokens {
		rows := make([][]float32, min(blockTokens, m-b0))
		for i := range rows {
			r := row(b0 + i)
			_ = r[k-1] // a row shorter than k panics (its capacity is not its length)
			rows[i] = r[:k]
		}
		width := blockWidth(m, b0)
		blk := p[b0*k : (b0+width)*k]
		for q0 := 0; q0 < k; q0 += chunk {
			q1 := min(q0+chunk, k)
			for i, r := range rows {
				for q, v := range r[q0:q1] {
					blk[(q0+q)*width+i] = v
				}
			}
		}
	}
	return t
}

// blockWidth is the width of the block of m tokens that starts at token
// b0: sixteen, or eight for a last block of eight or fewer.
func blockWidth(m, b0 int) int {
	if m-b0 <= blockTokens/2 {
		return blockTokens / 2
	}
	return blockTokens
}

// paddedTokens is m rounded up to whole blocks.
func paddedTokens(m int) int {
	if m <= 0 {
		return 0
	}
	last := m / blockTokens * blockTokens
	if last == m {
		return m
	}
	return last + blockWidth(m, last)
}

// PackMatrix packs the m rows of a (k elements each, rows lda apart).
func PackMatrix(m, k int, a []float32, lda int) *Tokens {
	return PackRows(m, k, func(i int) []float32 { return a[i*lda:] })
}

// Release gives the packed buffer back for reuse; t must not be used
// after. A nil t, or one released already, is nothing.
func (t *Tokens) Release() {
	if t != nil && t.buf != nil {
		f32Pool.Put(t.buf)
		t.buf = nil
	}
}

// products runs the kernel over every block of at most rowBlock of weight
// b's n rows (ldb apart), piece of k (kc long), block of tokens and group
// of six rows, adding each piece's sums into acc32 or acc64
// [roundUp(n, 6)][paddedTokens(m)] (row j's accumulators for token i at
// j*ld + i). A block's rows go through every piece before the next block
// (so its accumulators stay in L2 while they are added to), and within a
// piece, a block of tokens stays in L1 while the block's groups pass. A
// last group of fewer than six rows is copied, a piece at a time, beside
// rows of zeros. Each output's pieces are added in order, whatever the
// blocking.
func (t *Tokens) products(n int, b []float32, ldb, kc int, acc32 []float32, acc64 []float64) {
	k, p := t.k, *t.buf
	ld := len(p) / k
	single := crowdsL1(ldb) // the same for every call below
	var wt []float32
	if n%groupRows > 0 {
		wb := scratch[float32](&f32Pool, groupRows*kc)
		defer f32Pool.Put(wb)
		wt = *wb
	}
	// Blocks of at most rowBlock rows, as even as whole groups allow.
	blocks := (n + rowBlock - 1) / rowBlock
	size := roundUp((n+blocks-1)/blocks, groupRows)
	for r0 := 0; r0 < n; r0 += size {
		nr := min(size, n-r0)
		groups, rest := nr/groupRows, nr%groupRows
		first, last := r0*ld, (r0+groups*groupRows)*ld
		for p0 := 0; p0 < k; p0 += kc {
			kl := min(kc, k-p0)
			if rest > 0 {
				clear(wt)
				for r := range rest {
					copy(wt[r*kl:(r+1)*kl], b[(r0+groups*groupRows+r)*ldb+p0:])
				}
			}
			for t0 := 0; t0 < ld; t0 += blockTokens {
				width := blockWidth(ld, t0)
				tp := p[t0*k+p0*width:]
				if groups > 0 {
					tiles(kl, width, tp, b[r0*ldb+p0:], ldb, groups, sub(acc32, first+t0), sub(acc64, first+t0), ld, single)
				}
				if rest > 0 {
					tiles(kl, width, tp, wt, kl, 1, sub(acc32, last+t0), sub(acc64, last+t0), ld, false)
				}
			}
		}
	}
}

// sub is s[i:], nil for a nil s.
func sub[T any](s []T, i int) []T {
	if s == nil {
		return nil
	}
	return s[i:]
}

// SgemmNT sets c [m,n] (rows ldc apart) to a [m,k] times b [n,k]
// transposed (rows lda and ldb apart): each output summed as the package
// comment says (pieces of kc32 in float32, added in float32).
func SgemmNT(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	if m <= 0 || n <= 0 {
		return
	}
	t := PackMatrix(m, k, a, lda)
	defer t.Release()
	t.SgemmNT(n, b, ldb, c, ldc)
}

// SgemmNT sets c[i*ldc+j] to token i's dot product with b's row j (n rows
// of k, ldb apart), as SgemmNT does.
func (t *Tokens) SgemmNT(n int, b []float32, ldb int, c []float32, ldc int) {
	m, k := t.m, t.k
	if m <= 0 || n <= 0 {
		return
	}
	if k == 0 {
		for i := range m {
			clear(c[i*ldc : i*ldc+n])
		}
		return
	}
	// The kernel reads b where it lies, without Go's bounds checks: its
	// last row must hold k elements (a short slice panics here).
	_ = b[(n-1)*ldb+k-1]
	ld := len(*t.buf) / k
	accb := scratch[float32](&f32Pool, roundUp(n, groupRows)*ld)
	defer f32Pool.Put(accb)
	acc := *accb
	t.products(n, b, ldb, kc32, acc, nil)
	for i := range m {
		ci := c[i*ldc : i*ldc+n]
		for j := range ci {
			ci[j] = acc[j*ld+i]
		}
	}
}

// Dot64Rows sets out[t][i] to the dot product of x[t] and w's row i (w
// [n,k]): k in pieces of kc64, each summed in float32, the pieces added in
// float64 and the sum rounded once to float32. It is the reference's
// product: another order and precision than SgemmNT's, and closer to the
// exact sum (the package comment gives both bounds).
func Dot64Rows(x [][]float32, w []float32, n, k int, out [][]float32) {
	if len(x) == 0 || n <= 0 {
		return
	}
	t := PackRows(len(x), k, func(i int) []float32 { return x[i] })
	defer t.Release()
	t.Dot64Rows(w, n, out)
}

// Dot64Rows sets out[i][j] to token i's dot product with w's row j (n rows
// of k, one after the other), as Dot64Rows does.
func (t *Tokens) Dot64Rows(w []float32, n int, out [][]float32) {
	m, k := t.m, t.k
	if m <= 0 || n <= 0 {
		return
	}
	if k == 0 {
		for _, o := range out[:m] {
			clear(o[:n])
		}
		return
	}
	_ = w[n*k-1] // a short w panics here, before the kernel reads it
	ld := len(*t.buf) / k
	accb := scratch[float64](&f64Pool, roundUp(n, groupRows)*ld)
	defer f64Pool.Put(accb)
	acc := *accb
	t.products(n, w, k, kc64, nil, acc)
	for i, o := range out[:m] {
		o = o[:n]
		for j := range o {
			o[j] = float32(acc[j*ld+i])
		}
	}
}
