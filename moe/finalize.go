package moe

import "fmt"

// Finalize is the CPU twin of the unpermute-and-reduce step: y[t] = scale *
// sum_k weights[t,k] * out[t*K+k], summed over the slots in order in float32
// (the GPU kernel's precision). scale is the routed scaling factor where the
// contract leaves it as a runtime multiply, 1 where it is folded.
func Finalize(out []float32, t, slotsPerToken, h int, weights []float32, scale float32) ([]float32, error) {
	if len(out) != t*slotsPerToken*h || len(weights) != t*slotsPerToken {
		return nil, fmt.Errorf("finalize: %d outputs and %d weights for %d tokens x %d slots x %d", len(out), len(weights), t, slotsPerToken, h)
	}
	y := make([]float32, t*h)
	for i := range t {
		yi := y[i*h : (i+1)*h]
		for k := range slotsPerToken {
			s := i*slotsPerToken + k
			w := weights[s]
			row := out[s*h : (s+1)*h]
			for j, v := range row {
				yi[j] += w * v
			}
		}
		if scale != 1 {
			for j := range yi {
				yi[j] *= scale
			}
		}
	}
	return y, nil
}
