package convert

import "sync"

// foldStats tracks the largest relative change |folded - x*f| / |x*f| over all
// finite non-zero elements, shared by every fold reader of a run. A folded
// part has every element multiplied by factor (routed_scaling_factor), each
// rounded once in the part's dtype (F32 for FP8 scale tensors, the weights'
// for bf16/f16/f32) by weightfmt.FoldInPlace as the shard writer reads it.
type foldStats struct {
	mu     sync.Mutex
	maxRel float64
}

func (s *foldStats) note(v float64) {
	s.mu.Lock()
	if v > s.maxRel {
		s.maxRel = v
	}
	s.mu.Unlock()
}

func (s *foldStats) max() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxRel
}
