package validate

import (
	"context"
	"encoding/binary"
	"github.com/moeprep/moeprep/layout"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// TestDeepSeekV4DetailsMatter: on the deepseek-v4 fixture (swiglu_limit
// 0.75 so the clamp binds, layers 0 and 1 hash-routed), the CPU reference matches
// HF's goldens on every layer, and only with each detail: the clamp,
// sqrt(softplus) scoring (sigmoid instead), the correction bias, the hash
// table (top-k routing instead) and the shared MLP's clamp each move the
// output far past float32 rounding.
func TestDeepSeekV4DetailsMatter(t *testing.T) {
	src, ck, plan := openFixture(t, "deepseek-v4")
	if len(plan.Layers) != 3 || plan.Layers[1].HashTable == "" || plan.Layers[1].RouterBias != "" || plan.Layers[2].HashTable != "" || plan.Layers[2].RouterBias == "" {
		t.Fatalf("plan: %+v", plan.Layers)
	}
	detailsMatter(t, goldenRun(t, src, ck, plan), []int{0, 1, 2}, []detail{
		{"no clamp", 2, func(p *family.Plan, _ *family.Layer) { p.Act.Limit = 0 }},
		{"no clamp (hash layer)", 0, func(p *family.Plan, _ *family.Layer) { p.Act.Limit = 0 }},
		{"sigmoid scores", 2, func(p *family.Plan, _ *family.Layer) { p.Scoring = moe.Sigmoid }},
		{"sigmoid scores (hash layer)", 0, func(p *family.Plan, _ *family.Layer) { p.Scoring = moe.Sigmoid }},
		{"no correction bias", 2, func(_ *family.Plan, l *family.Layer) { l.RouterBias = "" }},
		{"top-k instead of the hash table", 1, func(_ *family.Plan, l *family.Layer) { l.HashTable = "" }},
		{"no routed scaling factor", 2, func(p *family.Plan, _ *family.Layer) { p.RoutedScalingFactor = 1 }},
	})
}

// goldenRun returns the rel_l2 against HF's golden of the CPU reference of
// plan's layer i, on copies of the plan and layer that edit changed.
func goldenRun(t *testing.T, src string, ck tensorload.TensorSource, plan *family.Plan) func(i int, edit func(p *family.Plan, l *family.Layer)) float64 {
	return func(i int, edit func(p *family.Plan, l *family.Layer)) float64 {
		t.Helper()
		layer := &plan.Layers[i]
		g := goldenOf(t, src, plan, layer)
		if (g.InputIDs != nil) != (layer.HashTable != "") {
			t.Fatalf("layer %d: golden input_ids %v, hash table %q", i, g.InputIDs != nil, layer.HashTable)
		}
		p, l := *plan, *layer
		l.Experts = slices.Clone(layer.Experts) // edits of an expert stay in the copy
		edit(&p, &l)
		res, err := cpuref.ReferenceLayer(context.Background(), ck, &p, &l, g.X, g.T, cpuref.RefOptions{Tokens: g.InputIDs, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		return judge.Compare(res.Y, g.Y).RelL2
	}
}

// detail is one thing a family's math needs: removing it (edit) from
// layer i of the plan must move the output off HF's golden.
type detail struct {
	name  string
	layer int
	edit  func(p *family.Plan, l *family.Layer)
}

// openFixture opens and plans the HF fixture name (in src), to be closed
// when the test ends.
func openFixture(t *testing.T, name string) (src string, ck *checkpoint.Checkpoint, plan *family.Plan) {
	t.Helper()
	src = filepath.Join(hfFixtures, name)
	ck, plan = cktest.OpenPlanned(t, src)
	return src, ck, plan
}

// copyFixture is a copy of the HF fixture name in a temporary directory,
// to edit.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	testkit.CopyDir(t, filepath.Join(hfFixtures, name), dir)
	return dir
}

// goldenOf reads HF's golden of layer in the fixture src.
func goldenOf(t *testing.T, src string, plan *family.Plan, layer *family.Layer) *Golden {
	t.Helper()
	g, err := ReadGolden(filepath.Join(src, "reference", GoldenFileName(layer.Index)), plan.HiddenSize)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// detailsMatter checks that the reference (run) matches HF's golden to
// float32 rounding on each of layers (rel_l2 < 2e-6), and that each detail,
// taken out, moves it far past that (rel_l2 >= 1e-3).
func detailsMatter(t *testing.T, run func(int, func(*family.Plan, *family.Layer)) float64, layers []int, ds []detail) {
	t.Helper()
	for _, i := range layers {
		if r := run(i, func(*family.Plan, *family.Layer) {}); r > 2e-6 {
			t.Fatalf("layer %d: reference vs HF golden rel_l2 %.3g, want float32 rounding (< 2e-6)", i, r)
		}
	}
	for _, d := range ds {
		if r := run(d.layer, d.edit); r < 1e-3 {
			t.Errorf("%s (layer %d): rel_l2 vs HF %.3g; the fixture does not exercise it", d.name, d.layer, r)
		} else {
			t.Logf("%s (layer %d): rel_l2 vs HF %.3g", d.name, d.layer, r)
		}
	}
}

// TestErnieSharedBiasesMatter: ERNIE 4.5 with use_bias (the shared
// expert's gate, up and down biases) matches HF's golden only with the
// biases; fuse-shared refuses it, naming why.
func TestErnieSharedBiasesMatter(t *testing.T) {
	src, ck, plan := openFixture(t, "ernie4-5-moe-bias")
	if sh := plan.Layers[0].Shared; sh == nil || sh.Get(layout.ProjDown, layout.RoleBias) == "" {
		t.Fatalf("shared expert planned without biases: %+v", sh)
	}
	detailsMatter(t, goldenRun(t, src, ck, plan), []int{0}, []detail{
		{"no shared biases", 0, func(_ *family.Plan, l *family.Layer) {
			sh := *l.Shared
			for _, pj := range layout.MLPProjs {
				sh.Set(pj, layout.RoleBias, "")
			}
			l.Shared = &sh
		}},
	})
	if _, err := convert.Convert(context.Background(), convert.Options{Src: src, Dst: filepath.Join(t.TempDir(), "out"), FuseShared: true, TP: 1}); err == nil || !strings.Contains(err.Error(), "the shared expert has biases") {
		t.Errorf("fuse-shared on a biased shared expert: %v", err)
	}
}

// TestInklingDetailsMatter: on the inkling-text fixture (route_scale 2.5,
// global_scale 0.75 and 1.25 in its two MoE layers, two shared experts the
// router weights), the CPU reference and the fused twin match HF's goldens
// on both layers, and only with each detail: the router scale tensor,
// route_scale, the correction bias, the order of the shared experts (row
// E+s weights shared expert s) and the shared experts themselves each move
// the output far past float32 rounding. fuse-shared refuses, naming why.
func TestInklingDetailsMatter(t *testing.T) {
	src, ck, plan := openFixture(t, "inkling-text")
	if !plan.SharedRouted || len(plan.Layers) != 2 {
		t.Fatalf("plan: shared routed %v, %d layers", plan.SharedRouted, len(plan.Layers))
	}
	for _, l := range plan.Layers {
		if l.Shared != nil || len(l.SharedExperts) != 2 || l.RouterScale != l.Prefix+".gate.global_scale" ||
			l.SharedExperts[1].Weight(layout.ProjDown) != l.Prefix+".shared_experts.down_proj[1]" || l.RouterBias != l.Prefix+".gate.e_score_correction_bias" {
			t.Fatalf("layer %d planned as %+v", l.Index, l)
		}
	}
	detailsMatter(t, goldenRun(t, src, ck, plan), []int{0, 1}, []detail{
		{"no global_scale", 0, func(_ *family.Plan, l *family.Layer) { l.RouterScale = "" }},
		{"no global_scale", 1, func(_ *family.Plan, l *family.Layer) { l.RouterScale = "" }},
		{"no route_scale", 0, func(p *family.Plan, _ *family.Layer) { p.RoutedScalingFactor = 1 }},
		{"no correction bias", 1, func(_ *family.Plan, l *family.Layer) { l.RouterBias = "" }},
		{"shared experts in the other order", 0, func(_ *family.Plan, l *family.Layer) {
			l.SharedExperts = []family.MLP{l.SharedExperts[1], l.SharedExperts[0]}
		}},
		{"shared experts left out", 1, func(_ *family.Plan, l *family.Layer) { l.SharedExperts = nil }},
	})
	if _, err := convert.Convert(context.Background(), convert.Options{Src: src, Dst: filepath.Join(t.TempDir(), "out"), FuseShared: true, TP: 1}); err == nil || !strings.Contains(err.Error(), "weights each shared expert per token") {
		t.Errorf("fuse-shared on Inkling: %v", err)
	}
}

// TestInklingHubRowsMatter: on inkling-mm-model (Inkling's multimodal
// model as transformers 5.17 saves it, in the hub's layout), the CPU
// reference matches HF's goldens on both layers with each expert's gate
// the even rows of its w13 slice and its up the odd ones (transformers'
// Interleave(dim=1)), routed and shared experts alike, and not with the
// rows read the other way round or as halves (gate rows then up rows, the
// layout transformers holds in memory).
func TestInklingHubRowsMatter(t *testing.T) {
	src, ck, plan := openFixture(t, "inkling-mm-model")
	if plan.Wrapper == nil || plan.Wrapper.Layers != "model.llm.layers." || len(plan.Layers) != 2 || len(plan.Layers[0].SharedExperts) != 2 {
		t.Fatalf("plan: wrapper %+v, layers %+v", plan.Wrapper, plan.Layers)
	}
	inter := plan.MoEIntermediateSize
	swapped := func(ms []family.MLP) []family.MLP {
		out := slices.Clone(ms)
		for e := range out {
			g, u := out[e].Weight(layout.ProjGate), out[e].Weight(layout.ProjUp)
			out[e].Set(layout.ProjGate, layout.RoleWeight, u)
			out[e].Set(layout.ProjUp, layout.RoleWeight, g)
		}
		return out
	}
	halves := func(ms []family.MLP) []family.MLP {
		out := slices.Clone(ms)
		for e := range out {
			w13 := family.BaseName(out[e].Weight(layout.ProjGate))
			out[e].Set(layout.ProjGate, layout.RoleWeight, family.ViewName(w13, e, 0, inter))
			out[e].Set(layout.ProjUp, layout.RoleWeight, family.ViewName(w13, e, inter, 2*inter))
		}
		return out
	}
	detailsMatter(t, goldenRun(t, src, ck, plan), []int{0, 1}, []detail{
		{"routed gate and up from the odd and even rows", 0, func(_ *family.Plan, l *family.Layer) { l.Experts = swapped(l.Experts) }},
		{"routed gate and up as halves", 1, func(_ *family.Plan, l *family.Layer) { l.Experts = halves(l.Experts) }},
		{"shared gate and up from the odd and even rows", 1, func(_ *family.Plan, l *family.Layer) { l.SharedExperts = swapped(l.SharedExperts) }},
		{"shared gate and up as halves", 0, func(_ *family.Plan, l *family.Layer) { l.SharedExperts = halves(l.SharedExperts) }},
	})
}

// TestInklingConfigRefusals: configs Inkling's router cannot run as
// transformers does are refused in one line naming the key.
func TestInklingConfigRefusals(t *testing.T) {
	for _, c := range []struct {
		key  string
		val  any
		want string
	}{
		{"shared_expert_sink", false, "shared_expert_sink=false is not supported"},
		{"n_shared_experts", 0, "n_shared_experts=0"},
	} {
		dir := copyFixture(t, "inkling-text")
		testkit.EditJSON(t, filepath.Join(dir, "config.json"), func(m map[string]any) { m[c.key] = c.val })
		_, err := cktest.Open(t, dir).Plan()
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s=%v: %v", c.key, c.val, err)
		}
	}
}

// TestBadRoutingTensorsNameThemselves: a hash table entry outside the
// layer's experts and a zero router scale are errors naming the file and
// tensor, not a panic or an all-zero layer.
func TestBadRoutingTensorsNameThemselves(t *testing.T) {
	for _, c := range []struct {
		fixture, tensor string
		edit            func(raw []byte, shape []int64)
		want            string
	}{
		{"deepseek-v4", "model.layers.1.ffn.gate.tid2eid", func(raw []byte, shape []int64) {
			binary.LittleEndian.PutUint64(raw[8*int(shape[1]):], 8) // token 1's first expert: 8 of 8
		}, "is not an expert id (the layer has 8)"},
		{"inkling-text", "model.layers.2.mlp.gate.global_scale", func(raw []byte, _ []int64) { clear(raw) }, "want a finite, non-zero scalar"},
	} {
		dir := copyFixture(t, c.fixture)
		rewriteTensor(t, dir, c.tensor, c.edit)
		ck, plan := cktest.OpenPlanned(t, dir)
		var err error
		for i := range plan.Layers {
			l := &plan.Layers[i]
			x := DrawX(3, l.Index, 4, plan.HiddenSize)
			if _, err = cpuref.ReferenceLayer(context.Background(), ck, plan, l, x, 4, cpuref.RefOptions{Tokens: []int32{0, 1, 2, 3}, Workers: 1}); err != nil {
				break
			}
		}
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.tensor) || !strings.Contains(err.Error(), ".safetensors") {
			t.Errorf("%s: %v", c.tensor, err)
		}
	}
}
