//go:build linux

package convert

import (
	"errors"
	"os"

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
