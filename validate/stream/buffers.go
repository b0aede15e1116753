package stream

import (
	"sync"
	"unsafe"
)

// buffers hands out the memory steps are read into, aligned for O_DIRECT.
// Large buffers are whole multiples of bufUnit, kept for reuse until the
// pass closes: a pass reads gigabytes through a few hundred MB of them, and
// memory new to the process costs a fault per page (on this development
// machine a VM fault back to the host). Small ones come from the Go heap.
type buffers struct {
	mu   sync.Mutex
	free map[int][][]byte // by size
	maps []func()         // unmaps every large buffer
}

// bufUnit is the size large buffers come in: a huge page, so that a read
// into one reaches the disk as one request (buffers_linux.go).
const bufUnit = 2 << 20

// get returns n bytes at an address aligned to directAlign.
func (b *buffers) get(n int64) []byte {
	if n < bufUnit/2 {
		mem := make([]byte, n+directAlign)
		a := alignedAt(mem)
		return mem[a : a+int(n) : a+int(n)]
	}
	size := int((n + bufUnit - 1) / bufUnit * bufUnit)
	b.mu.Lock()
	if l := b.free[size]; len(l) > 0 {
		buf := l[len(l)-1]
		b.free[size] = l[:len(l)-1]
		b.mu.Unlock()
		return buf[:n]
	}
	b.mu.Unlock()
	buf, unmap := mapBuffer(size)
	b.mu.Lock()
	b.maps = append(b.maps, unmap)
	b.mu.Unlock()
	return buf[:n]
}

// put takes back a buffer get returned.
func (b *buffers) put(buf []byte) {
	size := cap(buf)
	if size < bufUnit/2 {
		return // the garbage collector's
	}
	b.mu.Lock()
	defer b.mu.Unlock()
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
	b.maps, b.free = nil, nil
}

// alignedAt is the first index of b whose address is a multiple of
// directAlign.
func alignedAt(b []byte) int {
	return int(-uintptr(unsafe.Pointer(unsafe.SliceData(b)))) & (directAlign - 1)
}
