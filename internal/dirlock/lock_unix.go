//go:build unix

// Package dirlock keeps two moeprep runs out of one output: an exclusive,
// non-blocking flock on the open work directory. The kernel drops it when
// the process ends, however it ends, so a killed run never leaves a stale
// lock behind.
package dirlock

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Lock takes the lock on the open directory d; busy is true when another
// process holds it. Closing d's last descriptor releases it.
func Lock(d *os.File) (busy bool, err error) {
	err = unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return true, nil
	}
	return false, err
}
