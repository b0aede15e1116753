//go:build unix

package convert

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// lockDir takes an exclusive, non-blocking flock on the open directory d.
// busy is true when another process holds it. The kernel drops the lock
// when the process ends, however it ends, so a killed run never leaves a
// stale lock behind.
func lockDir(d *os.File) (busy bool, err error) {
	err = unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return true, nil
	}
	return false, err
}
