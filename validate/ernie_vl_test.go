package validate

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/judge"
)

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
			ref, err := cpuref.ReferenceLayer(context.Background(), ck, plan, layer, c.g.X, c.g.T, cpuref.RefOptions{Workers: 2})
			if err != nil {
				t.Fatal(err)
			}
			r := judge.Compare(ref.Y, c.g.Y).RelL2
			t.Logf("layer %s: reference vs HF on %s (%d): %.3g", layer.Label(), c.what, c.g.T, r)
			if r < c.lo || r > c.hi {
				t.Errorf("layer %s on %s: rel_l2 %.3g, want in [%g, %g]", layer.Label(), c.what, r, c.lo, c.hi)
			}
		}
	}
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
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Golden: src, Seed: 1, Layers: "2"})
	if err != nil {
		t.Fatal(err)
	}
	mustPass(t, rep, "clean conversion")
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

	_, err = convert.Convert(context.Background(), convert.Options{Src: src, Dst: t.TempDir() + "/fs", FuseShared: true, TP: 2})
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
		for j := range 16 { // expert 3, row 9 doubled (bf16 exponent + 1)
			o := 2 * (3*64*16 + 9*16 + j)
			v := uint16(raw[o]) | uint16(raw[o+1])<<8
			if v&0x7f80 != 0 && v&0x7f80 != 0x7f00 {
				v += 0x80
			}
			raw[o], raw[o+1] = byte(v), byte(v>>8)
		}
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
