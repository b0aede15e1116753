package rankproof

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

// int4Kimi writes a Kimi-K2 INT4 checkpoint (group 32) whose shared
// expert is BF16, what --requantize-shared quantises, and returns its
// directory.
func int4Kimi(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "int4-64")
	cktest.WriteSpec(t, dir, fixtures.SynthSpec{Family: "kimi_k2", Layers: 2, DenseLayers: 1, Hidden: 64, Intermediate: 64,
		Experts: 8, SharedExperts: 1, TopK: 2, NGroup: 1, TopKGroup: 1, RoutedScalingFactor: 2.827, DType: "int4-pack", GroupSize: 32, Vocab: 64, Seed: 12})
	return dir
}

// The per-rank outputs of the options that change the experts' bytes
// (--dtype, --orientation in-out, --requantize-shared) validate as the
// others do: every rank's slots against the whole-model byte proof's
// prediction for that option, whole and --rank, and every MoE layer
// recomposed from the ranks on the CPU through each replica choice.
func TestRankProofOptions(t *testing.T) {
	fp8 := fp8I256(t)
	int4 := int4Kimi(t)
	hf := func(d string) string { return filepath.Join(hfDir, d) }
	for _, tc := range []struct {
		name string
		o    convert.Options
	}{
		{"fp8 I256 ep2 moe-tp2 dtype bf16", convert.Options{Src: fp8, EP: 2, MoETP: 2, DType: safetensors.BF16}},
		{"fp8 I256 fuse ep2 moe-tp2 gate-up dtype f32", convert.Options{Src: fp8, EP: 2, MoETP: 2, FuseShared: true, Layout: layout.GateUp, DType: safetensors.F32}},
		{"deepseek-v3-fp8 fuse ep4 slots20 dtype bf16", convert.Options{Src: hf("deepseek-v3-fp8"), EP: 4, Slots: 20, FuseShared: true, DType: safetensors.BF16}},
		{"deepseek-v3-nvfp4 ep2 moe-tp2 dtype f16", convert.Options{Src: hf("deepseek-v3-nvfp4"), EP: 2, MoETP: 2, DType: safetensors.F16}},
		{"deepseek-v3-int4 ep4 dtype bf16", convert.Options{Src: hf("deepseek-v3-int4"), EP: 4, DType: safetensors.BF16}},
		{"gpt-oss-mxfp4 ep2 dtype bf16", convert.Options{Src: hf("gpt-oss-mxfp4"), EP: 2, DType: safetensors.BF16}},
		{"deepseek-v3-bf16 fuse ep4 gate-up in-out", convert.Options{Src: hf("deepseek-v3-bf16"), EP: 4, FuseShared: true, Layout: layout.GateUp, Orientation: layout.InOut}},
		{"deepseek-v3-fp8 ep4 slots20 in-out", convert.Options{Src: hf("deepseek-v3-fp8"), EP: 4, Slots: 20, Orientation: layout.InOut}},
		{"qwen3-moe ep4 up-gate in-out", convert.Options{Src: hf("qwen3-moe"), EP: 4, Layout: layout.UpGate, Orientation: layout.InOut}},
		{"gpt-oss ep2 in-out", convert.Options{Src: hf("gpt-oss"), EP: 2, Orientation: layout.InOut}},
		{"int4 g32 fuse requantize ep2 moe-tp2", convert.Options{Src: int4, EP: 2, MoETP: 2, FuseShared: true, RequantizeShared: true}},
		{"int4 g32 fuse requantize ep4 gate-up", convert.Options{Src: int4, EP: 4, FuseShared: true, RequantizeShared: true, Layout: layout.GateUp}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dst := convertTo(t, tc.o)
			c, err := readContract(dst)
			if err != nil {
				t.Fatal(err)
			}
			switch { // the option is what the output records
			case tc.o.DType != "" && (c.Dequantized == nil || c.Dequantized.DType != string(tc.o.DType)):
				t.Fatalf("contract dequantized %+v", c.Dequantized)
			case tc.o.Orientation == layout.InOut && c.Oriented() != layout.InOut:
				t.Fatalf("contract orientation %q", c.Orientation)
			case tc.o.RequantizeShared && c.SharedRequantized == nil:
				t.Fatal("contract has no shared_requantized")
			}
			ctx := context.Background()
			res, err := Check(ctx, tc.o.Src, dst, -1)
			if err != nil || res.Failure != "" {
				t.Fatalf("%v %+v", err, res)
			}
			ranks := tc.o.EP * max(tc.o.MoETP, 1)
			if len(res.Ranks) != ranks || res.Slots == 0 || res.SharedCopies == 0 {
				t.Fatalf("proved %d ranks, %d slots, %d shared tensors", len(res.Ranks), res.Slots, res.SharedCopies)
			}
			if one, err := Check(ctx, tc.o.Src, dst, ranks-1); err != nil || one.Failure != "" {
				t.Fatalf("--rank %d: %v %+v", ranks-1, err, one)
			}
			lcs, err := CheckRecomposed(ctx, tc.o.Src, dst, 16, 7)
			if err != nil {
				t.Fatal(err)
			}
			if len(lcs) == 0 {
				t.Fatal("no layer recomposed")
			}
			for _, lc := range lcs {
				if !lc.Pass {
					t.Errorf("layer %d replica %d: relative L2 %.3g over %g", lc.Layer, lc.Replica, lc.RelL2, lc.Tolerance)
				}
				t.Logf("layer %d replica %d: relative L2 %.3g (tolerance %g)", lc.Layer, lc.Replica, lc.RelL2, lc.Tolerance)
			}
		})
	}
}
