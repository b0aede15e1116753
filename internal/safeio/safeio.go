// Package safeio opens the files moeprep reads from a checkpoint directory
// without trusting what they are: a named pipe would block an open or a read
// forever, a device can be endless, and a sparse file can claim gigabytes it
// does not hold. Every function here refuses anything but a regular file
// (symbolic links are followed: hub caches link every file into blobs/) and
// names the path in its error.
package safeio

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Open opens path for reading if it is a regular file, after following
// symbolic links. It opens with O_NONBLOCK so that a named pipe cannot
// block the open itself, then checks what it opened (no window between a
// check and the open for the file to be swapped).
func Open(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, Unwrap(err))
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, Unwrap(err))
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %s, not a regular file; moeprep reads only regular files", path, Kind(st.Mode()))
	}
	return f, nil
}

// ReadFile reads a whole regular file of at most max bytes. The size is
// checked before anything is read, so a huge or sparse file costs nothing;
// what is read is still capped at max+1 bytes in case the file grows.
func ReadFile(path string, max int64, what string) ([]byte, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, Unwrap(err))
	}
	if st.Size() > max {
		return nil, TooLarge(path, st.Size(), max, what)
	}
	// One allocation of the stated size (plus a byte to see growth), not
	// io.ReadAll's doubling, which costs up to twice the file.
	b := make([]byte, st.Size()+1)
	n, err := io.ReadFull(f, b)
	switch {
	case err == io.ErrUnexpectedEOF || err == io.EOF:
		return b[:n], nil // the file ended where its size said, or shrank
	case err != nil:
		return nil, fmt.Errorf("%s: %w", path, Unwrap(err))
	}
	// Still more: the file grew while being read. Read what fits the limit.
	rest, err := io.ReadAll(io.LimitReader(f, max+1-int64(n)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, Unwrap(err))
	}
	b = append(b[:n], rest...)
	if int64(len(b)) > max {
		return nil, TooLarge(path, int64(len(b)), max, what)
	}
	return b, nil
}

// CloseAll closes every one of cs and reports the first error.
func CloseAll[C io.Closer](cs []C) error {
	var first error
	for _, c := range cs {
		if err := c.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// TooLarge is the error for a file over a size limit.
func TooLarge(path string, size, max int64, what string) error {
	return fmt.Errorf("%s: %d bytes, over the %d-byte limit for %s (not a real %s?)", path, size, max, what, what)
}

// Kind names a file mode for error messages.
func Kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsRegular():
		return "a regular file"
	}
	return "a special file"
}

// Unwrap is the error a *fs.PathError holds, without its operation and
// path, or err itself when it holds none: for a message that names the
// path in its own words ("DST: cannot create it: permission denied").
func Unwrap(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
