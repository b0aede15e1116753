package validate

import (
	"fmt"
	"time"

	"github.com/moeprep/moeprep/internal/human"
)

// The rates a run's estimate assumes (issue 46), each measured, and where:
// an estimate printed before a run reads anything cannot know this
// machine's speed, so it says what it assumed, and the progress line's ETA,
// from the rate the run reaches, takes over once it starts.
const (
	// cpuLayerRatePerCore is the bytes of SRC and DST a second one core
	// gets through in the CPU layer checks, default --tokens: 2 × 2.42 GB
	// of a bf16 Qwen3-30B-A3B-shaped synth (2 MoE layers, 128 experts,
	// hidden 2048) and its gate-up conversion in 19.7 s on the 2-core
	// AMD EPYC (AVX2) development VM, shared with other work. FP8 checks
	// decode every weight first and run slower: see BENCHMARKS.md.
	cpuLayerRatePerCore = 120e6
	// proofRate is the DST bytes a second the byte proof alone compares
	// with SRC (validate --bytes, in file order, SHA-256 of every shard):
	// 2.42 GB in 11.4 s on the same VM.
	proofRate = 200e6
	// gpuRate is the bytes a second a GPU run reads and uploads: 22.95 GB
	// in 11.5 s per DeepSeek-V3 layer on an H100 host (BENCHMARKS.md).
	gpuRate = 2e9
)

// estimate is the line validate prints before a run: how long it should
// take for layerBytes read by the layer checks and proofBytes read by the
// byte proof alone, on device with jobs experts computed at once.
func estimate(device Device, jobs int, layerBytes, proofBytes int64) string {
	jobs = max(jobs, 1)
	var secs float64
	var basis string
	switch {
	case layerBytes == 0:
		secs = float64(proofBytes) / proofRate
		basis = fmt.Sprintf("byte proof at an assumed %s/s", human.Bytes(proofRate))
	case device == DeviceCUDA:
		secs = float64(layerBytes)/gpuRate + float64(proofBytes)/proofRate
		basis = fmt.Sprintf("an assumed %s/s on the GPU", human.Bytes(gpuRate))
	default:
		secs = float64(layerBytes)/(cpuLayerRatePerCore*float64(jobs)) + float64(proofBytes)/proofRate
		basis = fmt.Sprintf("an assumed %s/s a core on %s", human.Bytes(cpuLayerRatePerCore), human.Count(jobs, "core"))
	}
	about := "under a second"
	if d := time.Duration(secs * float64(time.Second)); d >= time.Second {
		about = "about " + human.Duration(d)
	}
	return fmt.Sprintf("validate: estimate: %s for %s (%s)", about, human.Bytes(layerBytes+proofBytes), basis)
}
