//go:build !amd64 || noasm || gccgo || safe

package blasdot

var useAsm = false

func sdot4x3Asm(x []float32, ldx int, w []float32, ldw int, k int, lanes *[96]float32) {
	sdot4x3Go(x, ldx, w, ldw, k, lanes)
}

func rdot3x4Asm(x []*float32, off int, w []float32, ldw int, k int, lanes []float64) {
	rdot3x4Go(x, off, w, ldw, k, lanes)
}
