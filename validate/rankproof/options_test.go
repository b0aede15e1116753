package rankproof

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	return cktest.WriteSpec(t, filepath.Join(t.TempDir(), "int4-64"), fixtures.SynthSpec{Family: "kimi_k2", Layers: 2, DenseLayers: 1, Hidden: 64, Intermediate: 64,
		Experts: 8, SharedExperts: 1, TopK: 2, NGroup: 1, TopKGroup: 1, RoutedScalingFactor: 2.827, DType: "int4-pack", GroupSize: 32, Vocab: 64, Seed: 12})
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
		// rsf folded into in-out stacks: FP8 scales (auto), bf16 weights (--fold-scaling down)
		{"deepseek-v3-fp8 fuse ep4 gate-up in-out folded", convert.Options{Src: hf("deepseek-v3-fp8"), EP: 4, FuseShared: true, Layout: layout.GateUp, Orientation: layout.InOut}},
		{"deepseek-v3-bf16 fuse ep2 slots18 in-out fold down", convert.Options{Src: hf("deepseek-v3-bf16"), EP: 2, Slots: 18, FuseShared: true, FoldScaling: "down", Orientation: layout.InOut}},
		{"int4 g32 fuse requantize ep2 moe-tp2", convert.Options{Src: int4, EP: 2, MoETP: 2, FuseShared: true, RequantizeShared: true}},
		{"int4 g32 fuse requantize ep4 gate-up", convert.Options{Src: int4, EP: 4, FuseShared: true, RequantizeShared: true, Layout: layout.GateUp}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dst, c := convertedContract(t, tc.o)
			switch { // the option is what the output records
			case tc.o.DType != "" && (c.Dequantized == nil || c.Dequantized.DType != string(tc.o.DType)):
				t.Fatalf("contract dequantized %+v", c.Dequantized)
			case tc.o.Orientation == layout.InOut && c.Oriented() != layout.InOut:
				t.Fatalf("contract orientation %q", c.Orientation)
			case tc.o.RequantizeShared && c.SharedRequantized == nil:
				t.Fatal("contract has no shared_requantized")
			case strings.Contains(tc.name, "folded") || strings.Contains(tc.name, "fold down"):
				if !c.RoutedScalingFactorFolded {
					t.Fatal("contract: routed_scaling_factor not folded")
				}
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
			lcs, err := CheckRecomposed(ctx, tc.o.Src, dst, Options{Tokens: 16, Seed: 7})
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

// flipAt flips one bit of byte at of tensor name's data in the shard rel
// of dst, and rehashes the shard's manifest entry, so only the proof of
// the bytes can catch it.
func flipAt(t *testing.T, dst, rel, name string, at int64) {
	t.Helper()
	p := filepath.Join(dst, filepath.FromSlash(rel))
	raw, ti, base := shardBytes(t, p, name, 0)
	if at >= ti.End-ti.Begin {
		t.Fatalf("%s: no byte %d of %s", rel, at, name)
	}
	raw[base+at] ^= 0x10
	writeShard(t, p, raw)
	rehash(t, dst, rel)
}

// A damaged slot of a --dtype, in-out or requantised per-rank output, or a
// damaged dequantised weight in its shared files, fails naming the rank,
// layer and slot (or the tensor).
func TestRankProofOptionMutations(t *testing.T) {
	int4 := int4Kimi(t)
	fp8 := filepath.Join(hfDir, "deepseek-v3-fp8")
	rankShard := func(r, n int) string { return layout.RankDir(r, n) + "/model-00001-of-00001.safetensors" }
	for _, tc := range []struct {
		name   string
		o      convert.Options
		rank   int // the rank damaged (and checked alone)
		mutate func(t *testing.T, dst string, c *layout.Contract) string
	}{
		{"dtype bf16: a dequantised value of a replica", convert.Options{Src: fp8, EP: 4, Slots: 20, DType: safetensors.BF16}, 3,
			func(t *testing.T, dst string, c *layout.Contract) string {
				li := c.Layers[0]
				down := c.Names(li).Get(layout.ProjDown, layout.RoleWeight)
				per := slotSize(t, dst, rankShard(3, 4), down)
				flipAt(t, dst, rankShard(3, 4), down, 4*per+5) // slot 4: physical slot 19, a replica
				e := c.ExpertParallel.PhysicalToLogical[0][19]
				return fmt.Sprintf("rank 3: layer %d: slot 4 (physical slot 19, expert %d): %s differs from SRC's expert at byte 5 of the slot", li.Index, e, down)
			}},
		{"dtype bf16: a dequantised attention weight in the shared files", convert.Options{Src: fp8, EP: 4, DType: safetensors.BF16}, 1,
			func(t *testing.T, dst string, c *layout.Contract) string {
				name := dequantisedShared(t, fp8, dst)
				flipAt(t, dst, "model-00001-of-00001.safetensors", name, 3)
				return "shared files: " + name + " differs from SRC's at byte 3"
			}},
		{"in-out: a slot holding the wrong expert", convert.Options{Src: fp8, EP: 4, Orientation: layout.InOut}, 1,
			func(t *testing.T, dst string, c *layout.Contract) string {
				li := c.Layers[0]
				gate := c.Names(li).Get(layout.ProjGate, layout.RoleWeight)
				swapSlots(t, filepath.Join(dst, rankShard(1, 4)), gate, 0, 1)
				rehash(t, dst, rankShard(1, 4))
				return fmt.Sprintf("rank 1: layer %d: slot 0 (physical slot 4, expert 4): %s differs from SRC's expert at byte 0 of the slot", li.Index, gate)
			}},
		{"in-out: a scale entry of an FP8 slot", convert.Options{Src: fp8, EP: 4, Orientation: layout.InOut}, 2,
			func(t *testing.T, dst string, c *layout.Contract) string {
				li := c.Layers[len(c.Layers)-1]
				sc := c.Names(li).Get(layout.ProjDown, layout.RoleScale)
				per := slotSize(t, dst, rankShard(2, 4), sc)
				flipAt(t, dst, rankShard(2, 4), sc, 3*per)
				return fmt.Sprintf("rank 2: layer %d: slot 3 (physical slot 11, expert 11): %s differs from SRC's expert at byte 0 of the slot", li.Index, sc)
			}},
		{"requantize-shared: a requantised shared slot", convert.Options{Src: int4, EP: 2, MoETP: 2, FuseShared: true, RequantizeShared: true}, 3,
			func(t *testing.T, dst string, c *layout.Contract) string {
				li := c.Layers[0]
				up := c.Names(li).Get(layout.ProjUp, layout.RoleScale)
				per := slotSize(t, dst, rankShard(3, 4), up)
				flipAt(t, dst, rankShard(3, 4), up, 4*per+1) // slot 4: the shared slice, after 4 routed
				return fmt.Sprintf("rank 3: layer %d: slot 4 (shared slice 0 of replica 1): %s differs from SRC's expert at byte 1 of the slot", li.Index, up)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dst, c := convertedContract(t, tc.o)
			want := tc.mutate(t, dst, c)
			for _, rank := range []int{-1, tc.rank} {
				res, err := Check(context.Background(), tc.o.Src, dst, rank)
				if err != nil {
					t.Fatal(err)
				}
				if res.Failure != want {
					t.Errorf("--rank %d: failure %q\nwant %q", rank, res.Failure, want)
				}
			}
		})
	}
}

// slotSize is the bytes a slot of stack name takes in the shard rel.
func slotSize(t *testing.T, dst, rel, name string) int64 {
	t.Helper()
	f, err := safetensors.Open(filepath.Join(dst, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	x, ok := f.Lookup(name)
	if !ok {
		t.Fatalf("%s: no %s", rel, name)
	}
	return (x.End - x.Begin) / x.Shape[0]
}

// dequantisedShared is a tensor of DST's shared files that SRC stores in
// another dtype: a weight --dtype dequantised.
func dequantisedShared(t *testing.T, src, dst string) string {
	t.Helper()
	s, err := safetensors.OpenSharded(src)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f, err := safetensors.Open(filepath.Join(dst, "model-00001-of-00001.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, x := range f.Tensors {
		if _, y, ok := s.Lookup(x.Name); ok && y.DType != x.DType {
			return x.Name
		}
	}
	t.Fatal("no dequantised tensor in the shared files")
	return ""
}

// convertedContract converts o and reads the output's contract.
func convertedContract(t *testing.T, o convert.Options) (string, *layout.Contract) {
	t.Helper()
	dst := convertTo(t, o)
	c, err := readContract(dst)
	if err != nil {
		t.Fatal(err)
	}
	return dst, c
}

// config.json is held as the whole-model byte proof holds it: a
// dequantised output that kept SRC's quantization_config fails, naming it.
func TestRankProofConfigOfDequantised(t *testing.T) {
	src := filepath.Join(hfDir, "deepseek-v3-fp8")
	dst, _ := convertedContract(t, convert.Options{Src: src, EP: 4, DType: safetensors.BF16})
	var srcDoc map[string]json.RawMessage
	sb, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(sb, &srcDoc); err != nil {
		t.Fatal(err)
	}
	db, err := os.ReadFile(filepath.Join(dst, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(db), `"quantization_config"`) || srcDoc["quantization_config"] == nil {
		t.Fatal("the dequantised output kept quantization_config, or SRC has none")
	}
	// put SRC's back as text, leaving every other value's spelling as it is
	b := []byte(`{"quantization_config": ` + string(srcDoc["quantization_config"]) + `,` + strings.TrimPrefix(strings.TrimSpace(string(db)), "{"))
	writeShard(t, filepath.Join(dst, "config.json"), b)
	rehash(t, dst, "config.json")
	res, err := Check(context.Background(), src, dst, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Failure, "config.json: config: ") || !strings.Contains(res.Failure, "quantization_config") {
		t.Errorf("failure %q, want config.json's quantization_config named", res.Failure)
	}
}

// shardBytes reads the shard at path whole and returns its bytes, tensor
// name's entry and the file offset of slot j of it.
func shardBytes(t *testing.T, path, name string, j int64) ([]byte, safetensors.TensorInfo, int64) {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ti, ok := f.Lookup(name)
	start := f.DataStart
	f.Close()
	if !ok || j >= ti.Shape[0] {
		t.Fatalf("%s: no slot %d of %s", path, j, name)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return raw, ti, start + ti.Begin + j*(ti.End-ti.Begin)/ti.Shape[0]
}

// bf16Slot is shardBytes of a BF16 tensor.
func bf16Slot(t *testing.T, path, name string, j int64) ([]byte, int64) {
	t.Helper()
	raw, ti, off := shardBytes(t, path, name, j)
	if ti.DType != safetensors.BF16 {
		t.Fatalf("%s: %s is %s, not BF16", path, name, ti.DType)
	}
	return raw, off
}

func writeShard(t *testing.T, path string, raw []byte) {
	t.Helper()
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// setSlotElement writes BF16 value bits into element 0 of slot j of
// tensor name in a rank's shard.
func setSlotElement(t *testing.T, path, name string, j int64, bits uint16) {
	t.Helper()
	raw, off := bf16Slot(t, path, name, j)
	raw[off], raw[off+1] = byte(bits), byte(bits>>8)
	writeShard(t, path, raw)
}
