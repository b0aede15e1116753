package kernels

import (
	"fmt"
	"math"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/moe"
)

// Must match align.cu.
const (
	alignChunk       = 256
	alignScanThreads = 1024
	// The per-chunk histogram of moe_align_count and the counts of
	// moe_align_scan's last CTA (E int32 each, beside a few static arrays)
	// live in 48 KiB of shared memory.
	alignMaxExperts = (48<<10 - 256) / 4
)

// Alignment is moe_align_block_size's output on the device (the arrays of
// moe.Alignment; only the first Total entries of SortedTokenIDs and
// Total/BlockSize of ExpertIDs are meaningful, Total being on the device).
type Alignment struct {
	NumExperts, BlockSize int
	Numel                 int32
	Counts                *cuda.Buffer[int32] // [E]
	Cumsum                *cuda.Buffer[int32] // [E+1]
	Total                 *cuda.Buffer[int32] // [1]: num_tokens_post_pad
	SortedTokenIDs        *cuda.Buffer[int32] // [MaxPaddedTokens]
	ExpertIDs             *cuda.Buffer[int32] // [ceil(MaxPaddedTokens/BlockSize)]
	status                *cuda.Buffer[int32] // [1]: smallest slot with an out-of-range id, or Numel
	scratch               *cuda.Buffer[int32] // [chunks, E]
	done                  *cuda.Buffer[int32] // [1]: moe_align_scan's ticket, 0 between launches
}

// NewAlignment allocates the outputs for numel slots over numExperts.
func NewAlignment(dev *cuda.Device, numel, numExperts, blockSize int) (*Alignment, error) {
	if numel <= 0 || numExperts <= 0 || numExperts > alignMaxExperts || blockSize <= 0 {
		return nil, fmt.Errorf("moe_align_block_size: %d slots, %d experts (1..%d), block size %d", numel, numExperts, alignMaxExperts, blockSize)
	}
	maxPad := moe.MaxPaddedTokens(numel, numExperts, blockSize)
	chunks := CeilDiv(numel, alignChunk)
	if int64(numel)+int64(numExperts)*int64(blockSize-1) > math.MaxInt32 || int64(chunks)*int64(numExperts) > math.MaxInt32 {
		return nil, fmt.Errorf("moe_align_block_size: %d slots over %d experts overflow int32 indices", numel, numExperts)
	}
	a := &Alignment{NumExperts: numExperts, BlockSize: blockSize, Numel: int32(numel)}
	var err error
	alloc := func(n int) *cuda.Buffer[int32] {
		if err != nil {
			return nil
		}
		var b *cuda.Buffer[int32]
		b, err = cuda.Alloc[int32](dev, n)
		return b
	}
	a.Counts = alloc(numExperts)
	a.Cumsum = alloc(numExperts + 1)
	a.Total = alloc(1)
	a.SortedTokenIDs = alloc(maxPad)
	a.ExpertIDs = alloc(CeilDiv(maxPad, blockSize))
	a.status = alloc(1)
	a.scratch = alloc(chunks*numExperts + chunks) // chunk_counts [chunks, E], chunk_bad [chunks]
	if err == nil {
		a.done, err = cuda.FromHost(dev, []int32{0}) // the scan's last CTA leaves it 0 again
	}
	if err != nil {
		a.Free()
		return nil, err
	}
	return a, nil
}

// Free releases the device arrays.
func (a *Alignment) Free() {
	for _, b := range []*cuda.Buffer[int32]{a.Counts, a.Cumsum, a.Total, a.SortedTokenIDs, a.ExpertIDs, a.status, a.scratch, a.done} {
		b.Free()
	}
}

// AlignBlockSize queues moe_align_block_size on stream for the first
// a.Numel ids of topkIDs ([T,K] flattened) into a.
func AlignBlockSize(stream cuda.Stream, topkIDs *cuda.Buffer[int32], a *Alignment) error {
	if topkIDs == nil {
		return fmt.Errorf("moe_align_block_size: nil ids")
	}
	return topkIDs.Device().Do(func(c *cuda.Ctx) error { return AlignBlockSizeCtx(c, stream, topkIDs, a) })
}

// The align variants: AlignSingle is one launch of one CTA (align.cu
// moe_align_single), for up to alignSingleMaxNumel slots and expert counts
// whose per-warp offsets fit its shared memory; AlignMulti is a memset and
// three launches, for any size. Both give the twin's arrays exactly.
// Measured on an H100 (E 264, K 9, block 64; TestAlignTiming, back to
// back): single 9.5 / 11.2 / 21.0 / 54.5 us at T = 16 / 128 / 1024 / 4096,
// multi 16.3 / 16.7 / 16.9 / 18.4 (since the scan became a warp per expert
// over many CTAs: 23.3 / 20.7 / 19.5 / 28.9 before): they cross between
// T = 128 and 1024, so AlignAuto switches at alignSingleAutoMaxNumel slots
// (T = 910 at K 9).
const (
	AlignAuto   = ""
	AlignSingle = "single"
	AlignMulti  = "multi"
)

const (
	alignSingleMaxNumel = 1 << 16 // ALIGN_SINGLE_MAX_NUMEL
	// alignSingleAutoMaxNumel is where AlignAuto stops taking the single
	// kernel: one CTA is latency-bound on many slots, while the three
	// launches spread them over the whole GPU.
	alignSingleAutoMaxNumel = 8192
	alignSingleThreads      = 1024
	alignSlotsPerOwner      = 256  // one ALIGN_UNROLL batch of a warp: its ids stay in registers
	alignMaxSlotsPerOwner   = 2048 // past this a warp's range is too long a serial walk
	alignSmemInts           = 48 << 10 / 4
)

// alignSingleMaxOwners is how many slot-owning warps moe_align_single can
// have for e experts: its shared memory holds woff [owners][E], cnt [E],
// cums [E+1] and 33 more ints within 48 KiB (at most 32; 0: none fit).
func alignSingleMaxOwners(e int) int {
	return max(0, min(32, (alignSmemInts-2*e-34)/e))
}

// alignSingleOwners is the owner count for numel slots over e experts:
// one warp per alignSlotsPerOwner slots, as far as shared memory allows.
func alignSingleOwners(numel, e int) int {
	return min(alignSingleMaxOwners(e), max(1, CeilDiv(numel, alignSlotsPerOwner)))
}

// AlignSingleFits reports whether AlignSingle can run numel slots over e experts.
func AlignSingleFits(numel, e int) bool {
	owners := alignSingleMaxOwners(e)
	return owners > 0 && numel <= alignSingleMaxNumel && numel <= owners*alignMaxSlotsPerOwner
}

// AlignBlockSizeCtx is AlignBlockSize from inside a Do closure: the
// single-launch variant where it fits, else the multi-launch one.
func AlignBlockSizeCtx(c *cuda.Ctx, stream cuda.Stream, topkIDs *cuda.Buffer[int32], a *Alignment) error {
	return AlignVariantCtx(c, AlignAuto, stream, topkIDs, a)
}

// AlignVariantCtx is AlignBlockSizeCtx with an explicit variant (AlignAuto,
// AlignSingle or AlignMulti), for the tests and the benchmark.
func AlignVariantCtx(c *cuda.Ctx, variant string, stream cuda.Stream, topkIDs *cuda.Buffer[int32], a *Alignment) error {
	if topkIDs == nil || a == nil || a.scratch == nil || a.done == nil {
		return fmt.Errorf("moe_align_block_size: nil buffer")
	}
	numel := int(a.Numel)
	if topkIDs.Len() < numel {
		return fmt.Errorf("moe_align_block_size: %d ids for %d slots", topkIDs.Len(), numel)
	}
	fits := AlignSingleFits(numel, a.NumExperts)
	switch variant {
	case AlignAuto:
		variant = AlignMulti
		if fits && numel <= alignSingleAutoMaxNumel {
			variant = AlignSingle
		}
	case AlignSingle:
		if !fits {
			return fmt.Errorf("moe_align_block_size: %d slots over %d experts do not fit the single-launch kernel", numel, a.NumExperts)
		}
	case AlignMulti:
	default:
		return fmt.Errorf("moe_align_block_size: unknown variant %q", variant)
	}
	m, err := LoadCtx(c, "align")
	if err != nil {
		return err
	}
	if variant == AlignSingle {
		owners := alignSingleOwners(numel, a.NumExperts)
		smem := 4 * (owners*a.NumExperts + 2*a.NumExperts + 34)
		return m.LaunchCtx(c, "moe_align_single", Grid(1), Block(alignSingleThreads), uint32(smem), stream,
			topkIDs, a.Numel, int32(a.NumExperts), int32(a.BlockSize), int32(owners),
			a.Counts, a.Cumsum, a.Total, a.SortedTokenIDs, a.ExpertIDs, a.status)
	}
	e, chunks := int32(a.NumExperts), CeilDiv(numel, alignChunk)
	chunkBad := a.scratch.Ptr().Add(4 * chunks * a.NumExperts)
	if err := m.LaunchCtx(c, "moe_align_count", Grid(chunks), Block(alignChunk), uint32(4*a.NumExperts), stream,
		topkIDs, a.Numel, e, a.scratch, chunkBad); err != nil {
		return err
	}
	// One warp per expert across ceil(E/32) CTAs; the last CTA to finish
	// keeps the counts in dynamic shared memory.
	if err := m.LaunchCtx(c, "moe_align_scan", Grid(CeilDiv(a.NumExperts, alignScanThreads/32)), Block(alignScanThreads),
		uint32(4*a.NumExperts), stream,
		a.scratch, chunkBad, int32(chunks), e, int32(a.BlockSize), a.Numel,
		a.Counts, a.Cumsum, a.Total, a.SortedTokenIDs, a.ExpertIDs, a.status, a.done); err != nil {
		return err
	}
	// moe_align_fill also writes the padding and expert_ids, experts dealt
	// over its grid: at least one CTA per 8 experts, so that a few chunks do
	// not leave that to a few CTAs (CTAs past the last chunk only pad).
	return m.LaunchCtx(c, "moe_align_fill", Grid(max(chunks, CeilDiv(a.NumExperts, 8))), Block(alignChunk), 0, stream,
		topkIDs, a.Numel, e, a.scratch, a.Cumsum, a.SortedTokenIDs, a.Counts, a.ExpertIDs, int32(a.BlockSize))
}

// Host waits for the alignment, checks that every id was in range and
// copies it to the host, trimmed to its total: what moe.AlignBlockSize
// computes from the same ids.
func (a *Alignment) Host() (*moe.Alignment, error) {
	if err := a.status.Device().Synchronize(); err != nil {
		return nil, err
	}
	st, err := a.status.ToHost(1)
	if err != nil {
		return nil, err
	}
	if st[0] != a.Numel {
		return nil, fmt.Errorf("moe_align_block_size: slot %d routed to an expert outside 0..%d", st[0], a.NumExperts-1)
	}
	h := &moe.Alignment{NumExperts: a.NumExperts, BlockSize: a.BlockSize, Numel: a.Numel}
	tot, err := a.Total.ToHost(1)
	if err != nil {
		return nil, err
	}
	h.TotalPadded = tot[0]
	if h.TotalPadded < 0 || int(h.TotalPadded) > a.SortedTokenIDs.Len() || int(h.TotalPadded)%a.BlockSize != 0 {
		return nil, fmt.Errorf("moe_align_block_size: device total %d (capacity %d, block %d)", h.TotalPadded, a.SortedTokenIDs.Len(), a.BlockSize)
	}
	if h.Counts, err = a.Counts.ToHost(-1); err != nil {
		return nil, err
	}
	if h.Cumsum, err = a.Cumsum.ToHost(-1); err != nil {
		return nil, err
	}
	if h.SortedTokenIDs, err = a.SortedTokenIDs.ToHost(int(h.TotalPadded)); err != nil {
		return nil, err
	}
	if h.ExpertIDs, err = a.ExpertIDs.ToHost(int(h.TotalPadded) / a.BlockSize); err != nil {
		return nil, err
	}
	return h, nil
}
