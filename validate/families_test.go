package validate

import (
	"context"
	"encoding/binary"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/fixtures/hf"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/moelayer"
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
		res := goldenRef(t, ck, &p, &l, g, cpuref.RefOptions{Tokens: g.InputIDs, Workers: 2})
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

// goldenRef is the CPU reference of layer of plan on the tokens of HF's
// golden g, failing t where it cannot be run.
func goldenRef(t *testing.T, ck tensorload.TensorSource, plan *family.Plan, layer *family.Layer, g *Golden, o cpuref.RefOptions) *moelayer.RefResult {
	t.Helper()
	ref, err := cpuref.ReferenceLayer(context.Background(), ck, plan, layer, g.X, g.T, o)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// cleanConversionPasses converts the HF fixture src with convert's defaults
// into dst and fails t unless validate passes it against src and its
// goldens.
func cleanConversionPasses(t *testing.T, src string) (dst string) {
	t.Helper()
	dst = convertInto(t, src, convert.Options{})
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Golden: src, Seed: 1})
	if err != nil || rep.Failed() {
		t.Fatalf("clean conversion: %v %v", err, rep.Err())
	}
	return dst
}

// doubleBF16 doubles the first n bf16 values of raw in place (exponent +
// 1), leaving zeros and subnormals (exponent 0) and the values it would
// make infinite as they are: a corrupted weight row that stays finite.
func doubleBF16(raw []byte, n int) {
	for j := range n {
		v := binary.LittleEndian.Uint16(raw[2*j:])
		if v&0x7f80 != 0 && v&0x7f80 != 0x7f00 {
			v += 0x80
		}
		binary.LittleEndian.PutUint16(raw[2*j:], v)
	}
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
	_, err := convert.Convert(context.Background(), convert.Options{Src: src, Dst: filepath.Join(t.TempDir(), "out"), FuseShared: true, TP: 1})
	testkit.ErrorContains(t, err, "the shared expert has biases", "fuse-shared on a biased shared expert")
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
	_, err := convert.Convert(context.Background(), convert.Options{Src: src, Dst: filepath.Join(t.TempDir(), "out"), FuseShared: true, TP: 1})
	testkit.ErrorContains(t, err, "weights each shared expert per token", "fuse-shared on Inkling")
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

// TestErnieVLGoldensNeedEveryPart: transformers' ERNIE-4.5-VL goldens are
// each token's own bank (by token_type_ids) plus the shared MLP. Each bank
// is planned as a layer of its own width, router and bias row; its
// reference matches HF on the golden's tokens of its type, and is far off
// on the other bank's tokens, so a golden read without the token types, or
// a bank given the other's router or bias row, could not pass.
func TestErnieVLGoldensNeedEveryPart(t *testing.T) {
	src, ck, plan := openFixture(t, "ernie4-5-vl-moe")
	if len(plan.Layers) != 4 || plan.NumExperts != 8 || plan.TopK != 2 || plan.MoEIntermediateSize != 32 {
		t.Fatalf("plan: %d layers, E %d, k %d, I %d", len(plan.Layers), plan.NumExperts, plan.TopK, plan.MoEIntermediateSize)
	}
	for i := range plan.Layers {
		layer := &plan.Layers[i]
		d := layer.Index
		wantBank, wantI := family.BankText, 32
		if i >= 2 {
			wantBank, wantI = family.BankVision, 16
		}
		if layer.Bank != wantBank || plan.IntermediateOf(*layer) != wantI || layer.Shared == nil || !strings.HasSuffix(layer.Prefix, "."+wantBank.String()+"_moe") {
			t.Fatalf("layer %d: bank %q I %d prefix %s shared %v", layer.Index, layer.Bank, plan.IntermediateOf(*layer), layer.Prefix, layer.Shared != nil)
		}
		g, err := ReadGolden(filepath.Join(src, "reference", GoldenFileName(d)), plan.HiddenSize)
		if err != nil {
			t.Fatal(err)
		}
		own, err := g.ForBank(layer.Bank, layer.Label())
		if err != nil {
			t.Fatal(err)
		}
		other := family.BankVision
		if layer.Bank == family.BankVision {
			other = family.BankText
		}
		theirs, err := g.ForBank(other, "")
		if err != nil {
			t.Fatal(err)
		}
		if own.T+theirs.T != g.T || own.T < 4 || theirs.T < 4 {
			t.Fatalf("layer %s: %d + %d of %d tokens", layer.Label(), own.T, theirs.T, g.T)
		}
		for _, c := range []struct {
			g      *Golden
			lo, hi float64
			what   string
		}{{own, 0, 1e-6, "its own tokens"}, {theirs, 0.05, 10, "the other bank's tokens"}} {
			ref := goldenRef(t, ck, plan, layer, c.g, cpuref.RefOptions{Workers: 2})
			r := judge.Compare(ref.Y, c.g.Y).RelL2
			t.Logf("layer %s: reference vs HF on %s (%d): %.3g", layer.Label(), c.what, c.g.T, r)
			if r < c.lo || r > c.hi {
				t.Errorf("layer %s on %s: rel_l2 %.3g, want in [%g, %g]", layer.Label(), c.what, r, c.lo, c.hi)
			}
		}
	}
}

// TestNemotronHGoldensNeedEveryPart: transformers' Nemotron-H goldens are
// the ungated relu2 experts plus the relu2 shared MLP. The CPU reference
// matches them, and with the shared MLP's share taken out it is far off.
// The activation itself is pinned at a few points (squared, the gate
// argument unread); that SwiGLU would be far from it on real weights is
// kernels' TestGroupedGEMMActivations (ten times the tolerance at least).
func TestNemotronHGoldensNeedEveryPart(t *testing.T) {
	src, ck, plan := openFixture(t, "nemotron-h")
	if !plan.Act.Ungated() || plan.NumExperts != 16 || plan.NumSharedExperts != 2 || plan.RoutedScalingFactor != 2.5 || plan.NGroup != 4 {
		t.Fatalf("plan: act %+v E %d S %d rsf %v groups %d", plan.Act, plan.NumExperts, plan.NumSharedExperts, plan.RoutedScalingFactor, plan.NGroup)
	}
	for i := range plan.Layers {
		layer := &plan.Layers[i]
		if len(layer.Experts) != 16 || !layer.Experts[3].Ungated() || layer.Shared == nil || !layer.Shared.Ungated() {
			t.Fatalf("layer %d: experts or shared MLP planned gated: %+v", layer.Index, layer.Experts[3])
		}
		g := goldenOf(t, src, plan, layer)
		ref := goldenRef(t, ck, plan, layer, g, cpuref.RefOptions{Workers: 2})
		d := judge.Compare(ref.Y, g.Y).RelL2
		noShared := *plan
		noShared.NumSharedExperts = 0
		nl := *layer
		nl.Shared = nil
		routed := goldenRef(t, ck, &noShared, &nl, g, cpuref.RefOptions{Workers: 2})
		ds := judge.Compare(routed.Y, g.Y).RelL2
		t.Logf("layer %d: reference vs HF %.3g; without the shared MLP %.3g", layer.Index, d, ds)
		if d > 1e-6 || ds < 0.05 {
			t.Errorf("layer %d: rel_l2 %.3g, %.3g without the shared MLP", layer.Index, d, ds)
		}
	}
	// relu2 against relu, one value: the activation is squared, not
	// gated (what HF's ReLUSquaredActivation computes, the GPU's mode 3)
	for _, c := range []struct{ u, want float64 }{{-2, 0}, {0, 0}, {0.5, 0.25}, {3, 9}, {math.Inf(-1), 0}} {
		if got := layout.ReLU2().Apply(123, c.u); got != c.want {
			t.Errorf("relu2(%g) = %g, want %g (the gate argument must be unread)", c.u, got, c.want)
		}
	}
}

// TestLongcatZeroExpertsInGoldens: transformers' LongCat-Flash goldens send
// a good share of slots to the zero-compute experts (ids E..E+Z-1), and the
// CPU reference, which returns the token's input for them, matches the
// goldens; with those slots' outputs dropped (as a bank-only engine would)
// it is far off.
func TestLongcatZeroExpertsInGoldens(t *testing.T) {
	src, ck, plan := openFixture(t, "longcat-flash")
	if plan.ZeroExperts != 4 || plan.NumExperts != 8 || plan.NormTopKProb || plan.RoutedScalingFactor != 2 {
		t.Fatalf("plan: E %d Z %d renorm %v rsf %v", plan.NumExperts, plan.ZeroExperts, plan.NormTopKProb, plan.RoutedScalingFactor)
	}
	for i := range plan.Layers {
		layer := &plan.Layers[i]
		g := goldenOf(t, src, plan, layer)
		zero := 0
		for _, id := range g.IDs {
			if int(id) >= plan.NumExperts {
				zero++
			}
		}
		ref := goldenRef(t, ck, plan, layer, g, cpuref.RefOptions{Workers: 2})
		d := judge.Compare(ref.Y, g.Y).RelL2
		// the zero-compute slots' share of the output: w * rsf * x per slot
		dropped := append([]float32(nil), ref.Y...)
		for s, id := range ref.Routing.IDs {
			if int(id) < plan.NumExperts {
				continue
			}
			tok, w := s/ref.Routing.K, ref.Routing.Weights[s]*float32(plan.RoutedScalingFactor)
			for j := range plan.HiddenSize {
				dropped[tok*plan.HiddenSize+j] -= w * g.X[tok*plan.HiddenSize+j]
			}
		}
		dd := judge.Compare(dropped, g.Y).RelL2
		t.Logf("layer %d: %d of %d golden slots on zero-compute experts; reference vs HF %.3g, without them %.3g", layer.Index, zero, len(g.IDs), d, dd)
		if zero < len(g.IDs)/10 || d > 1e-6 || dd < 0.05 {
			t.Errorf("layer %d: %d zero-compute slots, rel_l2 %.3g, %.3g without them", layer.Index, zero, d, dd)
		}
	}
}

// TestReferenceW8A8 runs the CPU reference in w8a8 numerics on the FP8
// DeepSeek-V3 fixture's MoE layers (routed and shared experts): it must
// move the output off the precise reference and HF's float32 golden by the
// 0.01..0.08 band two e4m3 roundings per expert give, with the routing
// unchanged (the router stays precise).
func TestReferenceW8A8(t *testing.T) {
	src, ck, plan := openFixture(t, "deepseek-v3-fp8")
	n := 0
	for i := range plan.Layers {
		layer := &plan.Layers[i]
		if len(layer.Experts) == 0 {
			continue
		}
		g := goldenOf(t, src, plan, layer)
		precise := goldenRef(t, ck, plan, layer, g, cpuref.RefOptions{Workers: 2})
		w8 := goldenRef(t, ck, plan, layer, g, cpuref.RefOptions{Workers: 2, W8A8: true})
		d, dg := judge.Compare(w8.Y, precise.Y).RelL2, judge.Compare(w8.Y, g.Y).RelL2
		t.Logf("layer %d: w8a8 reference vs precise %.3g, vs HF golden %.3g", layer.Index, d, dg)
		if !(d >= 0.005 && d <= judge.TolW8A8Golden.MaxRelL2) || !(dg <= judge.TolW8A8Golden.MaxRelL2) {
			t.Errorf("layer %d: w8a8 reference %.3g from the precise one, %.3g from the golden; want 0.005..%g", layer.Index, d, dg, judge.TolW8A8Golden.MaxRelL2)
		}
		if !slices.Equal(w8.Routing.IDs, precise.Routing.IDs) {
			t.Errorf("layer %d: w8a8 changed the routing", layer.Index)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no MoE layer in the fixture")
	}
}

// TestNemotronHTampered: one row of DST's all_up doubled fails the
// numbers (byte proof off) and the byte proof alone; a contract whose
// activation is gone (so it claims SwiGLU experts with an all_gate) is
// refused; gate-up layouts are refused by convert, naming the way out.
func TestNemotronHTampered(t *testing.T) {
	src := hfFixtures + "/nemotron-h"
	dst := cleanConversionPasses(t, src)
	bad := convertInto(t, src, convert.Options{})
	rewriteTensor(t, bad, "backbone.layers.3.mixer.experts.all_up.weight", func(raw []byte, _ []int64) {
		// expert 5, row 7 doubled: finite, and far beyond bf16 rounding
		doubleBF16(raw[2*(5*32*64+7*64):], 64)
	})
	for _, bytes := range []BytesMode{BytesOff, BytesOnly} {
		rep, err := Run(context.Background(), Options{Src: src, Dst: bad, Seed: 1, Bytes: bytes})
		if err == nil {
			err = rep.Err()
		}
		if err == nil || strings.Contains(err.Error(), "non-finite") {
			t.Fatalf("bytes %s: a changed all_up row: %v", bytes, err)
		}
		t.Logf("bytes %s: %v", bytes, firstLine(err.Error()))
	}
	editContract(t, dst, func(c map[string]any) { delete(c, "activation") })
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 1, Bytes: BytesOff})
	if err == nil {
		err = rep.Err()
	}
	if err == nil {
		t.Fatal("a contract without the ungated activation passed")
	}
	t.Logf("contract without activation: %v", firstLine(err.Error()))
	for _, lay := range []layout.Layout{layout.GateUp, layout.UpGate} {
		_, err := convert.Convert(context.Background(), convert.Options{Src: src, Dst: t.TempDir() + "/out", Layout: lay})
		if err == nil || !strings.Contains(err.Error(), "no gate rows") || strings.Contains(err.Error(), "\n") {
			t.Errorf("--layout %s: %v", lay, err)
		}
	}
}

// TestNemotronHHubConfig: the hub's configs (Nemotron 3 Nano) spell the
// blocks as hybrid_override_pattern and keep a num_hidden_layers of their
// own; the fixture with its config so written converts and validates
// against transformers' goldens as it does with layers_block_type. A
// pattern that calls the attention block a MoE block is refused naming
// the router it lacks.
func TestNemotronHHubConfig(t *testing.T) {
	hub := func(pattern string) string {
		src := copyFixture(t, "nemotron-h")
		testkit.EditJSON(t, filepath.Join(src, "config.json"), func(c map[string]any) {
			delete(c, "layers_block_type")
			c["hybrid_override_pattern"] = pattern
			c["num_hidden_layers"] = 52.0 // ignored, as transformers ignores it
			c["moe_latent_size"] = nil
		})
		return src
	}
	src := hub("ME*E-")
	dst := convertInto(t, src, convert.Options{FuseShared: true, TP: 2})
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Golden: src, Seed: 1})
	if err != nil || rep.Failed() {
		t.Fatalf("hub config: %v %v", err, rep.Err())
	}
	var layers []int
	for _, r := range rep.Rows {
		if r.Check == "fused-vs-golden" {
			layers = append(layers, r.Layer)
		}
	}
	if len(layers) != 2 || layers[0] != 1 || layers[1] != 3 {
		t.Errorf("golden rows on layers %v, want [1 3]", layers)
	}
	_, err = convert.Convert(context.Background(), convert.Options{Src: hub("MEEE-"), Dst: filepath.Join(t.TempDir(), "out")})
	if err == nil || !strings.Contains(err.Error(), "layer 2") || strings.Contains(err.Error(), "\n") {
		t.Errorf("a pattern that makes the attention block MoE: %v", err)
	}
	t.Logf("MEEE-: %v", err)
}

// TestLongcatContractAndBias: a DST whose contract loses zero_experts is
// refused naming it; one zero-compute row's correction bias changed in DST
// fails the numbers (the fused path ranks with DST's) and the byte proof.
func TestLongcatContractAndBias(t *testing.T) {
	src := hfFixtures + "/longcat-flash"
	dst := cleanConversionPasses(t, src)
	biasDst := convertInto(t, src, convert.Options{})
	rewriteTensor(t, biasDst, "model.layers.1.mlp.router.e_score_correction_bias", func(raw []byte, _ []int64) {
		raw[4*9+3] ^= 0x40 // row 9, a zero-compute expert's: a large bias, it wins every token's top-k
	})
	for _, bytes := range []BytesMode{BytesOff, BytesOnly} {
		rep, err := Run(context.Background(), Options{Src: src, Dst: biasDst, Seed: 1, Bytes: bytes})
		if err == nil {
			err = rep.Err()
		}
		if err == nil {
			t.Fatalf("bytes %s: a changed zero-compute bias passed", bytes)
		}
		t.Logf("bytes %s: %v", bytes, firstLine(err.Error()))
	}
	editContract(t, dst, func(c map[string]any) { delete(c, "zero_experts") })
	// with the byte proof on, the edited config.json fails the manifest
	// first and the session's reason becomes a note; off, it is the error
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 1, Bytes: BytesOff})
	if err == nil {
		err = rep.Err()
	}
	testkit.ErrorContains(t, err, "zero_experts", "contract without zero_experts")
}

// TestErnieVLBanks: both banks of every layer are checked against the
// goldens and reported by decoder layer and bank; --layers names decoder
// layers; fuse-shared is refused in one line; a golden without
// token_type_ids is text throughout; one row of the vision bank's
// all_down changed fails the numbers (byte proof off) and the byte proof
// alone.
func TestErnieVLBanks(t *testing.T) {
	src := hfFixtures + "/ernie4-5-vl-moe"
	dst := convertInto(t, src, convert.Options{})
	rep := runPass(t, Options{Src: src, Dst: dst, Golden: src, Seed: 1, Layers: "2"}, "clean conversion")
	got := map[string]int{}
	for _, r := range rep.Rows {
		if r.Check == judge.FusedVsGolden {
			got[r.label()] = r.Tokens
		}
	}
	if len(got) != 2 || got["2 text"] == 0 || got["2 vision"] == 0 || got["2 text"]+got["2 vision"] != 32 {
		t.Errorf("golden rows of --layers 2: %v, want 2 text and 2 vision, 32 tokens between them", got)
	}
	var js jsonBuf
	if err := rep.WriteJSON(&js); err != nil || !strings.Contains(js.String(), `"layer": 2,
      "bank": "vision"`) {
		t.Errorf("JSON rows do not name layer 2's vision bank: %v", err)
	}

	for spec, want := range map[string][]int{"sample:1": {1, 1 + 65536}, "sample:2": {1, 1 + 65536, 2, 2 + 65536},
		"2,1": {1, 1 + 65536, 2, 2 + 65536}, "2": {2, 2 + 65536}} {
		all := []int{1, 1 + 65536, 2, 2 + 65536}
		if got, _, err := selectLayers(spec, all); err != nil || !slices.Equal(got, want) {
			t.Errorf("--layers %s: %v %v, want %v (a decoder layer's banks together)", spec, got, err, want)
		}
	}

	_, err := convert.Convert(context.Background(), convert.Options{Src: src, Dst: t.TempDir() + "/fs", FuseShared: true, TP: 2})
	if err == nil || !strings.Contains(err.Error(), "both routed banks") || strings.Contains(err.Error(), "\n") {
		t.Errorf("fuse-shared: %v", err)
	}

	noTypes := t.TempDir()
	g, err := ReadGolden(filepath.Join(src, "reference", GoldenFileName(1)), 64)
	if err != nil {
		t.Fatal(err)
	}
	writeGolden(t, filepath.Join(noTypes, GoldenFileName(1)), map[string][]float32{"x": g.X, "y": g.Y}, map[string][]int64{"x": {int64(g.T), 64}, "y": {int64(g.T), 64}}, nil)
	// Without token_type_ids every token is text, as transformers takes
	// them: the vision tokens' y is not the text bank's, so the text
	// bank's golden rows fail (exit 1), and the vision bank, which no
	// token took, is checked against SRC alone, and reported so.
	rep, err = Run(context.Background(), Options{Src: src, Dst: dst, Golden: noTypes, Seed: 1, Layers: "1"})
	if err != nil {
		t.Fatalf("golden without token types: %v", err)
	}
	if err := rep.Err(); exitcode.Code(err) != exitcode.CheckFailed || !strings.Contains(err.Error(), "layer 1 text fused-vs-golden") ||
		strings.Contains(err.Error(), "vision") || !slices.Equal(rep.GoldenNotChecked, []int{1 + 65536}) {
		t.Errorf("golden of both banks' tokens without token types: %v; not checked against the golden %v", err, rep.GoldenNotChecked)
	}

	bad := convertInto(t, src, convert.Options{})
	rewriteTensor(t, bad, "model.layers.2.mlp.vision_moe.experts.all_down.weight", func(raw []byte, shape []int64) {
		if shape[0] != 8 || shape[1] != 64 || shape[2] != 16 {
			t.Fatalf("vision all_down %v, want [8 64 16]", shape)
		}
		doubleBF16(raw[2*(3*64*16+9*16):], 16) // expert 3, row 9 doubled
	})
	for _, bytes := range []BytesMode{BytesOff, BytesOnly} {
		rep, err := Run(context.Background(), Options{Src: src, Dst: bad, Seed: 1, Bytes: bytes})
		if err == nil {
			err = rep.Err()
		}
		if err == nil || (bytes == BytesOff && !strings.Contains(err.Error(), "layer 2 vision")) {
			t.Fatalf("bytes %s: a changed vision all_down row: %v", bytes, err)
		}
		t.Logf("bytes %s: %v", bytes, firstLine(err.Error()))
	}
}

// TestGemma4GoldensNeedEveryPart: the CPU reference of transformers'
// Gemma 4 checkpoints (bare, in the multimodal wrapper and DiffusionGemma's
// decoder) matches HF's
// goldens only with all of the layer's parts: the two inputs (the router's
// scale-free RMSNorm times router.scale times H^-1/2, the experts'
// pre_feedforward_layernorm_2), the per-expert scale and GeGLU. Each part
// dropped in turn moves it far off the goldens; so each part is one the
// goldens can check.
func TestGemma4GoldensNeedEveryPart(t *testing.T) {
	type edit struct {
		name string
		f    func(p *family.Plan, l *family.Layer)
	}
	edits := []edit{
		{"as planned", func(*family.Plan, *family.Layer) {}},
		{"experts read the residual", func(_ *family.Plan, l *family.Layer) { l.ExpertInputNorm, l.RouterInputScale = "", "" }},
		{"no per-expert scale", func(_ *family.Plan, l *family.Layer) { l.ExpertScale = "" }},
		{"SwiGLU", func(p *family.Plan, _ *family.Layer) { p.Act = layout.Activation{} }},
	}
	// Every fixture whose goldens measure the decoder layer's MoE block:
	// Gemma 4 bare, in its multimodal wrapper and DiffusionGemma's decoder.
	atLayer := hf.Names(func(f hf.Fixture) bool { return f.Golden == hf.DecoderLayer })
	if len(atLayer) < 3 {
		t.Fatalf("the fixtures index has %d fixtures with decoder-layer goldens, want at least Gemma 4's three: %v", len(atLayer), atLayer)
	}
	for _, fx := range atLayer {
		for _, e := range edits {
			t.Run(fx+"/"+e.name, func(t *testing.T) {
				src, ck, plan := openFixture(t, fx)
				if len(plan.Layers) != 3 || plan.InputNormEps != 1e-6 || plan.Act != layout.GeGLUTanh() {
					t.Fatalf("plan: %d layers, eps %g, activation %+v", len(plan.Layers), plan.InputNormEps, plan.Act)
				}
				worst, idsEqual := 0.0, true
				for i := range plan.Layers {
					p, l := *plan, plan.Layers[i]
					g := goldenOf(t, src, &p, &l)
					e.f(&p, &l)
					ref := goldenRef(t, ck, &p, &l, g, cpuref.RefOptions{Workers: 2})
					worst = max(worst, judge.Compare(ref.Y, g.Y).RelL2)
					idsEqual = idsEqual && slices.Equal(ref.Routing.IDs, g.IDs)
				}
				t.Logf("worst rel_l2 against HF %.3g, routing equal %v", worst, idsEqual)
				if e.name == "as planned" {
					// HF's float32 against a float64-accumulating reference
					// differ by rounding alone (3.4e-7 seen); 1e-6 leaves room
					// for that and none for a wrong part's 0.1 or more.
					if worst > 1e-6 || !idsEqual {
						t.Fatalf("as planned: rel_l2 %.3g, routing equal %v", worst, idsEqual)
					}
				} else if worst < 0.05 {
					t.Fatalf("%s: rel_l2 only %.3g: the goldens do not see this part", e.name, worst)
				}
			})
		}
	}
}

// TestGemma4TamperedInputs: DST carries Gemma 4's router scale, per-expert
// scale and experts' input norm byte for byte, and the fused path reads
// DST's own: one value of any of them doubled or halved fails the layer's numbers
// with the byte proof off, and the byte proof alone.
func TestGemma4TamperedInputs(t *testing.T) {
	src := filepath.Join(hfFixtures, "gemma4-text")
	for _, name := range []string{"model.layers.1.router.scale", "model.layers.1.router.per_expert_scale",
		"model.layers.1.pre_feedforward_layernorm_2.weight"} {
		t.Run(name, func(t *testing.T) {
			dst := convertInto(t, src, convert.Options{})
			rewriteTensor(t, dst, name, func(raw []byte, _ []int64) {
				raw[0] ^= 0x80 // bf16 element 0's lowest exponent bit: twice or half the value
			})
			for _, bytes := range []BytesMode{BytesOff, BytesOnly} {
				rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 1, Bytes: bytes})
				if err == nil {
					err = rep.Err()
				}
				if err == nil {
					t.Fatalf("bytes %s: a changed %s passed", bytes, name)
				}
				t.Logf("bytes %s: %v", bytes, firstLine(err.Error()))
			}
		})
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
