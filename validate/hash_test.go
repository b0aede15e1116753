package validate

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/moelayer"
)

// hashEveryLayer is a DeepSeek-V4 checkpoint whose every MoE layer is
// hash_moe (mlp_layer_types [hash_moe, hash_moe, hash_moe]), 12 experts,
// top-3: the shape of issue 30's false failure.
var hashEveryLayer = fixtures.SynthSpec{Family: "deepseek_v4", Layers: 3, HashLayers: 3, Hidden: 64, Intermediate: 32,
	Experts: 12, TopK: 3, Vocab: 96, Seed: 3005}

// hashTables are token-to-experts tables [vocab, k] a checkpoint may hold:
// each sets expert ids row by row (nil: synth's, k distinct experts).
var hashTables = []struct {
	name string
	row  func(tok, slot, e int) int64
}{
	{"distinct", nil},
	// transformers 5.17 registers tid2eid as zeros and never fills it: a
	// model it writes without training names expert 0 in every slot.
	{"zeros, as transformers initialises it", func(int, int, int) int64 { return 0 }},
	{"repeats", func(tok, slot, e int) int64 { return int64((tok + slot/2) % e) }},
}

// setHashTables rewrites every hash table of dir's layers with row.
func setHashTables(t *testing.T, dir string, layers int, row func(tok, slot, e int) int64) {
	t.Helper()
	for l := range layers {
		rewriteTensor(t, dir, fmt.Sprintf("model.layers.%d.ffn.gate.tid2eid", l), func(raw []byte, shape []int64) {
			for tok := range int(shape[0]) {
				for s := range int(shape[1]) {
					binary.LittleEndian.PutUint64(raw[8*(tok*int(shape[1])+s):], uint64(row(tok, s, hashEveryLayer.Experts)))
				}
			}
		})
	}
}

// TestHashRoutedEveryLayer: on a checkpoint whose every MoE layer routes
// by token id, every conversion passes validate against SRC and against
// goldens that hold the table's ids (HF's capture of a hash layer), with
// tables that name an expert more than once per token; both paths take
// their ids from the table, so the ids are compared as taken, not
// tie-robustly as a top-k. A DST table that differs from SRC's fails.
func TestHashRoutedEveryLayer(t *testing.T) {
	runs := []convert.Options{{}, {Layout: layout.GateUp}, {FuseShared: true, TP: 2}, {Layout: layout.UpGate, FuseShared: true, TP: 1, FoldScaling: "down"}}
	for _, tab := range hashTables {
		t.Run(tab.name, func(t *testing.T) {
			src := synthFrom(t, map[string]fixtures.SynthSpec{"v4": hashEveryLayer}, "v4")
			if tab.row != nil {
				setHashTables(t, src, hashEveryLayer.Layers, tab.row)
			}
			golden := writeHashGoldens(t, src, 40)
			for _, o := range runs {
				rep, _ := convertedPasses(t, src, golden, o)
				checks := checksRun(rep)
				for _, r := range rep.Rows {
					if r.Check != judge.Coverage && r.TopK != 1 {
						t.Errorf("%+v: layer %d %s: topk %v, want 1", o, r.Layer, r.Check, r.TopK)
					}
				}
				for _, c := range []string{judge.FusedVsReference, judge.FusedVsGolden, judge.ReferenceVsGolden} {
					if checks[c] != hashEveryLayer.Layers {
						t.Errorf("%+v: %d %s rows, want one a layer: %v", o, checks[c], c, checks)
					}
				}
			}
			// DST's table of layer 1 names other experts than SRC's: the
			// fused path routes elsewhere, and says so.
			dst := convertInto(t, src, convert.Options{})
			rewriteTensor(t, dst, "model.layers.1.ffn.gate.tid2eid", func(raw []byte, _ []int64) {
				for i := 0; i < len(raw); i += 8 {
					binary.LittleEndian.PutUint64(raw[i:], (binary.LittleEndian.Uint64(raw[i:])+1)%uint64(hashEveryLayer.Experts))
				}
			})
			rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 11, Device: DeviceCPU, Bytes: BytesOff})
			if err != nil {
				t.Fatal(err)
			}
			var failed []string
			for _, r := range rep.Rows {
				if !r.Pass {
					failed = append(failed, fmt.Sprintf("%d %s: %s", r.Layer, r.Check, r.Reason))
				}
			}
			if len(failed) == 0 || !strings.Contains(strings.Join(failed, "\n"), "1 fused-vs-reference: ") ||
				!strings.Contains(strings.Join(failed, "\n"), "ids taken from the hash table") {
				t.Errorf("DST's layer 1 table changed: failures %q, want layer 1's routing", failed)
			}
		})
	}
}

// convertedPasses converts src with o and validates the output on the CPU
// against src (and golden, where not ""): every check must pass.
func convertedPasses(t *testing.T, src, golden string, o convert.Options) (*Report, string) {
	t.Helper()
	dst := convertInto(t, src, o)
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Golden: golden, Seed: 11, Device: DeviceCPU})
	if err != nil {
		t.Fatalf("%+v: %v", o, err)
	}
	mustPass(t, rep, fmt.Sprintf("%+v: validate failed on a correct conversion", o))
	return rep, dst
}

// writeHashGoldens writes, for each layer of src, a golden of t tokens as
// HF's export writes one for a hash layer (x, y, the table's topk_ids and
// their weights times rsf, input_ids), from moeprep's own reference: the
// goldens test how validate compares a hash layer's ids, not the math
// (TestDeepSeekV4DetailsMatter holds that to HF's goldens).
func writeHashGoldens(t *testing.T, src string, tokens int) string {
	t.Helper()
	dir := t.TempDir()
	ck, plan := cktest.OpenPlanned(t, src)
	for i := range plan.Layers {
		l := &plan.Layers[i]
		x := DrawX(5, l.Index, tokens, plan.HiddenSize)
		ids := moelayer.DrawTokens(5, l.Index, tokens, hashEveryLayer.Vocab)
		res, err := cpuref.ReferenceLayer(context.Background(), ck, plan, l, x, tokens, cpuref.RefOptions{Tokens: ids, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		w := make([]float32, len(res.Routing.Weights))
		for j, v := range res.Routing.Weights {
			w[j] = v * float32(plan.RoutedScalingFactor)
		}
		tok := make([]byte, 8*len(ids))
		for j, v := range ids {
			binary.LittleEndian.PutUint64(tok[8*j:], uint64(v))
		}
		topk := make([]byte, 4*len(res.Routing.IDs))
		for j, v := range res.Routing.IDs {
			binary.LittleEndian.PutUint32(topk[4*j:], uint32(v))
		}
		tk, k := int64(tokens), int64(res.Routing.K)
		h := int64(plan.HiddenSize)
		if _, err := safetensors.WriteFile(context.Background(), filepath.Join(dir, GoldenFileName(l.Index)), nil, []safetensors.Entry{
			memEntry("x", safetensors.F32, []int64{tk, h}, testkit.F32LE(x...)),
			memEntry("y", safetensors.F32, []int64{tk, h}, testkit.F32LE(res.Y...)),
			memEntry("topk_ids", safetensors.I32, []int64{tk, k}, topk),
			memEntry("topk_weights", safetensors.F32, []int64{tk, k}, testkit.F32LE(w...)),
			memEntry("input_ids", safetensors.I64, []int64{tk}, tok),
		}, nil); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
