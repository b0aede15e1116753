package gpurun

import (
	"math/rand/v2"
	"testing"
)

// transposeInto writes the asked columns of a rows x cols matrix as rows,
// element for element, for every element size the banks hold (FP8, bf16,
// f32 and its scales), at sizes that are not multiples of its tiles and
// from any first column.
func TestTransposeInto(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 31))
	for _, c := range []struct{ rows, cols, c0, nc, es int64 }{
		{1, 1, 0, 1, 1}, {3, 5, 0, 5, 2}, {70, 130, 0, 130, 4}, {70, 130, 64, 66, 2},
		{129, 65, 1, 63, 1}, {200, 3, 2, 1, 4}, {64, 64, 0, 64, 2},
	} {
		in := make([]byte, c.rows*c.cols*c.es)
		for i := range in {
			in[i] = byte(rng.UintN(256))
		}
		out := make([]byte, c.nc*c.rows*c.es)
		transposeInto(out, in, c.rows, c.cols, c.c0, c.nc, c.es)
		for col := c.c0; col < c.c0+c.nc; col++ {
			for r := int64(0); r < c.rows; r++ {
				for b := int64(0); b < c.es; b++ {
					got := out[((col-c.c0)*c.rows+r)*c.es+b]
					want := in[(r*c.cols+col)*c.es+b]
					if got != want {
						t.Fatalf("%+v: out[%d][%d] byte %d = %d, want in[%d][%d] = %d", c, col-c.c0, r, b, got, r, col, want)
					}
				}
			}
		}
	}
}
