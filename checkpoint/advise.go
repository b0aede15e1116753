package checkpoint

import (
	"cmp"
	"io"
	"slices"
)

// adviseSmall asks the kernel, once per checkpoint, to start reading every
// tensor of at most max bytes (SmallTensorBytes' callers' size: an INT4
// projection's weight_shape, 16 bytes), in every file, before the plan
// reads them one after another. Each lies between megabytes of packed
// weights, so the small window cannot serve the next from the last read:
// cold, each was a read from the disk in turn (a Kimi-K2-shaped INT4
// checkpoint of 96 experts: 289 reads of a window each, 64-70 ms of a
// one-second validate;
// Kimi-K2's 69,000 would be seconds, and minutes on network storage). The
// advice lets the disk take them all at once; the reads that follow find
// them in the page cache. It is advice only: where the platform or the
// file has none, the reads go to the disk as before.
//
// Its cost is bounded by the files, not the tensor count: windows a page
// or less apart join, so a file holds at most one span per 64 KiB, and
// the advice asks for at most what SmallTensorBytes' windows would read.
// Every tensor of at most max bytes is announced, whether the plan reads
// it or not (a per-tensor scalar scale too): the checkpoint does not know
// which its callers want, and a window of one not read is 64 KiB of
// page cache.
func (c *Checkpoint) adviseSmall(max int64) {
	c.adviseOnce.Do(func() {
		for r, spans := range smallSpans(c.Tensors, max) {
			willNeed(r, spans)
		}
	})
}

// smallSpans are the byte ranges of each file that SmallTensorBytes reads
// for the tensors of at most most bytes: the small window from each
// tensor's first byte (it reads smallWindowBytes there, so that one read
// serves close neighbours), in order, ranges that overlap or lie a page
// or less apart joined.
func smallSpans(ts []*Tensor, most int64) map[io.ReaderAt][][2]int64 {
	const page = 4 << 10
	out := map[io.ReaderAt][][2]int64{}
	for _, t := range ts {
		n := t.NumBytes()
		sec, ok := t.Data.(*io.SectionReader)
		if n <= 0 || n > most || !ok {
			continue
		}
		r, base, size := sec.Outer()
		if r == nil || base < 0 || size < n {
			continue
		}
		out[r] = append(out[r], [2]int64{base, base + smallWindowBytes})
	}
	for r, spans := range out {
		slices.SortFunc(spans, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
		joined := spans[:1]
		for _, s := range spans[1:] {
			last := &joined[len(joined)-1]
			if s[0] <= last[1]+page {
				last[1] = max(last[1], s[1])
				continue
			}
			joined = append(joined, s)
		}
		out[r] = joined
	}
	return out
}
