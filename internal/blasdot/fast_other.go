//go:build !amd64 || noasm || gccgo || safe

package blasdot

// Without gonum's amd64 assembly its kernels add up in another order: the
// calls go to gonum.

var useAVX512 = false

func sgemmFast(int, int, int, []float32, int, []float32, int, []float32, int) bool { return false }

func dot64Fast([][]float32, []float32, int, int, [][]float32) bool { return false }
