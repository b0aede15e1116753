//go:build amd64 && !noasm && !gccgo && !safe

package blasdot

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// useAsm turns the AVX2/FMA kernel on; tests turn it off to run its Go
// twin. AVX-512 machines run the same AVX2 kernel (no AVX-512 kernel is
// kept: none could be tested here).
var useAsm = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func tilesAsm(k int, tp *float32, w *float32, ldw int, groups int, acc unsafe.Pointer, ld int, wide, narrow, single bool)
