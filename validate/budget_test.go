package validate

import (
	"testing"

	"github.com/moeprep/moeprep/validate/stream"
)

// A GPU run's pass budget holds each checked layer's head beside `ahead`
// of its largest expert steps; the readers' window is what it holds beside
// the head.
func TestLayerBudget(t *testing.T) {
	const mb = 1 << 20
	type layer struct {
		head int64
		bank []int64
	}
	cases := []struct {
		name   string
		layers []layer
		rest   []int64 // steps no layer holds (the byte proof's rest of DST)
		ahead  int
		want   int64
	}{
		// Kimi-K2 INT4: a BF16 shared expert of 88 MB in the head, experts
		// of 49 MB of SRC and DST. Stream's default, four of the largest
		// step, would be four heads: 352 MB.
		{"a head larger than its experts", []layer{{88, []int64{49, 49, 47}}}, nil, 6, (88 + 6*49) * mb},
		{"fewer steps ahead", []layer{{88, []int64{49, 49}}}, nil, 4, (88 + 4*49) * mb},
		// DeepSeek-V3 FP8: 45 MB of head, 88 MB experts.
		{"at most MaxBudget", []layer{{45, []int64{88, 88}}}, nil, 6, stream.MaxBudget},
		{"at least MinBudget", []layer{{1, []int64{2, 3}}}, nil, 6, stream.MinBudget},
		{"the layer that needs most", []layer{{10, []int64{20}}, {90, []int64{20, 30}}}, nil, 6, (90 + 6*30) * mb},
		{"two of a large rest step", []layer{{1, []int64{26}}}, []int64{5, 150}, 6, 300 * mb},
		{"no layer checked: stream's default", nil, []int64{40}, 6, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pp := &passPlan{layers: map[int]*layerSteps{}}
			add := func(n int64, layer int) int {
				// two extents, so that a step's bytes are their sum
				pp.steps = append(pp.steps, stream.Step{Extents: []stream.Extent{{N: n*mb - 4096}, {N: 4096}}})
				pp.layerOf = append(pp.layerOf, layer)
				return len(pp.steps) - 1
			}
			for li, l := range c.layers {
				ls := &layerSteps{head: add(l.head, li)}
				for _, n := range l.bank {
					ls.bank = append(ls.bank, add(n, li))
				}
				pp.layers[li] = ls
			}
			for _, n := range c.rest {
				add(n, -1)
			}
			if got := layerBudget(pp, c.ahead); got != c.want {
				t.Errorf("budget %d MiB, want %d MiB", got/mb, c.want/mb)
			}
		})
	}
}

func TestPaceWindow(t *testing.T) {
	const mb = 1 << 20
	cases := []struct {
		name               string
		budget, head, step int64
		want               int
	}{
		{"what the budget holds beside the head", (88 + 6*49) * mb, 88 * mb, 49 * mb, 6},
		{"the head's room is not the experts'", 512 * mb, 45 * mb, 88 * mb, 5},
		{"at least four", 64 * mb, 1 * mb, 26 * mb, 4},
		{"a head past the budget", 64 * mb, 100 * mb, 26 * mb, 4},
		{"no bank step", 64 * mb, 1 * mb, 0, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lp := &layerPass{budget: c.budget, head: c.head, step: c.step}
			if got := paceWindow(lp); got != c.want {
				t.Errorf("window %d, want %d", got, c.want)
			}
		})
	}
}
