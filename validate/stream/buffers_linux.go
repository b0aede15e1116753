//go:build linux

package stream

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapBuffer is size bytes outside the Go heap, aligned to bufUnit and
// asked to be backed by huge pages: physically contiguous memory, so that
// an O_DIRECT read of 4 MiB is not cut into several requests at page
// boundaries (convert's direct writer found the same). Where mapping fails
// the Go heap serves.
func mapBuffer(size int) ([]byte, func()) {
	m, err := unix.Mmap(-1, 0, size+bufUnit, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		mem := make([]byte, size+directAlign)
		a := alignedAt(mem)
		return mem[a : a+size : a+size], func() {}
	}
	skip := 0
	if r := int(uintptr(unsafe.Pointer(&m[0])) % bufUnit); r != 0 {
		skip = bufUnit - r
	}
	b := m[skip : skip+size : skip+size]
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE) // a hint
	return b, func() { _ = unix.Munmap(m) }
}

// openDirect opens path for reading around the page cache, or fails
// where the file system does not allow it (tmpfs: EINVAL).
func openDirect(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
}
