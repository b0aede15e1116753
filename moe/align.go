package moe

import (
	"fmt"
	"math"
)

// Alignment is the output of moe_align_block_size, the step that groups the
// (token, slot) pairs by expert so a grouped GEMM can run one expert per
// block. It holds exactly the arrays of sgl-kernel's and vLLM's kernel:
//
//   - Counts[e]: slots routed to expert e.
//   - Cumsum[e]: exclusive prefix sum of the counts each padded up to a
//     multiple of BlockSize; Cumsum[NumExperts] = TotalPadded
//     (num_tokens_post_pad).
//   - SortedTokenIDs [TotalPadded]: flattened slot indices t*K+k grouped by
//     expert, expert e occupying [Cumsum[e], Cumsum[e]+Counts[e]), the rest of
//     its padded range holding the sentinel Numel = T*K. Within an expert the
//     order here is ascending slot index; the GPU kernel's large-batch path
//     fills it with atomics, so compare those as a multiset per expert.
//   - ExpertIDs [TotalPadded/BlockSize]: the expert of each block. The GPU
//     buffers are sized for the worst case (MaxPaddedTokens); entries past
//     TotalPadded are never read and are not part of the contract.
type Alignment struct {
	NumExperts     int
	BlockSize      int
	Numel          int32
	Counts         []int32
	Cumsum         []int32
	SortedTokenIDs []int32
	ExpertIDs      []int32
	TotalPadded    int32
}

// MaxPaddedTokens is the size a serving engine allocates for
// sorted_token_ids before it knows the counts: numel + E*(block-1).
func MaxPaddedTokens(numel, numExperts, blockSize int) int {
	return numel + numExperts*(blockSize-1)
}

// AlignBlockSize is the CPU twin of moe_align_block_size for topk ids
// [T,K] (flattened), numExperts = routed + fused shared experts.
func AlignBlockSize(topkIDs []int32, numExperts, blockSize int) (*Alignment, error) {
	if numExperts <= 0 || blockSize <= 0 {
		return nil, fmt.Errorf("moe_align_block_size: %d experts, block size %d", numExperts, blockSize)
	}
	if MaxPaddedTokens(len(topkIDs), numExperts, blockSize) > math.MaxInt32 || len(topkIDs) > math.MaxInt32 {
		return nil, fmt.Errorf("moe_align_block_size: %d slots over %d experts overflow int32 indices", len(topkIDs), numExperts)
	}
	a := &Alignment{
		NumExperts: numExperts,
		BlockSize:  blockSize,
		Numel:      int32(len(topkIDs)),
		Counts:     make([]int32, numExperts),
		Cumsum:     make([]int32, numExperts+1),
	}
	for i, id := range topkIDs {
		if id < 0 || int(id) >= numExperts {
			return nil, fmt.Errorf("moe_align_block_size: slot %d routed to expert %d of %d", i, id, numExperts)
		}
		a.Counts[id]++
	}
	bs := int32(blockSize)
	for e, c := range a.Counts {
		a.Cumsum[e+1] = a.Cumsum[e] + (c+bs-1)/bs*bs
	}
	a.TotalPadded = a.Cumsum[numExperts]
	a.SortedTokenIDs = make([]int32, a.TotalPadded)
	for i := range a.SortedTokenIDs {
		a.SortedTokenIDs[i] = a.Numel
	}
	next := make([]int32, numExperts)
	copy(next, a.Cumsum[:numExperts])
	for i, id := range topkIDs {
		a.SortedTokenIDs[next[id]] = int32(i)
		next[id]++
	}
	a.ExpertIDs = make([]int32, a.TotalPadded/bs)
	for e := range numExperts {
		for b := a.Cumsum[e] / bs; b < a.Cumsum[e+1]/bs; b++ {
			a.ExpertIDs[b] = int32(e)
		}
	}
	return a, nil
}

// Blocks returns the number of blocks, TotalPadded/BlockSize.
func (a *Alignment) Blocks() int { return len(a.ExpertIDs) }

// Block returns the slot indices of block b with the padding left out.
func (a *Alignment) Block(b int) []int32 {
	s := a.SortedTokenIDs[b*a.BlockSize : (b+1)*a.BlockSize]
	n := 0
	for n < len(s) && s[n] != a.Numel {
		n++
	}
	return s[:n]
}
