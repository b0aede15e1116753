package stream

import (
	"sync"
	"unsafe"
)

// buffers hands out the memory steps are read into, aligned for O_DIRECT.
//
// Large buffers come from one arena, mapped once (at the first large
// buffer) and handed out again and again until the pass closes: a pass
// reads gigabytes through a few hundred MB, in sizes that do not repeat
// (a DeepSeek-V3 FP8 layer's SRC expert is one read of 42 MB, DST's
// slices of it three of 14 MB), and memory new to the process costs a
// fault per page and the page's zeroing. On this development machine, a
// VM, that cost is the host's as well: before the arena, buffers kept by
// size were mapped again whenever the next size differed, and zeroing
// fresh pages took a tenth of a DeepSeek-V3 FP8 layer's CPU time
// (BENCHMARKS.md, issue 45). The arena's free ranges are taken first fit
// from its start, so the pages touched are about the most the pass holds
// at once, never more than the arena.
//
// The arena is keep plus a quarter (a pass's budget, and room for what
// fragments it): what the pass holds past that (a reader that wants a step
// past the budget, a step larger than the budget) is mapped on its own
// and unmapped when freed. Small buffers come from the Go heap.
type buffers struct {
	mu sync.Mutex
	// keep sizes the arena (0: minArena).
	keep  int64
	arena []byte // nil until the first large buffer
	unmap func() // the arena's
	// holes are the arena's free ranges in arenaUnit, in order, none
	// touching the next.
	holes []hole
	// apart are the large buffers mapped on their own, by first byte;
	// mapped, their bytes.
	apart  map[*byte]func()
	mapped int64
}

// hole is a free range of the arena: units [at, at+n).
type hole struct{ at, n int }

// bufUnit is a huge page: where the arena and a buffer mapped on its own
// start, so that a read into one reaches the disk in few requests
// (buffers_linux.go). Buffers of half of it and more are large.
const bufUnit = 2 << 20

// arenaUnit is what the arena is handed out in: its buffers start on a
// multiple of it (a block, as O_DIRECT wants, and more: a 4 MiB read then
// crosses at most three huge pages).
const arenaUnit = 64 << 10

// minArena is the arena of a buffers whose keep is 0 (tests).
const minArena = 64 << 20

// get returns n bytes at an address aligned to directAlign.
func (b *buffers) get(n int64) []byte {
	if n < bufUnit/2 {
		// A whole number of blocks (every O_DIRECT read's buffer) is
		// usually aligned as allocated: the Go heap places objects of such
		// sizes on block boundaries. Only where it is not is a block more
		// taken to align it, which for a step of a small tensor's
		// extents doubled what its reads hold.
		if n > 0 && n%directAlign == 0 {
			if mem := make([]byte, n); alignedAt(mem) == 0 {
				return mem[:n:n]
			}
		}
		mem := make([]byte, n+directAlign)
		a := alignedAt(mem)
		return mem[a : a+int(n) : a+int(n)]
	}
	units := int((n + arenaUnit - 1) / arenaUnit)
	b.mu.Lock()
	if b.arena == nil {
		size := b.keep + b.keep/4
		if b.keep <= 0 {
			size = minArena
		}
		size = (size + bufUnit - 1) / bufUnit * bufUnit
		b.arena, b.unmap = mapBuffer(int(size))
		b.holes = []hole{{0, int(size / arenaUnit)}}
	}
	for i, h := range b.holes {
		if h.n < units {
			continue
		}
		if h.n == units {
			b.holes = append(b.holes[:i], b.holes[i+1:]...)
		} else {
			b.holes[i] = hole{h.at + units, h.n - units}
		}
		b.mu.Unlock()
		lo := h.at * arenaUnit
		return b.arena[lo : lo+int(n) : lo+units*arenaUnit]
	}
	b.mu.Unlock()
	size := units * arenaUnit
	buf, unmap := mapBuffer(size)
	b.mu.Lock()
	if b.apart == nil {
		b.apart = map[*byte]func(){}
	}
	b.apart[unsafe.SliceData(buf)] = unmap
	b.mapped += int64(size)
	b.mu.Unlock()
	return buf[:n]
}

// bufSize is what get(n) holds, alignment aside: a large buffer whole
// units of the arena.
func bufSize(n int64) int64 {
	if n < bufUnit/2 {
		return n
	}
	return (n + arenaUnit - 1) / arenaUnit * arenaUnit
}

// put takes back a buffer get returned.
func (b *buffers) put(buf []byte) {
	size := cap(buf)
	if size < bufUnit/2 {
		return // the garbage collector's
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	first := unsafe.SliceData(buf)
	if unmap, ok := b.apart[first]; ok {
		unmap()
		delete(b.apart, first)
		b.mapped -= int64(size)
		return
	}
	// A buffer of the arena goes back to its holes. One put back after
	// close (a reader that pinned a step past the pass's end) has nothing
	// to go back to: the arena is gone, and so is it.
	off := uintptr(unsafe.Pointer(first)) - uintptr(unsafe.Pointer(unsafe.SliceData(b.arena)))
	if b.arena == nil || off >= uintptr(len(b.arena)) || off%arenaUnit != 0 || size%arenaUnit != 0 {
		return
	}
	b.free(hole{int(off / arenaUnit), size / arenaUnit})
}

// free returns h to the arena's holes, joined with the holes it touches.
// The lock is held.
func (b *buffers) free(h hole) {
	i := 0
	for i < len(b.holes) && b.holes[i].at < h.at {
		i++
	}
	if i > 0 && b.holes[i-1].at+b.holes[i-1].n == h.at {
		i--
		h = hole{b.holes[i].at, b.holes[i].n + h.n}
		b.holes = append(b.holes[:i], b.holes[i+1:]...)
	}
	if i < len(b.holes) && h.at+h.n == b.holes[i].at {
		h.n += b.holes[i].n
		b.holes = append(b.holes[:i], b.holes[i+1:]...)
	}
	b.holes = append(b.holes, hole{})
	copy(b.holes[i+1:], b.holes[i:])
	b.holes[i] = h
}

// close releases every large buffer; none may be used after.
func (b *buffers) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, unmap := range b.apart {
		unmap()
	}
	if b.unmap != nil {
		b.unmap()
	}
	b.apart, b.mapped, b.arena, b.unmap, b.holes = nil, 0, nil, nil, nil
}

// alignedAt is the first index of b whose address is a multiple of
// directAlign.
func alignedAt(b []byte) int {
	return int(-uintptr(unsafe.Pointer(unsafe.SliceData(b)))) & (directAlign - 1)
}
