package cuda

import (
	"fmt"
	"runtime"
	"unsafe"
)

// DevicePtr is a device address (CUdeviceptr). Zero is the null pointer.
type DevicePtr uint64

// Add returns p advanced by n bytes.
func (p DevicePtr) Add(n int) DevicePtr { return p + DevicePtr(n) }

// Stream is a CUstream; zero is the legacy default stream.
type Stream uintptr

// Elem is an element type a Buffer can hold.
type Elem interface {
	~float32 | ~float64 | ~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64
}

// bytesOf views a slice as its bytes (no copy).
func bytesOf[T Elem](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}

// hostPtr pins the first byte of b for the duration of a driver call.
func hostPtr(p *runtime.Pinner, b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	p.Pin(&b[0])
	return uintptr(unsafe.Pointer(&b[0]))
}

// Alloc allocates n bytes of device memory (cuMemAlloc_v2).
func (c *Ctx) Alloc(n int) (DevicePtr, error) {
	if n <= 0 {
		return 0, fmt.Errorf("cuda: cuMemAlloc_v2 of %d bytes", n)
	}
	p := new(DevicePtr)
	if err := c.call("cuMemAlloc_v2", uintptr(unsafe.Pointer(p)), uintptr(n)); err != nil {
		return 0, fmt.Errorf("%w (allocating %d bytes)", err, n)
	}
	return *p, nil
}

// Free releases device memory (cuMemFree_v2); freeing 0 is a no-op.
func (c *Ctx) Free(p DevicePtr) error {
	if p == 0 {
		return nil
	}
	return c.call("cuMemFree_v2", uintptr(p))
}

// CopyHtoD copies host bytes to the device, synchronously.
func (c *Ctx) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	return c.call("cuMemcpyHtoD_v2", uintptr(dst), hostPtr(&pin, src), uintptr(len(src)))
}

// CopyDtoH copies device bytes to the host, synchronously.
func (c *Ctx) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	return c.call("cuMemcpyDtoH_v2", hostPtr(&pin, dst), uintptr(src), uintptr(len(dst)))
}

// CopyDtoD copies n bytes between device addresses.
func (c *Ctx) CopyDtoD(dst, src DevicePtr, n int) error {
	if n <= 0 {
		return nil
	}
	return c.call("cuMemcpyDtoD_v2", uintptr(dst), uintptr(src), uintptr(n))
}

// MemsetD32 sets n 32-bit words at dst to v.
func (c *Ctx) MemsetD32(dst DevicePtr, v uint32, n int) error {
	if n <= 0 {
		return nil
	}
	return c.call("cuMemsetD32_v2", uintptr(dst), uintptr(v), uintptr(n))
}

// MemsetD32Async queues setting n 32-bit words at dst to v on stream s.
func (c *Ctx) MemsetD32Async(dst DevicePtr, v uint32, n int, s Stream) error {
	if n <= 0 {
		return nil
	}
	return c.call("cuMemsetD32Async", uintptr(dst), uintptr(v), uintptr(n), uintptr(s))
}

// MemsetD8 sets n bytes at dst to v.
func (c *Ctx) MemsetD8(dst DevicePtr, v uint8, n int) error {
	if n <= 0 {
		return nil
	}
	return c.call("cuMemsetD8_v2", uintptr(dst), uintptr(v), uintptr(n))
}

// Buffer is a typed device array of n elements of T.
type Buffer[T Elem] struct {
	dev *Device
	ptr DevicePtr
	n   int
}

// Alloc allocates a device array of n elements.
func Alloc[T Elem](d *Device, n int) (*Buffer[T], error) {
	var z T
	size := int(unsafe.Sizeof(z))
	if n <= 0 || n > (1<<62)/size {
		return nil, fmt.Errorf("cuda: buffer of %d elements", n)
	}
	b := &Buffer[T]{dev: d, n: n}
	err := d.Do(func(c *Ctx) error {
		var e error
		b.ptr, e = c.Alloc(n * size)
		return e
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// FromHost allocates a device array holding a copy of src.
func FromHost[T Elem](d *Device, src []T) (*Buffer[T], error) {
	b, err := Alloc[T](d, len(src))
	if err != nil {
		return nil, err
	}
	if err := b.Upload(src); err != nil {
		b.Free()
		return nil, err
	}
	return b, nil
}

// Ptr is the buffer's device address (for kernel arguments).
func (b *Buffer[T]) Ptr() DevicePtr {
	if b == nil {
		return 0
	}
	return b.ptr
}

// Len is the number of elements.
func (b *Buffer[T]) Len() int { return b.n }

// Device is the buffer's device.
func (b *Buffer[T]) Device() *Device { return b.dev }

// Bytes is the size in bytes.
func (b *Buffer[T]) Bytes() int {
	var z T
	return b.n * int(unsafe.Sizeof(z))
}

// Upload copies src into the start of the buffer. The copy is synchronous
// on the legacy default stream, so it orders after work on streams made by
// NewStream (which are blocking streams).
func (b *Buffer[T]) Upload(src []T) error {
	if len(src) > b.n {
		return fmt.Errorf("cuda: upload of %d elements into a buffer of %d", len(src), b.n)
	}
	return b.dev.Do(func(c *Ctx) error { return c.CopyHtoD(b.ptr, bytesOf(src)) })
}

// Download copies the start of the buffer into dst (synchronous; see Upload).
func (b *Buffer[T]) Download(dst []T) error {
	if len(dst) > b.n {
		return fmt.Errorf("cuda: download of %d elements from a buffer of %d", len(dst), b.n)
	}
	return b.dev.Do(func(c *Ctx) error { return c.CopyDtoH(bytesOf(dst), b.ptr) })
}

// ToHost returns a copy of the first n elements (all when n < 0).
func (b *Buffer[T]) ToHost(n int) ([]T, error) {
	if n < 0 || n > b.n {
		n = b.n
	}
	out := make([]T, n)
	return out, b.Download(out)
}

// Fill sets every element to the bit pattern of v (4-byte or 1-byte types).
func (b *Buffer[T]) Fill(v T) error {
	size := int(unsafe.Sizeof(v))
	return b.dev.Do(func(c *Ctx) error {
		switch size {
		case 4:
			return c.MemsetD32(b.ptr, *(*uint32)(unsafe.Pointer(&v)), b.n)
		case 1:
			return c.MemsetD8(b.ptr, *(*uint8)(unsafe.Pointer(&v)), b.n)
		}
		return fmt.Errorf("cuda: Fill supports 1- and 4-byte elements, not %d", size)
	})
}

// Free releases the buffer; it is safe to call twice.
func (b *Buffer[T]) Free() error {
	if b == nil || b.ptr == 0 {
		return nil
	}
	p := b.ptr
	b.ptr = 0
	return b.dev.Do(func(c *Ctx) error { return c.Free(p) })
}

// HostBuffer is page-locked host memory (cuMemAllocHost_v2): the staging
// area for asynchronous host-to-device copies.
type HostBuffer struct {
	dev *Device
	ptr uintptr
	n   int
}

// AllocHost allocates n bytes of pinned host memory.
func (d *Device) AllocHost(n int) (*HostBuffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: pinned host buffer of %d bytes", n)
	}
	h := &HostBuffer{dev: d, n: n}
	err := d.Do(func(c *Ctx) error {
		return c.call("cuMemAllocHost_v2", uintptr(unsafe.Pointer(&h.ptr)), uintptr(n))
	})
	if err != nil {
		return nil, fmt.Errorf("%w (allocating %d pinned bytes)", err, n)
	}
	return h, nil
}

// Bytes views the pinned memory; the slice is invalid after Free.
func (h *HostBuffer) Bytes() []byte {
	base := *(*unsafe.Pointer)(unsafe.Pointer(&h.ptr))
	return unsafe.Slice((*byte)(base), h.n)
}

// Len is the size in bytes.
func (h *HostBuffer) Len() int { return h.n }

// Free releases the pinned memory.
func (h *HostBuffer) Free() error {
	if h == nil || h.ptr == 0 {
		return nil
	}
	p := h.ptr
	h.ptr = 0
	return h.dev.Do(func(c *Ctx) error { return c.call("cuMemFreeHost", p) })
}

// CopyHtoDAsync queues a copy of n bytes from h at offset off to dst on
// stream; h must stay allocated until the stream reaches the copy.
func (c *Ctx) CopyHtoDAsync(dst DevicePtr, h *HostBuffer, off, n int, s Stream) error {
	if off < 0 || n < 0 || off+n > h.n {
		return fmt.Errorf("cuda: async copy of bytes [%d,%d) from a pinned buffer of %d", off, off+n, h.n)
	}
	if n == 0 {
		return nil
	}
	return c.call("cuMemcpyHtoDAsync_v2", uintptr(dst), h.ptr+uintptr(off), uintptr(n), uintptr(s))
}

// CopyDtoHAsync queues a copy of n bytes from src into h at offset off.
func (c *Ctx) CopyDtoHAsync(h *HostBuffer, off int, src DevicePtr, n int, s Stream) error {
	if off < 0 || n < 0 || off+n > h.n {
		return fmt.Errorf("cuda: async copy into bytes [%d,%d) of a pinned buffer of %d", off, off+n, h.n)
	}
	if n == 0 {
		return nil
	}
	return c.call("cuMemcpyDtoHAsync_v2", h.ptr+uintptr(off), uintptr(src), uintptr(n), uintptr(s))
}
