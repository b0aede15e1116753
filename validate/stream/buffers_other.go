//go:build !linux

package stream

import (
	"errors"
	"os"
)

// mapBuffer is size bytes of the Go heap, aligned to directAlign.
func mapBuffer(size int) ([]byte, func()) {
	mem := make([]byte, size+directAlign)
	a := alignedAt(mem)
	return mem[a : a+size : a+size], func() {}
}

// openDirect: reads go through the page cache where O_DIRECT is Linux's.
func openDirect(string) (*os.File, error) {
	return nil, errors.New("no O_DIRECT here")
}
