//go:build linux

package convert

import (
	"errors"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// preallocate reserves the file's blocks up front, so a full disk fails the
// shard at once rather than after minutes of copying. File systems without
// fallocate are fine: the writes allocate as they go.
func preallocate(f *os.File, size int64) error {
	if size == 0 {
		return nil
	}
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINTR) {
		return nil
	}
	return err
}

// startWriteback asks the kernel to start writing [off, off+n) of f to disk
// without waiting for it (sync_file_range WRITE). It is a hint: the final
// fsync is what makes the file durable, so an error only means it did not help.
var startWriteback = func(f *os.File, off, n int64) {
	_ = unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}

// openDirect opens path, which exists, for writing with O_DIRECT, or fails
// where the file system does not allow it (tmpfs: EINVAL).
func openDirect(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|unix.O_DIRECT, 0)
}

// directRefused reports whether a direct write failed for its alignment or
// the file system's refusal rather than for the disk: the bytes can still
// go through the page cache.
func directRefused(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)
}

// alignedBuffer is n bytes of memory outside the Go heap, aligned to 2 MiB
// and asked to be backed by huge pages, and the function that unmaps it.
// O_DIRECT needs page-aligned memory. Huge pages make it physically
// contiguous too: a direct write is cut into requests of at most
// max_segments (254 here) pieces of contiguous memory, so from 4 KiB pages a
// 4 MiB write goes to the disk as two or more requests, from 2 MiB pages as
// one, as cp's write-back sends.
func alignedBuffer(n int) ([]byte, func(), error) {
	const huge = 2 << 20
	m, err := unix.Mmap(-1, 0, n+huge, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, err
	}
	skip := 0
	if r := int(uintptr(unsafe.Pointer(&m[0])) % huge); r != 0 {
		skip = huge - r
	}
	b := m[skip : skip+n : skip+n]
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE) // a hint: without huge pages the requests are smaller
	return b, func() { _ = unix.Munmap(m) }, nil
}

// openDirectRead opens path for reading with O_DIRECT (around the page
// cache), or fails where the file system does not allow it.
func openDirectRead(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
}

// freeBytes is the space an unprivileged writer has on dir's file system,
// or -1 when it cannot be read.
func freeBytes(dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return -1
	}
	return int64(st.Bavail) * int64(st.Bsize)
}
