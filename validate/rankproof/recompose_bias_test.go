package rankproof

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

// scaleSlotElement multiplies element 0 of slot j of BF16 tensor name in a
// rank's shard by 4 (one exponent bit of its high byte flipped: x4 or
// /4), a change no tolerance of the recomposition absorbs.
func scaleSlotElement(t *testing.T, path, name string, j int64) {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ti, ok := f.Lookup(name)
	f.Close()
	if !ok || ti.DType != safetensors.BF16 {
		t.Fatalf("%s: %s missing or not BF16", path, name)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := int64(raw[0]) | int64(raw[1])<<8 | int64(raw[2])<<16 | int64(raw[3])<<24
	off := 8 + n + ti.Begin + j*(ti.End-ti.Begin)/ti.Shape[0]
	if raw[off]|raw[off+1] == 0 {
		t.Fatalf("%s slot %d element 0 is zero: the mutation would change nothing", name, j)
	}
	raw[off+1] ^= 0x01 // little-endian: the high byte holds sign and exponent
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// gpt-oss's experts carry gate, up and down biases: the recomposition
// reads each slot's biases from its rank (they agree with SRC's to the
// float32 sum), and a bias corrupted in one rank's slot fails the byte
// proof naming the rank and slot, and the recomposition of its layer
// through the replica that holds it.
func TestRecomposedExpertBiases(t *testing.T) {
	for _, dir := range []string{"gpt-oss", "gpt-oss-mxfp4"} {
		for _, tc := range []struct {
			name string
			o    convert.Options
		}{
			{"ep4", convert.Options{EP: 4}},
			{"ep4 slots12", convert.Options{EP: 4, Slots: 12}},
		} {
			for _, bias := range []string{"all_gate.bias", "all_up.bias", "all_down.bias"} {
				t.Run(dir+" "+tc.name+" "+bias, func(t *testing.T) {
					o := tc.o
					o.Src = filepath.Join(hfDir, dir)
					dst := convertTo(t, o)
					ctx := context.Background()
					before, err := CheckRecomposed(ctx, o.Src, dst, Options{Tokens: 16, Seed: 7})
					if err != nil {
						t.Fatal(err)
					}
					for _, lc := range before {
						if !lc.Pass || lc.RelL2 > tolSum {
							t.Fatalf("before the mutation: %+v", lc)
						}
					}
					// rank 2's local slot 1 of layer 1: physical slot
					// 2*S/4 + 1 (S/4 = 2 without --slots, 3 with 12)
					shard := layout.RankDir(2, 4) + "/model-00001-of-00001.safetensors"
					scaleSlotElement(t, filepath.Join(dst, shard), "model.layers.1.mlp.experts."+bias, 1)
					rehash(t, dst, shard) // past the manifest, to the byte proof
					res, err := Check(ctx, o.Src, dst, -1)
					if err != nil {
						t.Fatal(err)
					}
					per := 2
					if o.Slots > 0 {
						per = 3
					}
					want := "rank 2: layer 1: slot 1 (physical slot " + strconv.Itoa(2*per+1) + ", expert "
					if !strings.HasPrefix(res.Failure, want) || !strings.Contains(res.Failure, bias+" differs") {
						t.Errorf("byte proof: %q, want %q... %s differs", res.Failure, want, bias)
					}
					after, err := CheckRecomposed(ctx, o.Src, dst, Options{Tokens: 16, Seed: 7})
					if err != nil {
						t.Fatal(err)
					}
					failed := 0
					for _, lc := range after {
						if !lc.Pass {
							failed++
							if lc.Layer != 1 {
								t.Errorf("layer %d fails, only layer 1 was changed: %+v", lc.Layer, lc)
							}
						}
					}
					if failed == 0 {
						t.Errorf("recomposition passes every layer with a corrupted %s: %+v", bias, after)
					}
				})
			}
		}
	}
}
