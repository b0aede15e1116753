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
	"github.com/moeprep/moeprep/validate/judge"
)

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

	for spec, want := range map[string][]int{"sample:1": {1, 1 + family.BankStride}, "sample:2": {1, 1 + family.BankStride, 2, 2 + family.BankStride},
		"2,1": {1, 1 + family.BankStride, 2, 2 + family.BankStride}, "2": {2, 2 + family.BankStride}} {
		all := []int{1, 1 + family.BankStride, 2, 2 + family.BankStride}
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
		strings.Contains(err.Error(), "vision") || !slices.Equal(rep.GoldenNotChecked, []int{1 + family.BankStride}) {
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
