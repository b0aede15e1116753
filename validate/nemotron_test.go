package validate

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
)

// TestNemotronHTampered: one row of DST's all_up doubled fails the
// numbers (byte proof off) and the byte proof alone; a contract whose
// activation is gone (so it claims SwiGLU experts with an all_gate) is
// refused; gate-up layouts are refused by convert, naming the way out.
func TestNemotronHTampered(t *testing.T) {
	src := hfFixtures + "/nemotron-h"
	dst := convertInto(t, src, convert.Options{})
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Golden: src, Seed: 1})
	if err != nil || rep.Failed() {
		t.Fatalf("clean conversion: %v %v", err, rep.Err())
	}
	bad := convertInto(t, src, convert.Options{})
	rewriteTensor(t, bad, "backbone.layers.3.mixer.experts.all_up.weight", func(raw []byte, _ []int64) {
		// expert 5, row 7 doubled (bf16 exponent + 1): finite, and far
		// beyond bf16 rounding
		for j := range 64 {
			o := 2 * (5*32*64 + 7*64 + j)
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
		if err == nil || strings.Contains(err.Error(), "non-finite") {
			t.Fatalf("bytes %s: a changed all_up row: %v", bytes, err)
		}
		t.Logf("bytes %s: %v", bytes, firstLine(err.Error()))
	}
	editContract(t, dst, func(c map[string]any) { delete(c, "activation") })
	rep, err = Run(context.Background(), Options{Src: src, Dst: dst, Seed: 1, Bytes: BytesOff})
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
