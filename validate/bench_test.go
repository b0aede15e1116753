package validate

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
)

// BenchmarkDeepSeekV3Layer validates one full DeepSeek-V3-shaped MoE layer
// (256 experts, H 7168, I 2048, FP8 128x128 blocks, one shared expert) with
// 64 tokens: reference on the hub-layout SRC plus the fused path on its
// fuse-shared DST. It needs about 24 GB of disk, so it runs only when
// MOEPREP_BENCH_DIR names a directory to keep the checkpoints in (reused
// between runs):
//
//	MOEPREP_BENCH_DIR=/tmp/moebench go test ./validate -run - -bench DeepSeekV3Layer -benchtime 1x -v
func BenchmarkDeepSeekV3Layer(b *testing.B) {
	dir := os.Getenv("MOEPREP_BENCH_DIR")
	if dir == "" {
		b.Skip("set MOEPREP_BENCH_DIR to a directory with ~24 GB free")
	}
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if _, err := os.Stat(filepath.Join(src, "config.json")); err != nil {
		// The deepseek-v3-shaped preset's MoE layer, with one dense layer
		// made small: 256 x 3 x 14.7 MB experts, about 11.4 GB.
		s, err := fixtures.Preset("deepseek-v3-shaped")
		if err != nil {
			b.Fatal(err)
		}
		s.Layers, s.DenseLayers, s.DenseIntermediate, s.MTPLayers = 2, 1, 256, 0
		if s, err = s.Normalize(); err != nil {
			b.Fatal(err)
		}
		if err := fixtures.Synth(context.Background(), src, s, nil); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dst, "config.json")); err != nil {
		if _, err := convert.Convert(context.Background(), convert.Options{Src: src, Dst: dst, FuseShared: true, TP: 1, Force: true}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Layers: "1", Tokens: 64, Seed: 1,
			Progress: func(m string) { b.Log(m) }})
		if err != nil {
			b.Fatal(err)
		}
		if rep.Failed() {
			b.Fatal(rep.Err())
		}
		r := rep.Rows[0]
		b.Logf("layer %d: %d/%d experts, rel_l2 %.3g, topk %.4f, %.1fs", r.Layer, r.ExpertsUsed, r.Experts, r.RelL2, r.TopK, rep.Seconds)
	}
}
