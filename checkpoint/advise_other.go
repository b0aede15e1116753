//go:build !linux

package checkpoint

import "io"

// willNeed is advice this platform is not given: the reads go to the disk
// as they come.
func willNeed(io.ReaderAt, [][2]int64) {}
