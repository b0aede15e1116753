package rankproof

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
)

var hfDir = filepath.Join("..", "..", "fixtures", "hf")

// fp8I256 writes a DeepSeek-V3 FP8 checkpoint of hidden and intermediate
// size 256, two of FP8's 128-blocks each way (--moe-tp 2 cuts at a whole
// block), and returns its directory.
func fp8I256(t *testing.T) string {
	t.Helper()
	return cktest.WriteSpec(t, filepath.Join(t.TempDir(), "fp8-256"), fixtures.SynthSpec{Family: "deepseek_v3", Layers: 2, DenseLayers: 1, Hidden: 256, Intermediate: 256,
		Experts: 8, SharedExperts: 1, TopK: 2, NGroup: 1, TopKGroup: 1, RoutedScalingFactor: 2.5, DType: "fp8", Vocab: 64, Seed: 11})
}

func convertTo(t *testing.T, o convert.Options) string {
	t.Helper()
	o.Dst = filepath.Join(t.TempDir(), "out")
	if _, err := convert.Convert(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	return o.Dst
}

// Every per-rank output of the fixtures proves, whole and rank by rank;
// --rank reads only the shared files and its own.
func TestRankProofPasses(t *testing.T) {
	fp8 := fp8I256(t)
	for _, tc := range []struct {
		name string
		o    convert.Options
	}{
		{"deepseek-v3-bf16 ep4", convert.Options{Src: filepath.Join(hfDir, "deepseek-v3-bf16"), EP: 4}},
		{"deepseek-v3-bf16 fuse fold down gate-up ep2 moe-tp2 slots18", convert.Options{Src: filepath.Join(hfDir, "deepseek-v3-bf16"), EP: 2, MoETP: 2, Slots: 18, FuseShared: true, FoldScaling: "down", Layout: layout.GateUp}},
		{"deepseek-v3-fp8 fuse ep4 slots20", convert.Options{Src: filepath.Join(hfDir, "deepseek-v3-fp8"), EP: 4, Slots: 20, FuseShared: true}},
		{"fp8 I256 fuse ep2 moe-tp2 up-gate", convert.Options{Src: fp8, EP: 2, MoETP: 2, FuseShared: true, Layout: layout.UpGate}},
		{"deepseek-v3-nvfp4 ep2 moe-tp2", convert.Options{Src: filepath.Join(hfDir, "deepseek-v3-nvfp4"), EP: 2, MoETP: 2}},
		{"deepseek-v3-int4 ep8", convert.Options{Src: filepath.Join(hfDir, "deepseek-v3-int4"), EP: 8}},
		{"qwen3-moe ep2 moe-tp2 gate-up", convert.Options{Src: filepath.Join(hfDir, "qwen3-moe"), EP: 2, MoETP: 2, Layout: layout.GateUp}},
		{"mixtral ep4 slots12", convert.Options{Src: filepath.Join(hfDir, "mixtral"), EP: 4, Slots: 12}},
		{"gpt-oss-mxfp4 ep2", convert.Options{Src: filepath.Join(hfDir, "gpt-oss-mxfp4"), EP: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := convertTo(t, tc.o)
			res, err := Check(context.Background(), tc.o.Src, dst, -1)
			if err != nil {
				t.Fatal(err)
			}
			if res.Failure != "" {
				t.Fatal(res.Failure)
			}
			ranks := len(res.Ranks)
			if res.Slots == 0 || res.SharedCopies == 0 || ranks != tc.o.EP*max(tc.o.MoETP, 1) {
				t.Fatalf("proved %d slots, %d shared tensors, %d ranks", res.Slots, res.SharedCopies, ranks)
			}
			one, err := Check(context.Background(), tc.o.Src, dst, ranks-1)
			if err != nil || one.Failure != "" {
				t.Fatalf("--rank %d: %v %s", ranks-1, err, one.Failure)
			}
			own := layout.RankDir(ranks-1, ranks) + "/"
			for _, f := range one.Files {
				if strings.HasPrefix(f, "rank-") && !strings.HasPrefix(f, own) {
					t.Errorf("--rank %d read %s", ranks-1, f)
				}
			}
			// Each file is read once (the small ones hashed, the shards'
			// tensors compared), and nothing else.
			if lim := one.SharedBytes + one.RankBytes; one.DSTBytesRead > lim || one.DSTBytesRead < lim/2 {
				t.Errorf("--rank read %d bytes of DST; the shared files are %d, the rank's %d", one.DSTBytesRead, one.SharedBytes, one.RankBytes)
			}
			if one.RankBytes*int64(ranks) > res.RankBytes+int64(ranks)*4096 {
				t.Errorf("rank %d's files are %d bytes, all %d ranks' %d", ranks-1, one.RankBytes, ranks, res.RankBytes)
			}
		})
	}
}

// rehash rewrites rel's manifest entry to what the file now holds: a
// mutation the manifest does not catch, left to the byte proof.
func rehash(t *testing.T, dst, rel string) {
	t.Helper()
	m, err := layout.ReadManifest(dst)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := layout.HashFileLike(filepath.Join(dst, rel), m.Files[rel])
	if err != nil {
		t.Fatal(err)
	}
	m.Files[rel] = fi
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dst, layout.ManifestFileName), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// swapSlots exchanges slots a and b of tensor name in a rank's shard.
func swapSlots(t *testing.T, path, name string, a, b int64) {
	t.Helper()
	raw, ti, at := shardBytes(t, path, name, a)
	per := (ti.End - ti.Begin) / ti.Shape[0]
	bt := at + (b-a)*per
	x := append([]byte(nil), raw[at:at+per]...)
	copy(raw[at:], raw[bt:bt+per])
	copy(raw[bt:], x)
	writeShard(t, path, raw)
}

// Mutations fail naming the rank (and, where the manifest agrees with the
// damage, the slot).
func TestRankProofMutations(t *testing.T) {
	src := filepath.Join(hfDir, "deepseek-v3-bf16")
	shard := func(r int) string { return layout.RankDir(r, 4) + "/model-00001-of-00001.safetensors" }
	stack := "model.layers.2.mlp.experts.all_up.weight"
	for _, tc := range []struct {
		name   string
		o      convert.Options
		rank   int
		mutate func(t *testing.T, dst string)
		want   string
	}{
		{"corrupted replica", convert.Options{EP: 4, Slots: 20}, -1, func(t *testing.T, dst string) {
			raw, _ := os.ReadFile(filepath.Join(dst, shard(3)))
			raw[len(raw)-7] ^= 1
			os.WriteFile(filepath.Join(dst, shard(3)), raw, 0o644)
		}, "rank 3: layer 2: slot 4 (physical slot 19, expert 3): model.layers.2.mlp.experts.all_down.weight differs from SRC's expert"},
		{"corrupted replica, manifest rehashed", convert.Options{EP: 4, Slots: 20}, 3, func(t *testing.T, dst string) {
			raw, _ := os.ReadFile(filepath.Join(dst, shard(3)))
			raw[len(raw)-7] ^= 1
			os.WriteFile(filepath.Join(dst, shard(3)), raw, 0o644)
			rehash(t, dst, shard(3))
		}, "rank 3: layer 2: slot 4 (physical slot 19, expert 3): model.layers.2.mlp.experts.all_down.weight differs from SRC's expert"},
		{"slot holding the wrong expert", convert.Options{EP: 4}, 1, func(t *testing.T, dst string) {
			swapSlots(t, filepath.Join(dst, shard(1)), stack, 0, 2)
			rehash(t, dst, shard(1))
		}, "rank 1: layer 2: slot 0 (physical slot 4, expert 4): " + stack + " differs"},
		{"one rank's file swapped for another's", convert.Options{EP: 4}, 0, func(t *testing.T, dst string) {
			raw, _ := os.ReadFile(filepath.Join(dst, shard(1)))
			os.WriteFile(filepath.Join(dst, shard(0)), raw, 0o644)
			rehash(t, dst, shard(0))
		}, "rank 0: layer 1: slot 0 (physical slot 0, expert 0)"},
		{"rank file cut short", convert.Options{EP: 4}, 1, func(t *testing.T, dst string) {
			os.Truncate(filepath.Join(dst, shard(1)), 1000)
		}, "rank 1: " + shard(1) + ": 1000 bytes, its manifest entry says"},
		{"missing rank file", convert.Options{EP: 4}, -1, func(t *testing.T, dst string) {
			os.Remove(filepath.Join(dst, shard(2)))
		}, "rank 2: " + shard(2) + ": missing"},
		{"shared tensor changed", convert.Options{EP: 4}, 2, func(t *testing.T, dst string) {
			p := filepath.Join(dst, "model-00001-of-00001.safetensors")
			raw, _ := os.ReadFile(p)
			raw[len(raw)-3] ^= 1
			os.WriteFile(p, raw, 0o644)
			rehash(t, dst, "model-00001-of-00001.safetensors")
		}, "shared files: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			o.Src = src
			dst := convertTo(t, o)
			if res, err := Check(context.Background(), src, dst, tc.rank); err != nil || res.Failure != "" {
				t.Fatalf("before the mutation: %v %v", err, res)
			}
			tc.mutate(t, dst)
			res, err := Check(context.Background(), src, dst, tc.rank)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(res.Failure, tc.want) {
				t.Errorf("failure %q, want %q", res.Failure, tc.want)
			}
		})
	}
}
