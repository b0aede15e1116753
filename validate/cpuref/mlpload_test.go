package cpuref

import (
	"fmt"
	"testing"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// TestLoadMLPByTable: loadWeights and loadBiases read each projection of a
// small in-memory MLP (inter 2, h 3: gate and up [2,3], down [3,2]) into
// its own slot by projection, an ungated MLP's gate and the never-source
// ProjGateUp left nil, and name the tensor that is missing or misshapen.
func TestLoadMLPByTable(t *testing.T) {
	const inter, h = 2, 3
	// Each weight's values are its projection's number times 10 plus the
	// element's index, so a weight in the wrong slot is seen.
	vals := func(p layout.Proj, n int) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = float32(10*int(p) + i)
		}
		return out
	}
	build := func(gated, biased bool, edit func(src cktest.Mem, m *family.MLP)) (cktest.Mem, family.MLP) {
		src := cktest.Mem{}
		m := family.MLPOf("e.gate_proj.weight", "e.up_proj.weight", "e.down_proj.weight")
		if !gated {
			m.Clear(layout.ProjGate)
		}
		for _, p := range layout.MLPProjs {
			if m.Weight(p) == "" {
				continue
			}
			rows, cols := projDims(p, inter, h)
			src.PutF32(m.Weight(p), []int64{int64(rows), int64(cols)}, vals(p, rows*cols)...)
			if biased {
				b := fmt.Sprintf("e.%s_proj.bias", p)
				m.Set(p, layout.RoleBias, b)
				src.PutF32(b, []int64{int64(rows)}, vals(p, rows)...)
			}
		}
		if edit != nil {
			edit(src, &m)
		}
		return src, m
	}
	for _, tc := range []struct {
		name           string
		gated, biased  bool
		edit           func(src cktest.Mem, m *family.MLP)
		weightErr      string // "": the weights load
		biasErr        string // "": the biases load
		loadedOnWeight []layout.Proj
	}{
		{name: "gated, no biases", gated: true},
		{name: "ungated", gated: false},
		{name: "gated with biases", gated: true, biased: true},
		{name: "up missing: gate loaded before it", gated: true,
			edit:      func(src cktest.Mem, m *family.MLP) { delete(src, m.Weight(layout.ProjUp)) },
			weightErr: "e.up_proj.weight", loadedOnWeight: []layout.Proj{layout.ProjGate}},
		{name: "down misshapen", gated: true,
			edit: func(src cktest.Mem, m *family.MLP) {
				src.PutF32(m.Weight(layout.ProjDown), []int64{inter, h}, vals(layout.ProjDown, inter*h)...)
			},
			weightErr: "e.down_proj.weight", loadedOnWeight: []layout.Proj{layout.ProjGate, layout.ProjUp}},
		{name: "down bias missing", gated: true, biased: true,
			edit:    func(src cktest.Mem, m *family.MLP) { delete(src, m.Get(layout.ProjDown, layout.RoleBias)) },
			biasErr: "e.down_proj.bias"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, m := build(tc.gated, tc.biased, tc.edit)
			w, err := loadWeights(src, m, inter, h, nil)
			if testkit.WantErr(t, err, tc.weightErr) {
				for _, p := range tc.loadedOnWeight {
					if w[p] == nil {
						t.Errorf("loadWeights failed without handing back %s, loaded before the failure", p)
					}
				}
				return
			}
			b, err := loadBiases(src, m, inter, h)
			if testkit.WantErr(t, err, tc.biasErr) {
				return
			}
			for p := range layout.NumProj {
				rows, cols := projDims(p, inter, h)
				wantW, wantB := fmt.Sprint(vals(p, rows*cols)), fmt.Sprint(vals(p, rows))
				if p == layout.ProjGateUp || (p == layout.ProjGate && !tc.gated) {
					wantW = "[]"
				}
				if !tc.biased || p == layout.ProjGateUp {
					wantB = "[]"
				}
				if got := fmt.Sprint(decodeAll(t, w[p], rows, cols)); got != wantW {
					t.Errorf("weight %s = %s, want %s", p, got, wantW)
				}
				if got := fmt.Sprint(b[p]); got != wantB {
					t.Errorf("bias %s = %s, want %s", p, got, wantB)
				}
			}
		})
	}
}

// decodeAll is a banded weight's values, decoded band by band (nil: none).
func decodeAll(t *testing.T, w *tensorload.Bands, rows, cols int) []float32 {
	t.Helper()
	if w == nil {
		return nil
	}
	var all []float32
	if err := moe.EachBand(w, nil, rows, cols, func(_, _ int, band []float32) { all = append(all, band...) }); err != nil {
		t.Fatal(err)
	}
	return all
}

// bandsOf starts its bands where both weights may: the least multiple of
// their bands.
func TestBandsOfBand(t *testing.T) {
	for _, c := range []struct{ band, inner, want int }{
		{32, 1, 32}, {1, 32, 32}, {4, 6, 12}, {128, 32, 128}, {0, 5, 5}, {7, 7, 7},
	} {
		if got := (bandsOf{fixedBand(c.inner), c.band}).Band(); got != c.want {
			t.Errorf("bandsOf{band %d} over a weight of bands %d: %d, want %d", c.band, c.inner, got, c.want)
		}
	}
}

// fixedBand is a weight whose bands start on multiples of its value.
type fixedBand int

func (f fixedBand) Band() int                            { return int(f) }
func (f fixedBand) Rows(r0, r1 int, dst []float32) error { return nil }
