//go:build amd64 && !noasm && !gccgo && !safe

package blasdot

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// useAsm turns the AVX2/FMA kernel on; tests turn it off to run its Go
// twin. useAVX512 has a block of sixteen tokens take the AVX-512 kernel
// (kernel512_amd64.s), twelve rows at a time, where the CPU has it: the
// same bits as the AVX2 kernel's (TestAVX512SameBits).
var (
	useAsm    = cpu.X86.HasAVX2 && cpu.X86.HasFMA
	useAVX512 = useAsm && cpu.X86.HasAVX512F
)

//go:noescape
func tilesAsm(k int, tp *float32, w *float32, ldw int, groups int, acc unsafe.Pointer, ld int, wide, narrow, single bool)

//go:noescape
func tiles512Asm(k int, tp *float32, w *float32, ldw int, pairs int, acc unsafe.Pointer, ld int, wide bool)
