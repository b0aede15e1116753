//go:build !amd64 || noasm || gccgo || safe

package blasdot

var useAsm = false

func sdot3x3Asm(x []float32, ldx int, w []float32, ldw int, k int, out *[9]float32) {
	sdot3x3Go(x, ldx, w, ldw, k, out)
}

func ddot4x3Asm(x []float64, ldx int, w []float64, ldw int, k int, out *[12]float64) {
	ddot4x3Go(x, ldx, w, ldw, k, out)
}
