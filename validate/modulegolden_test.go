package validate

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/fixtures/hf"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/validate/judge"
)

// Issue 44: goldens taken where a user takes them, a forward hook on the
// module transformers calls the MoE block
// (fixtures/hf/export_module_goldens.py, transformers 5.17), kept in each
// fixture's reference-module/ with metadata point "module-output".

// moduleGoldenDir is where a fixture keeps its goldens taken at the
// module, where they differ from its reference/ goldens.
const moduleGoldenDir = "reference-module"

// moduleGoldenLog is export_module_goldens.py's log (transformers 5.17):
// per fixture and layer, the module it hooked and max |y_module - y_sum|.
const moduleGoldenLog = "export-module-goldens-log.txt"

// moduleDiffs reads moduleGoldenLog: fixture -> layer -> max |y_module -
// y_golden|, and fixture -> layer -> the module's path and class.
func moduleDiffs(t *testing.T) (map[string]map[int]float64, map[string]map[int]string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(hfFixtures, moduleGoldenLog))
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`^  layer (\d+): module (\S+) \((\w+)\): max\|y_module - y_golden\| (\S+),`)
	diffs, mods := map[string]map[int]float64{}, map[string]map[int]string{}
	fx := ""
	for _, l := range strings.Split(string(b), "\n") {
		if name, ok := strings.CutPrefix(l, "== "); ok && !strings.Contains(name, ":") {
			fx = name
			diffs[fx], mods[fx] = map[int]float64{}, map[int]string{}
			continue
		}
		m := line.FindStringSubmatch(l)
		if m == nil || fx == "" {
			continue
		}
		layer, _ := strconv.Atoi(m[1])
		d, err := strconv.ParseFloat(m[4], 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", moduleGoldenLog, l, err)
		}
		diffs[fx][layer], mods[fx][layer] = d, m[2]+" "+m[3]
	}
	return diffs, mods
}

// TestModuleGoldensEveryFamily: goldens taken by a forward hook on the
// module transformers calls the MoE block pass on a correct conversion of
// every bf16 fixture (SRC's reference and DST's fused path both checked
// against each layer's golden). Where the module's output is the sum
// (export_module_goldens.py measured max |y_module - y_sum| = 0 with
// transformers 5.17, its log committed) the fixture's goldens restated as
// taken at the module are those goldens; where it is not (A.X-K1, Granite
// with a shared MLP) the module's own goldens are committed in
// reference-module/ and the same goldens restated as the sum fail: the
// point the file states is what makes them pass. The families whose
// module differs are exactly those whose plan says so.
func TestModuleGoldensEveryFamily(t *testing.T) {
	diffs, mods := moduleDiffs(t)
	families, unmeasured := map[string]bool{}, map[string]string{}
	for _, f := range hf.All() {
		if f.Quantized() {
			continue
		}
		if _, ok := diffs[f.Dir]; !ok {
			unmeasured[f.Family] = f.Dir // added after the export (a text model saved alone): its family's point is measured on another
			continue
		}
		families[f.Family] = true
		t.Run(f.Dir, func(t *testing.T) {
			layers := diffs[f.Dir]
			if len(layers) != len(f.MoELayers) {
				t.Fatalf("%s: %d layers measured for %d MoE layers", moduleGoldenLog, len(layers), len(f.MoELayers))
			}
			_, _, plan := openFixture(t, f.Dir)
			differs := false
			for _, l := range f.MoELayers {
				differs = differs || layers[l] != 0
				t.Logf("layer %d: %s, max |y_module - y_sum| %g", l, mods[f.Dir][l], layers[l])
			}
			want := plan.ModuleOutput == family.ModulePostNorm || plan.ModuleOutput == family.ModuleRouted && plan.NumSharedExperts > 0
			if differs != want {
				t.Fatalf("module output differs from the sum: %v; the plan says %s", differs, plan.ModuleOutput)
			}
			src := filepath.Join(hfFixtures, f.Dir)
			gdir := restatePoint(t, filepath.Join(src, "reference"), GoldenPointModule)
			if differs {
				gdir = filepath.Join(src, moduleGoldenDir)
			}
			for _, l := range f.MoELayers {
				g, err := ReadGolden(filepath.Join(gdir, GoldenFileName(l)), 0)
				if err != nil {
					t.Fatal(err)
				}
				if g.Point != GoldenPointModule {
					t.Fatalf("%s: point %q, want %q", g.Path, g.Point, GoldenPointModule)
				}
			}
			dst := convertInto(t, src, convert.Options{})
			rep := runPass(t, Options{Src: src, Dst: dst, Golden: gdir, Seed: 1}, "a correct conversion against goldens taken at the module")
			n := 0
			for _, r := range rep.Rows {
				if r.Check == judge.FusedVsGolden || r.Check == judge.ReferenceVsGolden {
					n++
				}
			}
			if n < 2*len(f.MoELayers) { // ERNIE-4.5-VL: 2 a bank
				t.Fatalf("%d golden rows, want 2 for each of %d MoE layers", n, len(f.MoELayers))
			}
			if !differs {
				return
			}
			rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Golden: restatePoint(t, gdir, GoldenPointSum), Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Failed() {
				t.Fatalf("%s's goldens taken at the module (%s) passed as the sum", f.Family, plan.ModuleOutput)
			}
		})
	}
	for fx := range diffs {
		if _, ok := hf.Lookup(fx); !ok {
			t.Errorf("%s measures %s, which has no row in the index", moduleGoldenLog, fx)
		}
	}
	for fam, dir := range unmeasured {
		if !families[fam] {
			t.Errorf("family %s (fixture %s): no fixture of it has goldens measured at the module", fam, dir)
		}
	}
	if len(families) < 40 {
		t.Errorf("only %d families checked", len(families))
	}
}

// TestModuleGoldenPostNormCarried: A.X-K1's goldens taken at the module are
// after the block's post norm, which validate takes from each checkpoint
// (carried byte for byte): DST's norm with one value doubled fails the
// fused path's golden row and leaves SRC's reference passing.
func TestModuleGoldenPostNormCarried(t *testing.T) {
	src := filepath.Join(hfFixtures, "axk1")
	gdir := filepath.Join(src, moduleGoldenDir)
	dst := convertInto(t, src, convert.Options{})
	rewriteTensor(t, dst, "model.layers.1.post_mlp_layernorm.weight", func(raw []byte, _ []int64) {
		raw[0] ^= 0x80 // bf16 element 0's lowest exponent bit: twice or half the value
	})
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Golden: gdir, Seed: 1, Layers: "1", Bytes: BytesOff})
	if err != nil {
		t.Fatal(err)
	}
	var fused, ref *LayerResult
	for i, r := range rep.Rows {
		switch r.Check {
		case judge.FusedVsGolden:
			fused = &rep.Rows[i]
		case judge.ReferenceVsGolden:
			ref = &rep.Rows[i]
		}
	}
	if fused == nil || ref == nil {
		t.Fatalf("rows: %+v", rep.Rows)
	}
	if fused.Pass || !ref.Pass {
		t.Fatalf("fused vs golden pass %v (%s), reference vs golden pass %v: want the fused row alone to fail", fused.Pass, fused.Reason, ref.Pass)
	}
	if !strings.Contains(fused.Reason, "post-norm") {
		t.Errorf("the failing row does not say what it compared: %s", fused.Reason)
	}
}

// TestModuleGoldenRoutedFusedShared: Granite's goldens taken at the module
// hold the routed part; a DST whose shared MLP fuse-shared put in the bank
// is checked against them with SRC's shared MLP taken out, and without SRC
// the run says why it cannot be.
func TestModuleGoldenRoutedFusedShared(t *testing.T) {
	src := filepath.Join(hfFixtures, "granitemoehybrid")
	gdir := filepath.Join(src, moduleGoldenDir)
	dst := convertInto(t, src, convert.Options{FuseShared: true, TP: 1})
	runPass(t, Options{Src: src, Dst: dst, Golden: gdir, Seed: 1}, "fuse-shared DST against goldens of the routed part")
	_, err := Run(context.Background(), Options{Dst: dst, Golden: gdir, Seed: 1})
	testkit.ErrorContains(t, err, "give SRC", "DST alone")
}

// TestGoldenPointStated: a golden's metadata point is read, and one the
// project does not know is refused naming the file and the two points.
func TestGoldenPointStated(t *testing.T) {
	src := filepath.Join(hfFixtures, "qwen3-moe", "reference")
	for _, c := range []struct{ point, want, err string }{
		{"", "", ""},
		{GoldenPointSum, GoldenPointSum, ""},
		{GoldenPointModule, GoldenPointModule, ""},
		{"decoder-layer-output", "", `metadata point "decoder-layer-output"`},
	} {
		dir := restatePoint(t, src, c.point)
		g, err := ReadGolden(filepath.Join(dir, GoldenFileName(1)), 64)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), GoldenFileName(1))):
			t.Errorf("point %q: %v, want an error naming the file and %s", c.point, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("point %q: %v", c.point, err)
		case c.err == "" && g.Point != c.want:
			t.Errorf("point %q: read %q", c.point, g.Point)
		}
	}
}

// restatePoint copies the goldens of dir into a temporary directory with
// their metadata's point set to point ("" removes it).
func restatePoint(t *testing.T, dir, point string) string {
	t.Helper()
	out := t.TempDir()
	files, err := filepath.Glob(filepath.Join(dir, "moe-layer-*.safetensors"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: no goldens (%v)", dir, err)
	}
	slices.Sort(files)
	for _, path := range files {
		meta, entries, _ := readShard(t, path)
		if meta == nil {
			meta = map[string]string{}
		}
		delete(meta, "point")
		if point != "" {
			meta["point"] = point
		}
		writeShard(t, filepath.Join(out, filepath.Base(path)), meta, entries)
	}
	return out
}
