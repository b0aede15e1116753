package moelayer

import (
	"math"
	"strings"
	"testing"
)

// TestLatent: a latent MoE's down projection, RMSNorm and up projection on
// hand-worked rows, and the errors naming a wrong width or epsilon.
func TestLatent(t *testing.T) {
	// Down [L=2,H=3], norm [2], up [H=3,L=2], each stored flat as F32.
	src := vecSource(map[string][]float32{
		"down": {1, 0, 2, 0, -1, 1},
		"norm": {2, 0.5},
		"up":   {1, 0, 0, 1, 1, -1},
	})
	lt := &Latent{Down: "down", Norm: "norm", Up: "up", H: 3, L: 2, Eps: 1e-6}
	src["down"].Shape, src["up"].Shape = []int64{2, 3}, []int64{3, 2} // matrices, as checkpoints store them
	xl, err := lt.In(src, []float32{1, 2, 3, -1, 0, 1}, 2)
	if err != nil {
		t.Fatal(err)
	}
	// x1 = (1,2,3): (1+6, -2+3) = (7, 1); x2 = (-1,0,1): (-1+2, 0+1) = (1, 1)
	if want := []float32{7, 1, 1, 1}; !equal(xl, want) {
		t.Errorf("In = %v, want %v", xl, want)
	}
	// (3, 4): mean square 12.5; normed (3, 4)/sqrt(12.5+eps) times (2, 0.5).
	y, err := lt.Out(src, []float32{3, 4}, 1)
	if err != nil {
		t.Fatal(err)
	}
	inv := float32(1 / math.Sqrt(12.5+1e-6))
	a, b := (3*inv)*2, (4*inv)*0.5
	if want := []float32{a, b, float32(float64(a) - float64(b))}; !equal(y, want) {
		t.Errorf("Out = %v, want %v", y, want)
	}
	// Normed is Out's input to the up projection (what the GPU paths
	// upload); without a norm, the sums themselves.
	if nr, err := lt.Normed(src, []float32{3, 4}, 1); err != nil || !equal(nr, []float32{a, b}) {
		t.Errorf("Normed = %v, %v, want %v", nr, err, []float32{a, b})
	}
	bare := *lt
	bare.Norm = ""
	if nr, err := bare.Normed(src, []float32{3, -4}, 1); err != nil || !equal(nr, []float32{3, -4}) {
		t.Errorf("Normed without a norm = %v, %v, want the sums", nr, err)
	}
	if _, err := lt.Normed(src, []float32{3, 4, 5}, 1); err == nil || !strings.Contains(err.Error(), "3 values for 1 rows x 2") {
		t.Errorf("Normed of a ragged row: %v", err)
	}
	for _, c := range []struct {
		lt   Latent
		x    []float32
		want string
	}{
		{*lt, []float32{1, 2}, "latent down projection: x has 2 values for 1 tokens x 3"},
		{Latent{Down: "down", Norm: "norm", Up: "up", H: 3, L: 2}, nil, "latent norm norm: epsilon 0: want a positive number"},
	} {
		var err error
		if c.x != nil {
			_, err = c.lt.In(src, c.x, 1)
		} else {
			_, err = c.lt.Out(src, []float32{1, 1}, 1)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}

func equal(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
