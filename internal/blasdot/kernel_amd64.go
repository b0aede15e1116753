//go:build amd64 && !noasm && !gccgo && !safe

package blasdot

import "golang.org/x/sys/cpu"

// useAsm turns the AVX2/FMA kernels on; tests turn them off to run their
// Go twins. AVX-512 machines run the same AVX2 kernels (no AVX-512 kernel
// is kept: none could be tested here).
var useAsm = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func sdot4x3(x *float32, ldx int, w *float32, ldw int, k int, lanes *[96]float32)

//go:noescape
func rdot3x4(x0, x1, x2 *float32, w *float32, ldw int, k int, lanes *[48]float64)

func sdot4x3Asm(x []float32, ldx int, w []float32, ldw int, k int, lanes *[96]float32) {
	sdot4x3(&x[0], ldx, &w[0], ldw, k, lanes)
}

func rdot3x4Asm(x *[3][]float32, w []float32, ldw int, k int, lanes *[48]float64) {
	rdot3x4(&x[0][0], &x[1][0], &x[2][0], &w[0], ldw, k, lanes)
}
