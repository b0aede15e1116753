package validate

import (
	"math"
	"testing"
)

// The estimate says how long, for how many bytes, and what it assumed.
func TestEstimate(t *testing.T) {
	tests := []struct {
		name string
		r    runSize
		want string
	}{
		// Kimi-K2-shaped INT4, 96 experts, top-8, 128 tokens: the cores'
		// 1.40 s of work on two (0.70 s) under the 0.80 s read.
		{"CPU, INT4, read-bound", runSize{device: DeviceCPU, jobs: 2, layerBytes: 800_000_000, elemsPerByte: 2, tokensPerExpert: 128.0*8/96 + 2, bothSides: true},
			"validate: estimate: under a second for 800 MB (assumed 1.00 GB/s read, 30 GFLOP/s a core, 2 cores)"},
		// DeepSeek-V3 dims FP8, 16 experts: 0.81 + 3.96 s of work, on two.
		{"CPU, FP8, the products", runSize{device: DeviceCPU, jobs: 2, layerBytes: 1_800_000_000, elemsPerByte: 1, tokensPerExpert: 128.0*8/16 + 2, bothSides: true},
			"validate: estimate: about 2.4 s for 1.80 GB (assumed 1.00 GB/s read, 30 GFLOP/s a core, 2 cores)"},
		{"CPU, DST alone: every product its own", runSize{device: DeviceCPU, jobs: 2, layerBytes: 900_000_000, elemsPerByte: 1, tokensPerExpert: 66},
			"validate: estimate: about 2.2 s for 900 MB (assumed 1.00 GB/s read, 30 GFLOP/s a core, 2 cores)"},
		{"CPU, 4 cores, with the rest of DST", runSize{device: DeviceCPU, jobs: 4, layerBytes: 48_000_000_000, proofBytes: 2_000_000_000, elemsPerByte: 0.5, tokensPerExpert: 10, bothSides: true},
			"validate: estimate: about 50 s for 50.0 GB (assumed 1.00 GB/s read, 30 GFLOP/s a core, 4 cores)"},
		{"jobs unknown count as one core", runSize{device: DeviceCPU, layerBytes: 1_200_000_000, elemsPerByte: 2, tokensPerExpert: 12, bothSides: true},
			"validate: estimate: about 2.0 s for 1.20 GB (assumed 1.00 GB/s read, 30 GFLOP/s a core, 1 core)"},
		{"the byte proof alone", runSize{device: DeviceCPU, jobs: 2, proofBytes: 12_000_000_000, elemsPerByte: 0.5},
			"validate: estimate: about 12 s for 12.0 GB (byte proof at an assumed 1.00 GB/s)"},
		{"GPU", runSize{device: DeviceCUDA, jobs: 4, layerBytes: 1_380_000_000_000, elemsPerByte: 1, tokensPerExpert: 10, bothSides: true},
			"validate: estimate: about 11m30s for 1.38 TB (an assumed 2.00 GB/s on the GPU)"},
		{"a fixture", runSize{device: DeviceCPU, jobs: 2, layerBytes: 1_400_000, elemsPerByte: 0.5, tokensPerExpert: 34, bothSides: true},
			"validate: estimate: under a second for 1.40 MB (assumed 1.00 GB/s read, 30 GFLOP/s a core, 2 cores)"},
	}
	for _, tt := range tests {
		got := estimate(tt.r)
		if got != tt.want {
			t.Errorf("%s:\n got %q\nwant %q", tt.name, got, tt.want)
		}
		if len(got) > 100 {
			t.Errorf("%s: %d columns", tt.name, len(got))
		}
	}
}

// The model against the CPU seconds it was fitted on (warm, user+sys, the
// 2-core AVX2 development VM; BENCHMARKS.md, "The estimate"): each within
// 30%, so that a change to a rate that leaves a row far out fails here.
func TestEstimateFitsItsRows(t *testing.T) {
	rows := []struct {
		name                 string
		bytes                int64
		elemsPerByte, tokens float64
		measured             float64 // CPU-s
	}{
		{"Kimi-K2 INT4 96 experts", 801_000_000, 2, 128.0*8/96 + 2, 1.35},
		{"DeepSeek-V3 FP8 16 experts", 1_820_000_000, 1, 128.0*8/16 + 2, 4.45},
		{"gpt-oss MXFP4 128 experts", 3_420_000_000, 2, 128.0*4/128 + 2, 4.65},
		{"DeepSeek-V3 FP8 64 experts", 6_050_000_000, 1, 128.0*8/64 + 2, 7.0},
		{"Mixtral bf16 8 experts", 5_640_000_000, 0.5, 128.0*2/8 + 2, 4.3},
	}
	for _, r := range rows {
		elems := float64(r.bytes) * r.elemsPerByte
		work := elems*cpuSecsPerElem + elems/2*r.tokens*2/cpuFlops
		if ratio := work / r.measured; math.Abs(ratio-1) > 0.3 {
			t.Errorf("%s: the model says %.2f CPU-s, measured %.2f (%.2fx)", r.name, work, r.measured, ratio)
		}
	}
}
