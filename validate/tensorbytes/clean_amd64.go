package tensorbytes

import "golang.org/x/sys/cpu"

// useAVX2 picks anyAllSet (clean_amd64.s) for clean's whole 32-byte
// rounds; the Go rounds give the same answer (TestCleanKernel).
var useAVX2 = cpu.X86.HasAVX2

// anyAllSet reports whether any width-byte element of raw[:n] (n a
// multiple of 32) has every bit of m set.
//
//go:noescape
func anyAllSet(raw *byte, n int, m uint32, width int) bool
