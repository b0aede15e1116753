//go:build !linux

package convert

import "os"

// Without copy_file_range every chunk goes through a buffer and pwrite.
func copyRange(*os.File, int64, *os.File, int64, int64) error { return errNoCopyRange }

func preallocate(*os.File, int64) error { return nil }

var startWriteback func(*os.File, int64, int64) // none: the final fsync writes everything
