//go:build !linux

package convert

import "os"

func preallocate(*os.File, int64) error { return nil }

var startWriteback func(*os.File, int64, int64) // none: the final fsync writes everything

// No O_DIRECT here: shards are written through the page cache.
func openDirect(string) (*os.File, error)         { return nil, errDirectUnsupported }
func directRefused(error) bool                    { return false }
func alignedBuffer(n int) ([]byte, func(), error) { return make([]byte, n), func() {}, nil }

func openDirectRead(string) (*os.File, error) { return nil, errDirectUnsupported }
func freeBytes(string) int64                  { return -1 }
