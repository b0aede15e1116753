//go:build linux

package convert

import (
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// copyRange copies n bytes from src at srcOff to dst at dstOff inside the
// kernel (copy_file_range: page cache to page cache, no copy through user
// space). It returns errNoCopyRange when the kernel or file system cannot,
// and io.ErrUnexpectedEOF when src ends early.
func copyRange(src *os.File, srcOff int64, dst *os.File, dstOff, n int64) error {
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	for n > 0 {
		c, err := unix.CopyFileRange(sfd, &srcOff, dfd, &dstOff, int(min(n, 1<<30)), 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EXDEV), errors.Is(err, unix.EOPNOTSUPP),
			errors.Is(err, unix.EINVAL), errors.Is(err, unix.EBADF), errors.Is(err, unix.EPERM):
			return errNoCopyRange
		case err != nil:
			return err
		case c == 0:
			return io.ErrUnexpectedEOF
		}
		n -= int64(c)
	}
	return nil
}

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
