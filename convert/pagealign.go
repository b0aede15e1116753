package convert

import (
	"os"
	"sort"
)

// Page alignment of output shards. It was made for
// copy_file_range without reflink, which moves page-cache pages: when a
// tensor's source and destination sat at different offsets within their
// pages, the copy and the write-back cost more (0.2-0.4 s on a 1.6 GB model;
// BENCHMARKS.md). The writer now reads into a buffer and pwrites
// (shardwrite.go), for which the offset within a page makes no difference.
// The alignment stays because it decides the output's bytes (tensor order
// inside a shard, spaces at the end of the header): dropping it would make
// every output differ from what earlier versions wrote for the same input.
const pageSize = 4096

// pageOrder puts the tensors whose byte size is a whole number of pages
// first (stacked experts and most weights), the others after them, each
// group in its planned order. All of the first group then share one offset
// within a page, which the header padding chooses; the small tensors (norms,
// biases, scales) that would shift it come last.
func pageOrder(ts []*outTensor) []*outTensor {
	out := append([]*outTensor(nil), ts...)
	sort.SliceStable(out, func(i, j int) bool {
		return out[i].size%pageSize == 0 && out[j].size%pageSize != 0
	})
	return out
}

// dataPhase returns the offset within a page at which the shard's data
// section should start so that the most bytes of parts neither folded nor
// strided, read from a plain file, land at the offset within a page they
// have in their source; ok is false when there are no such bytes. Ties go
// to the smaller phase, so the plan, and with it the output bytes, depend
// only on the inputs.
func dataPhase(ts []*outTensor) (phase int64, ok bool) {
	weight := map[int64]int64{}
	rel := int64(0) // offset in the data section
	for _, t := range ts {
		for i := range t.parts {
			p := &t.parts[i]
			if _, file := outermost(p.src).(*os.File); file && !p.transformed() && p.contiguous() {
				src := baseOffset(p.src) + p.off
				if ph := ((src-rel)%pageSize + pageSize) % pageSize; ph%8 == 0 {
					weight[ph] += p.size()
				}
			}
			rel += p.size()
		}
	}
	best := int64(-1)
	for ph, w := range weight {
		if best < 0 || w > weight[best] || (w == weight[best] && ph < best) {
			best = ph
		}
	}
	return best, best >= 0
}
