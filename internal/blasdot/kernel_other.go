//go:build !amd64 || noasm || gccgo || safe

package blasdot

import "unsafe"

var useAsm, useAVX512 = false, false

func tilesAsm(k int, tp *float32, w *float32, ldw int, groups int, acc unsafe.Pointer, ld int, wide, narrow, single bool) {
	panic("blasdot: no assembly in this build")
}

func tiles512Asm(k int, tp *float32, w *float32, ldw int, pairs int, acc unsafe.Pointer, ld int, wide bool) {
	panic("blasdot: no assembly in this build")
}
