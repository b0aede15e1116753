package rankproof

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

// scaleSlotElement multiplies element 0 of slot j of BF16 tensor name in a
// rank's shard by 4 (one exponent bit of its high byte flipped: x4 or
// /4), a change no tolerance of the recomposition absorbs.
func scaleSlotElement(t *testing.T, path, name string, j int64) {
	t.Helper()
	h, err := testkit.ReadSTHeader(path)
	if err != nil {
		t.Fatal(err)
	}
	e, ok := h.Tensors[name]
	if !ok || e.DType != string(safetensors.BF16) {
		t.Fatalf("%s: %s missing or not BF16", path, name)
	}
	off := h.DataStart + e.DataOffsets[0] + j*(e.DataOffsets[1]-e.DataOffsets[0])/e.Shape[0]
	if raw := testkit.ReadFile(t, path); raw[off]|raw[off+1] == 0 {
		t.Fatalf("%s slot %d element 0 is zero: the mutation would change nothing", name, j)
	}
	testkit.FlipBits(t, path, off+1, 0x01) // little-endian: the high byte holds sign and exponent
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

// Under --moe-tp the gate and up biases are cut with their rows and the
// down bias lives on MoE-TP part 0 alone (zeros on the other parts): the
// parts recompose to SRC's experts, biases added once. A down bias put on
// part 1 (it would be added twice), or a changed gate bias row of part 1,
// fails the byte proof naming the rank and slot, and the recomposition of
// that layer.
func TestRecomposedBiasesMoETP(t *testing.T) {
	src := filepath.Join(hfDir, "gpt-oss")
	for _, tc := range []struct {
		name   string
		layout layout.Layout
		stack  string // in layer 1
		bits   uint16 // written into element 0 of rank 1's slot 1
	}{
		{"down bias on part 1", layout.Stacked, "all_down.bias", 0x3f80},           // 1.0 where zeros belong
		{"gate bias row of part 1", layout.Stacked, "all_gate.bias", 0x4120},       // 10.0
		{"gate-up bias row of part 1", layout.GateUp, "gate_up_proj_bias", 0xc120}, // -10.0
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := convertTo(t, convert.Options{Src: src, EP: 2, MoETP: 2, Layout: tc.layout})
			ctx := context.Background()
			before, err := CheckRecomposed(ctx, src, dst, Options{Tokens: 16, Seed: 7})
			if err != nil {
				t.Fatal(err)
			}
			for _, lc := range before {
				if !lc.Pass || lc.RelL2 > tolSum {
					t.Fatalf("before the mutation: %+v", lc)
				}
			}
			if res, err := Check(ctx, src, dst, -1); err != nil || res.Failure != "" {
				t.Fatalf("before the mutation: %v %+v", err, res)
			}
			// rank 1 is EP group 0's MoE-TP part 1: slot 1 is expert 1
			shard := layout.RankDir(1, 4) + "/model-00001-of-00001.safetensors"
			setSlotElement(t, filepath.Join(dst, shard), "model.layers.1.mlp.experts."+tc.stack, 1, tc.bits)
			rehash(t, dst, shard)
			res, err := Check(ctx, src, dst, 1)
			if err != nil {
				t.Fatal(err)
			}
			want := "rank 1: layer 1: slot 1 (physical slot 1, expert 1): model.layers.1.mlp.experts." + tc.stack + " differs from SRC's expert at byte "
			if !strings.HasPrefix(res.Failure, want) {
				t.Errorf("byte proof: %q\nwant %q...", res.Failure, want)
			}
			after, err := CheckRecomposed(ctx, src, dst, Options{Tokens: 16, Seed: 7})
			if err != nil {
				t.Fatal(err)
			}
			for _, lc := range after {
				if lc.Pass == (lc.Layer == 1) {
					t.Errorf("layer %d: pass %v (rel L2 %.3g) after changing layer 1", lc.Layer, lc.Pass, lc.RelL2)
				}
			}
		})
	}
}
