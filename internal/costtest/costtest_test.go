package costtest

import "testing"

var sink []byte

func TestMeasure(t *testing.T) {
	alloc, took := Measure(func() { sink = make([]byte, 8<<20) })
	if alloc < 8<<20 || alloc > 9<<20 || took <= 0 {
		t.Fatalf("8 MiB allocation measured as %d bytes in %v", alloc, took)
	}
	if alloc, _ := Measure(func() {}); alloc > 64<<10 { // the runtime allocates a little of its own (seen: 5 kB)
		t.Fatalf("nothing measured as %d bytes", alloc)
	}
}
