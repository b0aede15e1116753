package main

import (
	"slices"
	"testing"
	"time"

	"github.com/moeprep/moeprep/bench"
	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
)

func TestBenchFlags(t *testing.T) {
	f := &benchFlags{tokens: "128,1", dtype: "fp8", path: "tall", iters: 7, budget: 2 * time.Second, blockSize: 64, noGraph: true}
	cfg, err := f.config()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Tokens, []int{128, 1}) || cfg.DType != bench.FP8 || cfg.Iters != 7 || cfg.Budget != 2*time.Second ||
		cfg.BlockSize != 64 || cfg.Graph || cfg.Shape != bench.DeepSeekV3() || cfg.Path != kernels.PathMMATall {
		t.Errorf("config %+v", cfg)
	}
	for _, bad := range []benchFlags{
		{tokens: "1", dtype: "bf16", path: "cutlass", iters: 1, budget: time.Second, blockSize: 16},
		{tokens: "1,x", dtype: "bf16", path: "auto", iters: 1, budget: time.Second, blockSize: 16},
		{tokens: "1", dtype: "fp16", path: "auto", iters: 1, budget: time.Second, blockSize: 16},
		{tokens: "1", dtype: "bf16", path: "auto", iters: 0, budget: time.Second, blockSize: 16},
		{tokens: "1", dtype: "bf16", path: "auto", iters: 1, budget: 0, blockSize: 16},
		{tokens: "1", dtype: "bf16", path: "auto", iters: 1, budget: time.Second, blockSize: 20},
		{tokens: "1", dtype: "fp8", path: "auto", iters: 1, budget: time.Second, blockSize: 16, precision: "fp4"},
		{tokens: "1", dtype: "bf16", dtypeSet: true, path: "auto", iters: 1, budget: time.Second, blockSize: 16, precision: "fp8"},
		{tokens: "1", dtype: "fp8", path: "tall", iters: 1, budget: time.Second, blockSize: 16, precision: "fp8"},
	} {
		if _, err := bad.config(); err == nil {
			t.Errorf("flags %+v accepted", bad)
		}
	}
}

// TestBenchPrecision: --precision fp8 is the w8a8 mode and implies fp8
// weights unless --dtype was given; the default keeps bf16 activations.
func TestBenchPrecision(t *testing.T) {
	f := &benchFlags{tokens: "1024,4096", dtype: "bf16", path: "auto", iters: 5, budget: time.Second, blockSize: 16, precision: "fp8"}
	cfg, err := f.config()
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.W8A8 || cfg.DType != bench.FP8 {
		t.Errorf("--precision fp8: W8A8 %v, dtype %s", cfg.W8A8, cfg.DType)
	}
	f.precision = "default"
	if cfg, err = f.config(); err != nil || cfg.W8A8 || cfg.DType != bench.BF16 {
		t.Errorf("--precision default: W8A8 %v, dtype %s, %v", cfg.W8A8, cfg.DType, err)
	}
}

func TestBenchUsageAndNoDriver(t *testing.T) {
	code, _, stderr := runCLI(t, "bench", "kernels", "--dtype", "int4")
	if code != 2 {
		t.Errorf("bad --dtype: exit %d", code)
	}
	assertCleanError(t, stderr, "--dtype")
	code, _, stderr = runCLI(t, "bench", "kernels", "extra")
	if code != 2 {
		t.Errorf("extra argument: exit %d", code)
	}
	assertCleanError(t, stderr, "no arguments")
	if cuda.Available() == nil {
		t.Skip("a CUDA device is present")
	}
	code, _, stderr = runCLI(t, "bench", "kernels", "--tokens", "1", "--quiet")
	if code != 2 {
		t.Errorf("no driver: exit %d", code)
	}
	assertCleanError(t, stderr, "bench kernels needs a GPU: ")
}
