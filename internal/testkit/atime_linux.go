//go:build linux

package testkit

import (
	"os"
	"syscall"
	"time"
)

func accessTime(st os.FileInfo) (time.Time, bool) {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(sys.Atim.Sec, sys.Atim.Nsec), true
}
