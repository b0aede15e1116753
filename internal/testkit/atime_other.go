//go:build !linux

package testkit

import (
	"os"
	"time"
)

func accessTime(os.FileInfo) (time.Time, bool) { return time.Time{}, false }
