package moelayer

import ()

// SlotRows is the input of an input-scaled grouped GEMM: one row per slot,
// slot s = t*k + j holding weights[s] * x[t], so the GEMM runs with one
// slot per "token" and finalize sums each token's k slots unweighted.
func SlotRows(x []float32, h, k int, weights []float32) []float32 {
	out := make([]float32, len(weights)*h)
	for s, w := range weights {
		tok := s / k
		for j, v := range x[tok*h : (tok+1)*h] {
			out[s*h+j] = w * v
		}
	}
	return out
}

// Ones is n weights of 1: the finalize weights of an input-scaled layer.
func Ones(n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = 1
	}
	return out
}
