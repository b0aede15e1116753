package validate

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/validate/cpuref"
)

// TestGPTOSSDetailsMatter: on the gpt-oss fixture (gate_up_proj scaled so
// that some gate and up values pass the clamp), the CPU reference matches
// HF's golden only with every detail of its experts and router: dropping the
// clamp, the +1 on up, alpha, the expert biases or the router bias each
// moves the output far past float32 rounding. So the golden comparisons
// that pass elsewhere really test these details.
func TestGPTOSSDetailsMatter(t *testing.T) {
	src := filepath.Join(hfFixtures, "gpt-oss")
	ck, plan := openPlanned(t, src)
	layer := &plan.Layers[1]
	g, err := ReadGolden(filepath.Join(src, "reference", GoldenFileName(layer.Index)), plan.HiddenSize)
	if err != nil {
		t.Fatal(err)
	}
	// run is the reference on copies of the plan and layer that edit changed.
	run := func(edit func(p *family.Plan, l *family.Layer)) float64 {
		p, l := *plan, *layer
		l.Experts = append([]family.MLP(nil), layer.Experts...)
		edit(&p, &l)
		res, err := cpuref.ReferenceLayer(context.Background(), ck, &p, &l, g.X, g.T, cpuref.RefOptions{Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		return Compare(res.Y, g.Y).RelL2
	}
	if r := run(func(*family.Plan, *family.Layer) {}); r > 2e-6 {
		t.Fatalf("reference vs HF golden rel_l2 %.3g, want float32 rounding (< 2e-6)", r)
	}
	oai := plan.Act
	for _, c := range []struct {
		name string
		edit func(p *family.Plan, l *family.Layer)
	}{
		{"no clamp", func(p *family.Plan, _ *family.Layer) { p.Act.Limit = 0 }},
		{"no +1 on up", func(p *family.Plan, _ *family.Layer) { p.Act.UpOffset = 0 }},
		{"alpha 1 (plain silu)", func(p *family.Plan, _ *family.Layer) { p.Act.Alpha = 1 }},
		{"no expert biases", func(_ *family.Plan, l *family.Layer) {
			for i := range l.Experts {
				l.Experts[i].GateBias, l.Experts[i].UpBias, l.Experts[i].DownBias = "", "", ""
			}
		}},
		{"no router bias", func(_ *family.Plan, l *family.Layer) { l.RouterLogitBias = "" }},
	} {
		if r := run(c.edit); r < 1e-3 {
			t.Errorf("%s: rel_l2 vs HF %.3g; the fixture does not exercise it", c.name, r)
		} else {
			t.Logf("%s: rel_l2 vs HF %.3g", c.name, r)
		}
	}
	if plan.Act != oai {
		t.Fatal("an edit leaked into the plan")
	}
}

// planOf plans the checkpoint in dir.
func planOf(t *testing.T, dir string) *family.Plan {
	t.Helper()
	_, p := openPlanned(t, dir)
	return p
}

// openPlanned opens and plans the checkpoint in dir; it is closed when the test ends.
func openPlanned(t *testing.T, dir string) (*checkpoint.Checkpoint, *family.Plan) {
	t.Helper()
	ck, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	p, err := ck.Plan()
	if err != nil {
		t.Fatal(err)
	}
	return ck, p
}
