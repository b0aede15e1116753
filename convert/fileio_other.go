//go:build !linux

package convert

import "os"

func preallocate(*os.File, int64) error { return nil }

var startWriteback func(*os.File, int64, int64) // none: the final fsync writes everything
