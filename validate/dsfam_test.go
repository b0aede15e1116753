package validate

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/byteproof"
)

// Issue 30's DeepSeek-like families, from their synth presets: convert
// (stacked, gate-up in-out) and fuse-shared pass the CPU validate, and the
// tensors only these families carry (DeepSeek-V3.2's and GLM-5's DSA
// indexer, Laguna's bias beside its experts) are proven byte for byte: one
// flipped bit fails the byte proof naming the tensor.
func TestDSFamiliesValidate(t *testing.T) {
	cases := []struct {
		preset string
		shared int    // fused shared slots with --tp 2
		carry  string // a tensor the family carries, flipped in DST
	}{
		{"small-deepseek-v32", 2, "model.layers.1.self_attn.indexer.wq_b.weight"},
		{"small-glm-moe-dsa", 2, "model.layers.2.self_attn.indexer.weights_proj.weight"},
		{"small-mistral4", 2, "model.layers.1.self_attn.kv_b_proj.weight"},
		{"small-kimi-linear", 2, "model.layers.0.block_sparse_moe.down_proj.weight"},
		{"small-laguna", 4, "model.layers.1.mlp.experts.e_score_correction_bias"},
	}
	for _, tc := range cases {
		t.Run(tc.preset, func(t *testing.T) {
			spec := cktest.Preset(t, tc.preset)
			src := cktest.WriteSpec(t, filepath.Join(t.TempDir(), tc.preset), spec)
			runs := []convert.Options{{Layout: layout.Stacked}, {Layout: layout.GateUp, Orientation: layout.InOut},
				{FuseShared: true, TP: 2, Layout: layout.GateUp}}
			conversionsPass(t, src, DeviceCPU, runs, func(o convert.Options, c *layout.Contract) {
				want := 0
				if o.FuseShared {
					want = tc.shared
				}
				if c.NumFusedSharedExperts != want || c.NumExperts != spec.Experts {
					t.Errorf("%+v: contract %d experts, %d fused shared, want %d and %d", o, c.NumExperts, c.NumFusedSharedExperts, spec.Experts, want)
				}
			})
			dst := convertInto(t, src, convert.Options{})
			rewriteTensor(t, dst, tc.carry, func(raw []byte, _ []int64) { raw[len(raw)/2] ^= 0x04 })
			rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Bytes: BytesOnly})
			if err != nil {
				t.Fatal(err)
			}
			if exitcode.Code(rep.Err()) != exitcode.CheckFailed || rep.Bytes == nil || rep.Bytes.Mismatch == nil ||
				rep.Bytes.Mismatch.Kind != byteproof.MismatchBytes || rep.Bytes.Mismatch.Tensor != tc.carry {
				t.Fatalf("a flipped bit in %s: %v (%+v)", tc.carry, rep.Err(), rep.Bytes)
			}
		})
	}
}
