package validate

import (
	"github.com/moeprep/moeprep/layout"
	"testing"

	"github.com/moeprep/moeprep/family"
)

// TestGPTOSSDetailsMatter: on the gpt-oss fixture (gate_up_proj scaled so
// that some gate and up values pass the clamp), the CPU reference matches
// HF's golden only with every detail of its experts and router: dropping the
// clamp, the +1 on up, alpha, the expert biases or the router bias each
// moves the output far past float32 rounding. So the golden comparisons
// that pass elsewhere really test these details.
func TestGPTOSSDetailsMatter(t *testing.T) {
	src, ck, plan := openFixture(t, "gpt-oss")
	oai := plan.Act
	detailsMatter(t, goldenRun(t, src, ck, plan), []int{1}, []detail{
		{"no clamp", 1, func(p *family.Plan, _ *family.Layer) { p.Act.Limit = 0 }},
		{"no +1 on up", 1, func(p *family.Plan, _ *family.Layer) { p.Act.UpOffset = 0 }},
		{"alpha 1 (plain silu)", 1, func(p *family.Plan, _ *family.Layer) { p.Act.Alpha = 1 }},
		{"no expert biases", 1, func(_ *family.Plan, l *family.Layer) {
			for i := range l.Experts {
				for _, pj := range layout.MLPProjs {
					l.Experts[i].Set(pj, layout.RoleBias, "")
				}
			}
		}},
		{"no router bias", 1, func(_ *family.Plan, l *family.Layer) { l.RouterLogitBias = "" }},
	})
	if plan.Act != oai || plan.Layers[1].Experts[0].Get(layout.ProjGate, layout.RoleBias) == "" {
		t.Fatal("an edit leaked into the plan")
	}
}
