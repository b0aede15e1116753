package stream

import (
	"sync"
	"unsafe"
)

// buffers hands out the memory steps are read into, aligned for O_DIRECT.
// Large buffers (whole pages, starting on a huge page) are kept for reuse
// until the pass closes: a pass reads gigabytes through a few hundred MB
// of them, the steps of a layer come in a few sizes that repeat, and
// memory new to the process costs a fault per page (on this development
// machine a VM fault back to the host). Small ones come from the Go heap.
// What is kept is bounded (keep): a buffer freed while more than keep
// bytes are mapped is unmapped instead, so that sizes that do not come
// again (a layer's head) and the steps a reader wanted past the budget do
// not stay for the rest of the pass.
type buffers struct {
	mu   sync.Mutex
	free map[int][][]byte // by size
	maps map[*byte]func() // each large buffer's unmap, by its first byte
	// keep: the large buffers' bytes kept mapped at most once freed (0:
	// every one); mapped: their bytes mapped now, in use or free.
	keep, mapped int64
}

// bufUnit is where large buffers start: a huge page, so that a read into
// one reaches the disk as one request (buffers_linux.go).
const bufUnit = 2 << 20

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
	size := int(bufSize(n))
	b.mu.Lock()
	// the smallest free buffer that holds n, if not much larger
	best := 0
	for s, l := range b.free {
		if len(l) > 0 && s >= size && s <= size+size/8 && (best == 0 || s < best) {
			best = s
		}
	}
	if best > 0 {
		l := b.free[best]
		buf := l[len(l)-1]
		b.free[best] = l[:len(l)-1]
		b.mu.Unlock()
		return buf[:n]
	}
	b.mu.Unlock()
	buf, unmap := mapBuffer(size)
	b.mu.Lock()
	if b.maps == nil {
		b.maps = map[*byte]func(){}
	}
	b.maps[unsafe.SliceData(buf)] = unmap
	b.mapped += int64(size)
	b.mu.Unlock()
	return buf[:n]
}

// bufSize is what get(n) allocates, alignment aside: large buffers are
// whole pages.
func bufSize(n int64) int64 {
	if n < bufUnit/2 {
		return n
	}
	return (n + directAlign - 1) / directAlign * directAlign
}

// put takes back a buffer get returned.
func (b *buffers) put(buf []byte) {
	size := cap(buf)
	if size < bufUnit/2 {
		return // the garbage collector's
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if unmap, ok := b.maps[unsafe.SliceData(buf)]; ok && b.keep > 0 && b.mapped > b.keep {
		unmap()
		delete(b.maps, unsafe.SliceData(buf))
		b.mapped -= int64(size)
		return
	}
	if b.free == nil {
		b.free = map[int][][]byte{}
	}
	b.free[size] = append(b.free[size], buf[:size])
}

// close releases every large buffer; none may be used after.
func (b *buffers) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, unmap := range b.maps {
		unmap()
	}
	b.maps, b.free, b.mapped = nil, nil, 0
}

// alignedAt is the first index of b whose address is a multiple of
// directAlign.
func alignedAt(b []byte) int {
	return int(-uintptr(unsafe.Pointer(unsafe.SliceData(b)))) & (directAlign - 1)
}
