package moe

import (
	"context"
	"math"
	"strings"
	"testing"
)

// TestGeluTanh: torch's gelu(approximate="tanh") at a few points (values
// from the formula in float64), odd-symmetric up to g: gelu(g) - gelu(-g) = g.
func TestGeluTanh(t *testing.T) {
	for _, c := range []struct{ g, want float64 }{
		{0, 0}, {1, 0.8411919906082768}, {-1, -0.15880800939172324}, {3, 2.996362607918227},
	} {
		if got := GeluTanh(c.g); math.Abs(got-c.want) > 1e-15 {
			t.Errorf("GeluTanh(%v) = %v, want %v", c.g, got, c.want)
		}
		if d := GeluTanh(c.g) - GeluTanh(-c.g); math.Abs(d-c.g) > 1e-15 {
			t.Errorf("GeluTanh(%v) - GeluTanh(%v) = %v, want %v", c.g, -c.g, d, c.g)
		}
	}
}

// TestScaleByExpert: each weight times its expert's entry, rounded to
// float32; an id outside the scale vector is an error naming the slot.
func TestScaleByExpert(t *testing.T) {
	r := &Routing{T: 2, K: 2, IDs: []int32{2, 0, 1, 2}, Weights: []float32{0.5, 0.25, 1, 0.1}}
	s := []float32{3, 0.5, 1.5}
	if err := ScaleByExpert(r, s); err != nil {
		t.Fatal(err)
	}
	for i, want := range []float32{0.75, 0.75, 0.5, float32(0.1) * 1.5} {
		if r.Weights[i] != want {
			t.Errorf("slot %d: %v, want %v", i, r.Weights[i], want)
		}
	}
	bad := &Routing{T: 1, K: 1, IDs: []int32{3}, Weights: []float32{1}}
	if err := ScaleByExpert(bad, s); err == nil || !strings.Contains(err.Error(), "slot 0 names expert 3 of 3") {
		t.Errorf("out-of-range id: %v", err)
	}
}

// TestUngatedExperts: an ungated expert (Nemotron-H) is down(relu(up x)^2)
// with no gate weights at all, against a float64 sum by hand; the same
// weights run as SwiGLU with a gate would be refused without the gate,
// and gate weights beside an ungated activation are refused too.
func TestUngatedExperts(t *testing.T) {
	const tok, h, inter, e = 3, 4, 2, 2
	x := []float32{1, -0.5, 0.25, 2, -1, 0.5, 1.5, -0.25, 0.75, 0.5, -2, 1}
	up := [e][]float32{{0.5, -0.25, 1, 0.125, -1, 0.5, 0.25, 0.75}, {0.25, 0.25, -0.5, 1, 0.5, -0.75, 1, -0.125}}
	down := [e][]float32{{1, -0.5, 0.25, 2, -1, 0.5, 0.75, 0.25}, {0.5, 1, -0.25, 0.5, 1, -1, 0.125, 2}}
	ids := []int32{0, 1, 1, 0, 1, 0} // top-2: every token both experts, in both orders
	al, err := AlignBlockSize(ids, e, 4)
	if err != nil {
		t.Fatal(err)
	}
	act := ungatedAct{}
	load := func(_ context.Context, id int) (*ExpertMats, error) {
		return &ExpertMats{Up: up[id], Down: down[id], Act: act}, nil
	}
	out, err := GroupedGEMM(context.Background(), x, tok, h, inter, 2, al, load, GEMMOptions{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	for s, id := range ids {
		tk := s / 2
		for j := range h {
			want := 0.0
			for n := range inter {
				u := 0.0
				for c := range h {
					u += float64(x[tk*h+c]) * float64(up[id][n*h+c])
				}
				want += float64(float32(ReLU2(float64(float32(u))))) * float64(down[id][j*inter+n])
			}
			if got := float64(out[s*h+j]); math.Abs(got-want) > 1e-5*math.Max(1, math.Abs(want)) {
				t.Errorf("slot %d col %d: %v, want %v", s, j, got, want)
			}
		}
	}
	gated := func(_ context.Context, id int) (*ExpertMats, error) {
		return &ExpertMats{Gate: up[id], Up: up[id], Down: down[id], Act: act}, nil
	}
	if _, err := GroupedGEMM(context.Background(), x, tok, h, inter, 2, al, gated, GEMMOptions{Workers: 1}); err == nil || !strings.Contains(err.Error(), "ungated") {
		t.Errorf("gate weights beside an ungated activation: %v", err)
	}
	swiglu := func(_ context.Context, id int) (*ExpertMats, error) {
		return &ExpertMats{Up: up[id], Down: down[id]}, nil
	}
	if _, err := GroupedGEMM(context.Background(), x, tok, h, inter, 2, al, swiglu, GEMMOptions{Workers: 1}); err == nil {
		t.Error("a SwiGLU expert without gate weights ran")
	}
	if ReLU2(-3) != 0 || ReLU2(3) != 9 || !math.IsNaN(ReLU2(math.NaN())) {
		t.Error("ReLU2 at -3, 3, NaN")
	}
}

// ungatedAct is layout.ReLU2 as the moe package sees it (layout imports
// moe, not the other way round).
type ungatedAct struct{}

func (ungatedAct) SwiGLU() bool               { return false }
func (ungatedAct) Apply(_, u float64) float64 { return ReLU2(u) }
func (ungatedAct) Ungated() bool              { return true }
