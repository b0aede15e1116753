package cores

import (
	"runtime"
	"testing"
)

// Lends nest, N leaves them out, and giving back twice gives back once.
func TestLend(t *testing.T) {
	start := runtime.GOMAXPROCS(0)
	a := Lend(4)
	if got := runtime.GOMAXPROCS(0); got != start+4 {
		t.Fatalf("after Lend(4): GOMAXPROCS %d, want %d", got, start+4)
	}
	b := Lend(2)
	if got, n := runtime.GOMAXPROCS(0), N(); got != start+6 || n != start {
		t.Fatalf("after Lend(2): GOMAXPROCS %d N %d, want %d and %d", got, n, start+6, start)
	}
	a()
	a()
	if got, n := runtime.GOMAXPROCS(0), N(); got != start+2 || n != start {
		t.Fatalf("after giving 4 back (twice): GOMAXPROCS %d N %d, want %d and %d", got, n, start+2, start)
	}
	b()
	if got, n := runtime.GOMAXPROCS(0), N(); got != start || n != start {
		t.Fatalf("after giving all back: GOMAXPROCS %d N %d, want %d", got, n, start)
	}
	Lend(0)()
	if got := runtime.GOMAXPROCS(0); got != start {
		t.Fatalf("Lend(0) changed GOMAXPROCS to %d", got)
	}
}
