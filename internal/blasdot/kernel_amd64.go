//go:build amd64 && !noasm && !gccgo && !safe

package blasdot

import "golang.org/x/sys/cpu"

// useAsm turns the AVX2/FMA kernels on; tests turn them off to compare
// them with their Go twins. AVX-512 machines run the same AVX2 kernels:
// one code path, the same bits everywhere.
var useAsm = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func sdot3x3(x *float32, ldx int, w *float32, ldw int, k int, out *[9]float32)

//go:noescape
func ddot4x3(x *float64, ldx int, w *float64, ldw int, k int, out *[12]float64)

func sdot3x3Asm(x []float32, ldx int, w []float32, ldw int, k int, out *[9]float32) {
	sdot3x3(&x[0], ldx, &w[0], ldw, k, out)
}

func ddot4x3Asm(x []float64, ldx int, w []float64, ldw int, k int, out *[12]float64) {
	ddot4x3(&x[0], ldx, &w[0], ldw, k, out)
}
