package validate

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/family"
)

// TestDeepSeekV4DetailsMatter: on the deepseek-v4 fixture (swiglu_limit
// 0.75 so the clamp binds, layers 0 and 1 hash-routed), the CPU reference matches
// HF's goldens on every layer, and only with each detail: the clamp,
// sqrt(softplus) scoring (sigmoid instead), the correction bias, the hash
// table (top-k routing instead) and the shared MLP's clamp each move the
// output far past float32 rounding.
func TestDeepSeekV4DetailsMatter(t *testing.T) {
	src := filepath.Join(hfFixtures, "deepseek-v4")
	ck, plan := openPlanned(t, src)
	if len(plan.Layers) != 3 || plan.Layers[1].HashTable == "" || plan.Layers[1].RouterBias != "" || plan.Layers[2].HashTable != "" || plan.Layers[2].RouterBias == "" {
		t.Fatalf("plan: %+v", plan.Layers)
	}
	// run is the reference of layer i on copies of the plan and layer that edit changed.
	run := func(i int, edit func(p *family.Plan, l *family.Layer)) float64 {
		layer := &plan.Layers[i]
		g, err := ReadGolden(filepath.Join(src, "reference", GoldenFileName(layer.Index)), plan.HiddenSize)
		if err != nil {
			t.Fatal(err)
		}
		if (g.InputIDs != nil) != (layer.HashTable != "") {
			t.Fatalf("layer %d: golden input_ids %v, hash table %q", i, g.InputIDs != nil, layer.HashTable)
		}
		p, l := *plan, *layer
		edit(&p, &l)
		res, err := ReferenceLayerCovered(context.Background(), ck, &p, &l, g.X, g.T, g.InputIDs, nil, 2)
		if err != nil {
			t.Fatal(err)
		}
		return Compare(res.Y, g.Y).RelL2
	}
	for i := range plan.Layers {
		if r := run(i, func(*family.Plan, *family.Layer) {}); r > 2e-6 {
			t.Fatalf("layer %d: reference vs HF golden rel_l2 %.3g, want float32 rounding (< 2e-6)", i, r)
		}
	}
	for _, c := range []struct {
		name  string
		layer int
		edit  func(p *family.Plan, l *family.Layer)
	}{
		{"no clamp", 2, func(p *family.Plan, _ *family.Layer) { p.Act.Limit = 0 }},
		{"no clamp (hash layer)", 0, func(p *family.Plan, _ *family.Layer) { p.Act.Limit = 0 }},
		{"sigmoid scores", 2, func(p *family.Plan, _ *family.Layer) { p.Scoring = family.Sigmoid }},
		{"sigmoid scores (hash layer)", 0, func(p *family.Plan, _ *family.Layer) { p.Scoring = family.Sigmoid }},
		{"no correction bias", 2, func(_ *family.Plan, l *family.Layer) { l.RouterBias = "" }},
		{"top-k instead of the hash table", 1, func(_ *family.Plan, l *family.Layer) { l.HashTable = "" }},
		{"no routed scaling factor", 2, func(p *family.Plan, _ *family.Layer) { p.RoutedScalingFactor = 1 }},
	} {
		if r := run(c.layer, c.edit); r < 1e-3 {
			t.Errorf("%s: rel_l2 vs HF %.3g; the fixture does not exercise it", c.name, r)
		} else {
			t.Logf("%s: rel_l2 vs HF %.3g", c.name, r)
		}
	}
}

// TestErnieSharedBiasesMatter: ERNIE 4.5 with use_bias (the shared
// expert's gate, up and down biases) matches HF's golden only with the
// biases; fuse-shared refuses it, naming why.
func TestErnieSharedBiasesMatter(t *testing.T) {
	src := filepath.Join(hfFixtures, "ernie4-5-moe-bias")
	ck, plan := openPlanned(t, src)
	layer := &plan.Layers[0]
	if layer.Shared == nil || layer.Shared.DownBias == "" {
		t.Fatalf("shared expert planned without biases: %+v", layer.Shared)
	}
	g, err := ReadGolden(filepath.Join(src, "reference", GoldenFileName(layer.Index)), plan.HiddenSize)
	if err != nil {
		t.Fatal(err)
	}
	run := func(l *family.Layer) float64 {
		res, err := ReferenceLayer(context.Background(), ck, plan, l, g.X, g.T, 2)
		if err != nil {
			t.Fatal(err)
		}
		return Compare(res.Y, g.Y).RelL2
	}
	if r := run(layer); r > 2e-6 {
		t.Fatalf("reference vs HF golden rel_l2 %.3g", r)
	}
	l := *layer
	sh := *layer.Shared
	sh.GateBias, sh.UpBias, sh.DownBias = "", "", ""
	l.Shared = &sh
	if r := run(&l); r < 1e-3 {
		t.Errorf("without the shared biases rel_l2 vs HF is only %.3g", r)
	} else {
		t.Logf("without the shared biases: rel_l2 vs HF %.3g", r)
	}
	if _, err := convert.Convert(context.Background(), convert.Options{Src: src, Dst: filepath.Join(t.TempDir(), "out"), FuseShared: true, TP: 1}); err == nil || !strings.Contains(err.Error(), "the shared expert has biases") {
		t.Errorf("fuse-shared on a biased shared expert: %v", err)
	}
}
