//go:build !amd64

package tensorbytes

// Without amd64 clean runs its Go rounds only (clean_amd64.go).
var useAVX2 = false

func anyAllSet(raw *byte, n int, m uint32, width int) bool {
	panic("tensorbytes: no AVX2 scan on this architecture")
}
