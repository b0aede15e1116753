//go:build amd64 && !noasm && !gccgo && !safe

package blasdot

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// useAVX512 turns the kernels on; tests turn them off to compare.
var useAVX512 = cpu.X86.HasAVX512F

//go:noescape
func sdot16x2(x *float32, w0, w1 *float32, k, chunk int, out *float32)

//go:noescape
func ddot8x2(x *float64, groups int, w0, w1 *float32, k int, s *float64, out *float64)

// aligned16 reports whether every row of w, ld apart, starts 16-byte
// aligned: gonum's kernels then add no leading elements apart.
func aligned16(w []float32, ld int) bool {
	return len(w) > 0 && uintptr(unsafe.Pointer(&w[0]))%16 == 0 && ld%4 == 0
}

// sgemmFast is SgemmNT on sdot16x2 where it applies: k a multiple of 16
// (DotUnitary's 16-wide loop, no tail) and b's rows aligned.
func sgemmFast(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) bool {
	if !useAVX512 || m <= 0 || n <= 0 || k <= 0 || k%16 != 0 || !aligned16(b, ldb) ||
		!fits(len(a), m, k, lda) || !fits(len(b), n, k, ldb) || !fits(len(c), m, n, ldc) {
		return false
	}
	chunk := k
	if blocks(m)*blocks(n) >= minParBlock {
		chunk = blockSize // gonum's parallel Sgemm: 64-wide pieces of k, summed in order
	}
	xt := make([]float32, k*16)
	var out [32]float32
	for r0 := 0; r0 < m; r0 += 16 {
		rows := min(16, m-r0)
		clear(xt)
		for r := range rows {
			for p, v := range a[(r0+r)*lda : (r0+r)*lda+k] {
				xt[p*16+r] = v
			}
		}
		for j := 0; j < n; j += 2 {
			j1 := min(j+1, n-1)
			sdot16x2(&xt[0], &b[j*ldb], &b[j1*ldb], k, chunk, &out[0])
			for r := range rows {
				row := c[(r0+r)*ldc:]
				row[j] = out[r]
				if j+1 < n {
					row[j+1] = out[16+r]
				}
			}
		}
	}
	return true
}

// dot64Fast is Dot64Rows on ddot8x2 where it applies: k a multiple of 8
// (DdotUnitary's 8-wide loop, no tail) and w's rows aligned.
func dot64Fast(x [][]float32, w []float32, n, k int, out [][]float32) bool {
	if !useAVX512 || len(x) == 0 || n <= 0 || k <= 0 || k%8 != 0 || !aligned16(w, k) || len(w) < n*k {
		return false
	}
	for r, xr := range x {
		if len(xr) != k || len(out[r]) < n {
			return false
		}
	}
	groups := (len(x) + 7) / 8
	xt := make([]float64, groups*k*8)
	for r, xr := range x {
		g := xt[(r/8)*k*8:]
		for p, v := range xr {
			g[p*8+r%8] = float64(v)
		}
	}
	s := make([]float64, 2*k)
	res := make([]float64, groups*16)
	for i := 0; i < n; i += 2 {
		i1 := min(i+1, n-1)
		ddot8x2(&xt[0], groups, &w[i*k], &w[i1*k], k, &s[0], &res[0])
		for r := range x {
			g, l := r/8, r%8
			out[r][i] = float32(res[g*16+l])
			if i+1 < n {
				out[r][i+1] = float32(res[g*16+8+l])
			}
		}
	}
	return true
}
