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
func rdot3x4(x **float32, groups int, off int, w *float32, ldw int, k int, lanes *float64)

func sdot4x3Asm(x []float32, ldx int, w []float32, ldw int, k int, lanes *[96]float32) {
	sdot4x3(&x[0], ldx, &w[0], ldw, k, lanes)
}

func rdot3x4Asm(x []*float32, off int, w []float32, ldw int, k int, lanes []float64) {
	groups := len(x) / 3
	_ = lanes[groups*48-1]
	rdot3x4(&x[0], groups, off, &w[0], ldw, k, &lanes[0])
}
