// Package costtest measures what a call costs, for the tests that hold
// parsers of hostile input to bounds: bytes allocated (not only retained:
// an allocation collected again still had to fit) and wall time.
package costtest

import (
	"runtime"
	"time"
)

// Measure runs f once and returns the bytes it allocated and how long it
// took. A garbage collection first keeps earlier garbage out of the count.
func Measure(f func()) (alloc uint64, took time.Duration) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	f()
	took = time.Since(start)
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, took
}
